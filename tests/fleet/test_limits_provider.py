"""The provider a fleet's model turn asks through (`lousho.worker.limits.FleetProvider`), on a real Redis and the
real OpenAI SDK against the local fake OpenAI server: the rate limit's count, corrected by the answer's usage; a
streamed answer after a 429; a vendor's 429s waited out with backoff and jitter on a clock the test controls, and
given up after `rate_limited_wait_s` of that clock whatever their `Retry-After` says."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from lousho import Message
from lousho.errors import ProviderError
from lousho.fleet.limits import FleetLimits, RateLimit, rate_limit_key, rate_waiting_key
from lousho.providers.base import ModelRequest, ModelResponse
from lousho.stores.redis import RedisStore
from lousho.testing.fake_llm_servers import FakeLLMServer, rate_limited, reply
from lousho.worker import FleetSettings
from lousho.worker.limits import (
    RATE_LIMITED_CAP_S,
    RATE_LIMITED_STEP_S,
    FleetStreamingProvider,
    estimate_tokens,
    fleet_provider,
)
from lousho.worker.runtime import FleetRuntime
from tests.fixtures.clock import FakeClock

pytest.importorskip("openai")

from lousho.providers.openai import OpenAIProvider

MODEL = "gpt-limits-test"
REQUEST = ModelRequest(model=MODEL, messages=[Message.user("Say hello to the whole fleet, please.")], session_id="s1")


@pytest.fixture
def store(redis_client: redis.Redis, redis_prefix: str) -> RedisStore:
    return RedisStore(redis_client, prefix=redis_prefix)


def runtime_with(store: RedisStore, **limits: object) -> FleetRuntime:
    rate = RateLimit(requests_per_minute=100, tokens_per_minute=100_000)
    fleet_limits = FleetLimits(rate_limits={MODEL: rate}, **limits)  # type: ignore[arg-type]
    return FleetRuntime(store=store, settings=FleetSettings(), limits=fleet_limits)


def runtime_on(clock: FakeClock, store: RedisStore, **limits: object) -> FleetRuntime:
    """A runtime whose waits run on the test's clock, with no rate limit of the fleet's own: its waits are only
    those of the vendor's 429s."""
    fleet_limits = FleetLimits(**limits)  # type: ignore[arg-type]
    return FleetRuntime(store=store, settings=FleetSettings(), limits=fleet_limits, clock=clock)


async def ask(server: FakeLLMServer, runtime: FleetRuntime, stream: bool = False) -> list[str | ModelResponse]:
    """One turn through the fleet's provider over the real SDK (its connections closed on this loop)."""
    async with OpenAIProvider(MODEL, base_url=server.openai_base_url, api_key="test") as vendor:
        provider = fleet_provider(runtime, vendor, "s1")
        if not stream:
            return [await provider.generate(REQUEST)]
        assert isinstance(provider, FleetStreamingProvider)
        return [chunk async for chunk in provider.stream(REQUEST)]


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as fake:
        yield fake


def counted(store: RedisStore) -> dict[str, int]:
    raw = store.client.hgetall(rate_limit_key(store.keys, MODEL))
    return {k.decode(): int(v) for k, v in raw.items() if k in (b"req", b"tok")}  # type: ignore[union-attr]


def test_the_count_takes_the_estimate_and_keeps_the_answers_real_usage(
    store: RedisStore, server: FakeLLMServer
) -> None:
    server.add(reply("Hello, fleet.", usage=(40, 9)))
    [answer] = asyncio.run(ask(server, runtime_with(store)))
    assert isinstance(answer, ModelResponse) and answer.message.content == "Hello, fleet."
    assert estimate_tokens(REQUEST) != 49
    assert counted(store) == {"req": 1, "tok": 49}  # the estimate taken first, then corrected to 40 + 9


def test_a_stream_after_a_429_gives_its_deltas_and_one_answer(store: RedisStore, server: FakeLLMServer) -> None:
    server.add(rate_limited(0.05), reply("Hello there, fleet.", usage=(30, 5)))
    *deltas, final = asyncio.run(ask(server, runtime_with(store), stream=True))
    assert isinstance(final, ModelResponse) and final.message.content == "Hello there, fleet."
    assert "".join(str(d) for d in deltas) == "Hello there, fleet."
    assert [request.stream for request in server.requests] == [True, True]
    assert counted(store) == {"req": 2, "tok": 35}  # the 429's request counted, its tokens given back
    assert store.client.zcard(rate_waiting_key(store.keys, MODEL)) == 0


def fewest_s(attempt: int, retry_after_s: float = 0.0) -> float:
    """The shortest wait the fleet may make before retry `attempt` of a turn's 429s."""
    step_s = min(RATE_LIMITED_CAP_S, RATE_LIMITED_STEP_S * 2 ** (attempt - 1))
    return max(retry_after_s, step_s / 2)


def most_requests(wait_s: float, retry_after_s: float = 0.0) -> int:
    """The most requests a turn may make in `wait_s` of 429s: each wait at least `fewest_s`."""
    waited_s, waits = 0.0, 0
    while waited_s < wait_s:
        waits += 1
        waited_s += fewest_s(waits, retry_after_s)
    return waits + 1


def test_429s_past_rate_limited_wait_s_are_the_agents_retry_policys_again(
    store: RedisStore, server: FakeLLMServer
) -> None:
    server.add(*[rate_limited(2)] * 50)
    clock = FakeClock()
    with pytest.raises(ProviderError) as raised:
        asyncio.run(ask(server, runtime_on(clock, store, rate_limited_wait_s=20)))
    assert raised.value.status == 429 and raised.value.retryable
    assert sum(clock.slept) == pytest.approx(20)  # the clock's 20 s from the first 429, then given up
    assert len(server.requests) == len(clock.slept) + 1 <= most_requests(20, 2.0)
    assert all(wait >= min(fewest_s(n, 2.0), 20 - sum(clock.slept[: n - 1])) for n, wait in enumerate(clock.slept, 1))


BAD_RETRY_AFTER = {
    "zero": {"retry-after": "0"},
    "negative": {"retry-after": "-5"},
    "a-date-past": {"retry-after": "Thu, 01 Jan 2015 00:00:00 GMT"},
    "nan": {"retry-after": "nan"},
    "ms-zero": {"retry-after-ms": "0"},
    "none": {},
}


@pytest.mark.parametrize("headers", BAD_RETRY_AFTER.values(), ids=BAD_RETRY_AFTER.keys())
def test_a_429_whose_retry_after_cannot_be_kept_waits_the_backoff_and_gives_up_at_rate_limited_wait_s(
    store: RedisStore, server: FakeLLMServer, headers: dict[str, str]
) -> None:
    server.add(*[rate_limited(None, headers=headers)] * 100)
    clock = FakeClock()
    with pytest.raises(ProviderError) as raised:
        asyncio.run(ask(server, runtime_on(clock, store, rate_limited_wait_s=60)))
    assert raised.value.status == 429
    assert sum(clock.slept) == pytest.approx(60)
    assert len(server.requests) == len(clock.slept) + 1 <= most_requests(60)
    for n, wait in enumerate(clock.slept, 1):  # each wait the backoff's, but the last: what was left of the 60 s
        assert wait >= min(fewest_s(n), 60 - sum(clock.slept[: n - 1]))


def test_sessions_that_met_one_429_retry_at_times_spread_apart(store: RedisStore, server: FakeLLMServer) -> None:
    sessions = 60
    for _ in range(sessions):
        server.add(rate_limited(1), reply("Hello, fleet."))
    retried_at: list[float] = []
    for _ in range(sessions):  # each session met the 429 at time 0 of its own clock
        clock = FakeClock()
        [answer] = asyncio.run(ask(server, runtime_on(clock, store)))
        assert isinstance(answer, ModelResponse)
        retried_at.append(clock.now)
    assert len(server.requests) == 2 * sessions
    assert all(1.0 <= at <= 1.5 for at in retried_at)  # the Retry-After, and up to half that again
    assert max(retried_at) - min(retried_at) > 0.3
    per_50ms = [sum(1 for at in retried_at if 1.0 + k * 0.05 <= at < 1.0 + (k + 1) * 0.05) for k in range(10)]
    assert max(per_50ms) <= sessions / 3, per_50ms  # no burst of retries at one instant


def test_limits_that_cannot_be_kept_are_refused_where_they_are_written() -> None:
    from lousho.errors import ConfigurationError

    for bad in (
        lambda: RateLimit(requests_per_minute=0),
        lambda: RateLimit(tokens_per_minute=-5),
        lambda: RateLimit(requests_per_minute=10, window_s=0),
        lambda: FleetLimits(max_sessions_in_flight={"booker": 0}),
        lambda: FleetLimits(rate_limits={MODEL: 500}),  # type: ignore[dict-item]
        lambda: FleetLimits(slot_retry_s=0),
    ):
        with pytest.raises(ConfigurationError):
            bad()
