"""The provider a fleet's model turn asks through (`lousho.worker.limits.FleetProvider`, issue #29), on a real Redis
and the real OpenAI SDK against the local fake OpenAI server: the rate limit's count, corrected by the answer's
usage; a streamed answer after a 429; a run of 429s longer than `rate_limited_wait_s` given up."""

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
from lousho.worker.limits import FleetStreamingProvider, estimate_tokens, fleet_provider
from lousho.worker.runtime import FleetRuntime

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


def test_429s_past_rate_limited_wait_s_are_the_agents_retry_policys_again(
    store: RedisStore, server: FakeLLMServer
) -> None:
    server.add(*[rate_limited(0.2)] * 5)
    with pytest.raises(ProviderError) as raised:
        asyncio.run(ask(server, runtime_with(store, rate_limited_wait_s=0.3)))
    assert raised.value.status == 429 and raised.value.retryable
    assert len(server.requests) == 3  # waited 0.2 s, then the 0.1 s left, then gave up


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
