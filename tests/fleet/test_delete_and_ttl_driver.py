"""A session's keys on the fleet (issue #16): `delete()` removes every one of them, the fleet's included
(results, dispatch marks, attempts, leases, abort flag, epoch, requeue mark, its entries in the fleet's
indexes), and `RedisStore(ttl_s=...)` covers every one of them at every step. On the driver
(`lousho.testing.fleet`): the real task bodies, Lua scripts and Redis."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import redis
from pydantic import BaseModel

from lousho import Agent, PropagatingToolError, ToolContext, define_tool
from lousho.fleet import FleetKeys, FleetSettings
from lousho.providers import ScriptedProvider, tool_calls
from lousho.providers.base import ModelRequest, ModelResponse
from lousho.stores.redis import RedisStore
from lousho.testing.fleet import FleetDriver

SETTINGS = FleetSettings(lease_ttl_s=60.0)
TTL_S = 600.0


class Work(BaseModel):
    n: int


class Jobs:
    """An agent whose `work` tool may run a test's hook while it runs (the call's lease held, its run listed)."""

    def __init__(self) -> None:
        self.during: dict[str, Callable[[], None]] = {}
        tool = define_tool(name="work", description="", input=Work, execute=self.work)
        self.agent = Agent(name="jobs", model="scripted", tools=[tool], tool_concurrency=2)

    async def work(self, args: Work, ctx: ToolContext) -> dict[str, int]:
        self.during.pop(ctx.tool_call_id, lambda: None)()
        return {"square": args.n * args.n}


class PerSession:
    """A model that answers each session from its own script, by the turns already in its transcript."""

    async def generate(self, request: ModelRequest) -> ModelResponse:
        session = request.session_id or ""
        turns = sum(m.role == "assistant" for m in request.messages)
        calls = tool_calls((f"{session}-a", "work", {"n": 2}), (f"{session}-b", "work", {"n": 3}))
        return await ScriptedProvider([calls if turns == 0 else "done"]).generate(request)


def keys_naming(client: redis.Redis, session_id: str) -> list[str]:
    """Every key in Redis whose name holds the session id (SCAN, the whole keyspace)."""
    pattern = "*" + re.sub(r"([*?\[\]\\])", r"\\\1", session_id) + "*"
    return sorted(k.decode() for k in cast(Iterator[bytes], client.scan_iter(match=pattern, count=1000)))


def pttl(store: RedisStore, key: str) -> int:
    return int(cast(int, store.client.pttl(key)))


def index_entries(store: RedisStore, session_id: str) -> dict[str, Any]:
    """The session's entries in the fleet's shared indexes (in-flight, running, parked)."""
    client, keys = store.client, FleetKeys(store)
    entries = [e.decode() for e in cast(list[bytes], client.zrange(keys.running, 0, -1))]
    running = [entry for entry in entries if f"|{session_id}|" in entry]
    return {
        "inflight": client.zscore(store.keys.inflight, session_id),
        "running": running,
        "parked": client.hexists(keys.parked, session_id),
    }


NO_ENTRIES: dict[str, Any] = {"inflight": None, "running": [], "parked": False}


@pytest.fixture
def jobs() -> Jobs:
    return Jobs()


def driver_for(jobs: Jobs, redis_url: str, store: RedisStore) -> FleetDriver:
    return FleetDriver(agents=[jobs.agent], redis_url=redis_url, store=store, provider=PerSession(), settings=SETTINGS)


@pytest.fixture
def driver(jobs: Jobs, redis_url: str, redis_store: RedisStore) -> Iterator[FleetDriver]:
    with driver_for(jobs, redis_url, redis_store) as d:
        yield d


def test_deleting_a_session_that_ran_on_the_fleet_leaves_no_key_with_its_id(driver: FleetDriver) -> None:
    client, store = driver.client, driver.store
    client.enqueue("jobs", "go", session_id="done-7f3a")
    driver.run_until_idle()
    assert client.status("done-7f3a").status == "finished"
    assert keys_naming(store.client, "done-7f3a")  # the fleet wrote some: its epoch, at least

    store.checkpoints.delete("done-7f3a")

    assert keys_naming(store.client, "done-7f3a") == []
    assert index_entries(store, "done-7f3a") == NO_ENTRIES


def explode() -> None:
    raise PropagatingToolError("the tool says: stop the run")


def test_deleting_an_aborted_parked_or_half_run_session_leaves_no_key_with_its_id(
    driver: FleetDriver, jobs: Jobs
) -> None:
    client, store = driver.client, driver.store
    jobs.during["parked-7f3a-b"] = explode
    client.enqueue("jobs", "go", session_id="parked-7f3a")
    driver.run_until_idle()
    assert client.status("parked-7f3a").status == "parked"
    for session in ("aborted-7f3a", "midway-7f3a"):
        client.enqueue("jobs", "go", session_id=session)
        driver.deliver(driver.pending()[-1])  # the model turn: two tool calls sent, marked, not run
    driver.deliver(next(t for t in driver.pending() if t.task_id.endswith("/tool/aborted-7f3a-a")))
    client.abort("aborted-7f3a")  # one result committed, one call still to run
    assert {"results", "dispatched", "attempts", "abort", "epoch"} <= {
        key.rsplit(":", 1)[1] for key in keys_naming(store.client, "aborted-7f3a")
    }

    for session in ("aborted-7f3a", "midway-7f3a", "parked-7f3a"):
        store.checkpoints.delete(session)
        assert keys_naming(store.client, session) == [], session
        assert index_entries(store, session) == NO_ENTRIES, session


def test_deleting_a_session_while_its_call_runs_drops_the_calls_lease_and_running_entry(
    driver: FleetDriver, jobs: Jobs
) -> None:
    client, store = driver.client, driver.store
    seen: dict[str, Any] = {}

    def delete_now() -> None:
        seen["before"] = keys_naming(store.client, "running-7f3a"), index_entries(store, "running-7f3a")
        store.checkpoints.delete("running-7f3a")
        seen["after"] = keys_naming(store.client, "running-7f3a"), index_entries(store, "running-7f3a")

    jobs.during["running-7f3a-a"] = delete_now
    client.enqueue("jobs", "go", session_id="running-7f3a")
    driver.run_until_idle()

    keys_before, entries_before = seen["before"]
    assert any(":lease:running-7f3a-a" in key for key in keys_before) and entries_before["running"]
    assert seen["after"] == ([], NO_ENTRIES)
    assert keys_naming(store.client, "running-7f3a") == []  # the call's late commit wrote nothing back


def test_with_a_ttl_every_key_of_a_session_has_one_after_every_step(
    jobs: Jobs, redis_url: str, make_redis_store: Callable[..., RedisStore]
) -> None:
    store = make_redis_store(ttl_s=TTL_S)
    sessions = ["done-7f3a", "aborted-7f3a"]

    def assert_every_key_expires() -> None:
        for session in sessions:
            ttls = {key: pttl(store, key) for key in keys_naming(store.client, session)}
            assert ttls and all(0 < ttl <= TTL_S * 1000 for ttl in ttls.values()), (session, ttls)

    with driver_for(jobs, redis_url, store) as driver:
        for session in sessions:
            driver.client.enqueue("jobs", "go", session_id=session)
        assert_every_key_expires()
        driver.deliver(driver.pending()[-1])  # aborted-7f3a's model turn: its calls sent and marked
        assert_every_key_expires()
        driver.client.abort("aborted-7f3a")
        driver.deliver(driver.pending()[-1])  # the abort's advance (the flag has its TTL already: the test below)
        assert_every_key_expires()
        while pending := driver.pending():
            driver.deliver(pending[0])
            assert_every_key_expires()
        assert driver.client.status("done-7f3a").status == "finished"
        assert driver.client.status("aborted-7f3a").aborted


def test_with_a_ttl_an_abort_flag_expires_from_the_moment_it_is_set(
    jobs: Jobs, redis_url: str, make_redis_store: Callable[..., RedisStore]
) -> None:
    store = make_redis_store(ttl_s=TTL_S)
    with driver_for(jobs, redis_url, store) as driver:
        driver.client.enqueue("jobs", "go", session_id="aborted-7f3a")
        assert driver.client.abort("aborted-7f3a")
        assert 0 < pttl(store, FleetKeys(store).abort("aborted-7f3a")) <= TTL_S * 1000


def test_a_session_whose_keys_expired_leaves_the_in_flight_index_at_its_next_step(driver: FleetDriver) -> None:
    client, store = driver.client, driver.store
    client.enqueue("jobs", "go", session_id="gone-7f3a")
    assert index_entries(store, "gone-7f3a")["inflight"] is not None
    store.client.delete(*store.keys.session_keys("gone-7f3a"))  # what the store's TTL does to its record

    assert driver.run_until_idle()[0][1] == "unknown-session"

    # Out of the index: the reaper no longer requeues it every requeue_backoff_s, forever.
    assert index_entries(store, "gone-7f3a") == NO_ENTRIES
