"""What a worker process keeps of sessions it served (issue #29): a fleet process serves thousands of sessions,
so what it holds must follow the sessions in flight, not every session it ever saw. On the driver
(`lousho.testing.fleet`): the real task bodies, Lua scripts and Redis."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from pydantic import BaseModel

from lousho import Agent, ToolContext, define_tool
from lousho.checkpoint import Checkpoint
from lousho.fleet import FleetSettings
from lousho.providers import ScriptedProvider, tool_calls
from lousho.providers.base import ModelRequest
from lousho.stores.redis import RedisStore
from lousho.stores.segments import Known, SessionCache
from lousho.testing.fleet import FleetDriver


class Echo(BaseModel):
    text: str


async def echo(args: Echo, ctx: ToolContext) -> str:
    return args.text


AGENT = Agent(
    name="echoer",
    model="scripted",
    tools=[define_tool(name="echo", description="Echoes", input=Echo, execute=echo)],
)


@contextmanager
def after_the_first_step(
    redis_url: str, redis_store: RedisStore, keep_s: float
) -> Iterator[tuple[FleetDriver, SessionCache]]:
    """A session's first step (a model turn asking for a tool) done by a driver's worker; its store's cache."""
    provider = ScriptedProvider([tool_calls(("c1", "echo", {"text": "hi"})), "done"], by_turn=True)
    settings = FleetSettings(lease_ttl_s=60.0, transcript_keep_s=keep_s)
    with FleetDriver(agents=[AGENT], redis_url=redis_url, store=redis_store, provider=provider,
                     settings=settings) as driver:  # fmt: skip
        cache = driver.worker("w1").lousho_runtime.store.checkpoints.reader.cache
        driver.client.enqueue("echoer", "go", session_id="s")
        [first] = driver.pending()
        driver.deliver(first)
        assert driver.client.status("s").status == "in-progress"
        yield driver, cache


@pytest.mark.parametrize("keep_s", [0.0, 600.0])
def test_a_worker_keeps_a_sessions_transcript_after_its_step_only_for_transcript_keep_s(
    redis_url: str, redis_store: RedisStore, keep_s: float
) -> None:
    """The session's next step runs on any process of the fleet: a transcript kept for it would sit in this one
    meanwhile, several sessions' for each step in flight (issue #29). Kept `transcript_keep_s`, for a next step
    that runs here soon."""
    with after_the_first_step(redis_url, redis_store, keep_s) as (driver, cache):
        kept = cache.get("s") is not None
        assert kept == (keep_s > 0)

        driver.run_until_idle()

        assert driver.client.status("s").status == "finished"
        assert cache.get("s") is None, "a stopped session's transcript is forgotten at once"


def test_a_transcript_set_aside_goes_after_its_time_unless_a_step_used_it_again() -> None:
    cache, known = SessionCache(), Known(version=1, writer="w", messages=())
    for session_id in ("idle", "used"):
        cache.put(session_id, known)
        cache.set_aside(session_id, keep_s=1.0, now=100.0)
    assert cache.get("used", now=100.5) is known  # its next step ran here: in use again
    assert cache.get("idle", now=101.5) is None
    assert cache.get("used", now=500.0) is known


def test_a_scripted_provider_without_recording_keeps_no_request(redis_url: str, redis_store: RedisStore) -> None:
    """Each request holds its transcript: a worker on a recording `ScriptedProvider` holds every one it was asked
    (the benchmarks' workers pass `record_calls=False`)."""
    provider = ScriptedProvider([tool_calls(("c1", "echo", {"text": "hi"})), "done"], by_turn=True, record_calls=False)
    with FleetDriver(agents=[AGENT], redis_url=redis_url, store=redis_store, provider=provider,
                     settings=FleetSettings(lease_ttl_s=60.0)) as driver:  # fmt: skip
        driver.client.enqueue("echoer", "go", session_id="s")
        driver.run_until_idle()

        assert driver.client.status("s").status == "finished"
    assert provider.answered == 2
    assert provider.calls == []


def test_a_first_turn_holds_no_accepted_record_while_it_asks_the_model(redis_url: str, redis_store: RedisStore) -> None:
    """A first turn's checkpoint is made from the record `Client.enqueue` wrote; while the step waits on the model
    it holds that checkpoint, not the record too (a first turn in flight held both)."""
    records_held: list[int] = []

    def answer(request: ModelRequest) -> str:  # the model is asked: what does the process hold now?
        records_held.append(sum(1 for held in gc.get_objects() if is_accepted_record(held, "s")))
        return "done"

    provider = ScriptedProvider([answer], by_turn=True)
    with FleetDriver(agents=[AGENT], redis_url=redis_url, store=redis_store, provider=provider,
                     settings=FleetSettings(lease_ttl_s=60.0)) as driver:  # fmt: skip
        driver.client.enqueue("echoer", "go", session_id="s")
        driver.run_until_idle()
        assert driver.client.status("s").status == "finished"
    assert records_held == [0]


def is_accepted_record(value: object, session_id: str) -> bool:
    return isinstance(value, Checkpoint) and value.session_id == session_id and bool(value.pending_input)
