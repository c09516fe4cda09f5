"""A finished session stays out of the in-flight index (found by the telemetry tests of issue #19): a zombie's
late heartbeat, after its lease was taken over, no longer pushes the session's deadline (it put a finished
session back in flight, and the reaper then requeued it every `requeue_backoff_s`, forever), and a requeue
that finds the session finished takes it out. On the driver (`lousho.testing.fleet`): real steps and Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from lousho import Agent, ToolContext, define_tool
from lousho.abort import AbortSignal
from lousho.fleet import FleetKeys, FleetSettings
from lousho.fleet.dispatch import send_advance
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.redis import RedisStore
from lousho.testing.fleet import FleetDriver
from lousho.worker.heartbeat import Beating, beat
from lousho.worker.leases import Lease


class Nothing(BaseModel):
    pass


async def noop(args: Nothing, ctx: ToolContext) -> str:
    return "ok"


@pytest.fixture
def driver(redis_url: str, redis_store: RedisStore) -> Iterator[FleetDriver]:
    agent = Agent(
        name="jobs", model="scripted", tools=[define_tool(name="noop", description="", input=Nothing, execute=noop)]
    )
    provider = ScriptedProvider([tool_calls(("c1", "noop", {})), "done"])
    with FleetDriver(
        agents=[agent], redis_url=redis_url, store=redis_store, provider=provider, settings=FleetSettings()
    ) as d:
        yield d


def finished_session(driver: FleetDriver) -> str:
    driver.client.enqueue("jobs", "go", session_id="s-done")
    driver.run_until_idle()
    assert driver.client.status("s-done").status == "finished"
    assert driver.store.client.zscore(driver.store.keys.inflight, "s-done") is None
    return "s-done"


def test_a_zombies_late_heartbeat_does_not_put_a_finished_session_back_in_flight(driver: FleetDriver) -> None:
    session = finished_session(driver)
    runtime = driver.worker("w1").lousho_runtime
    zombie = Lease(driver.store.client, FleetKeys(driver.store).lease(session), 60_000, held=True)  # taken over

    beat(runtime, [Beating(session, zombie, AbortSignal())])

    assert zombie.held is False
    assert driver.store.client.zscore(driver.store.keys.inflight, session) is None


def test_a_requeue_that_finds_its_session_finished_takes_it_out_of_the_in_flight_index(driver: FleetDriver) -> None:
    session = finished_session(driver)
    driver.store.client.zadd(driver.store.keys.inflight, {session: 1})  # as a zombie's touch left it, due at once

    send_advance(driver.client.app, session, "reaper", driver.queue)
    outcomes = [outcome for _, outcome in driver.run_until_idle()]

    assert outcomes == ["finished"]
    assert driver.store.client.zscore(driver.store.keys.inflight, session) is None
