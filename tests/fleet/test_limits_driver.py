"""An agent's maximum of sessions in flight, step by step with `FleetDriver` (issue #29): the real tasks, Lua
scripts and Redis, each message delivered by the test.

A model turn that finds no slot free stands down without using up an attempt and is sent again; the slot
comes back when its holder finishes or pauses for approval, and when nothing refreshed it for `slot_ttl_s`
(the session of a worker that died).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from pydantic import BaseModel

from lousho import Agent, define_tool
from lousho.errors import ProviderError
from lousho.fleet.keys import FleetKeys
from lousho.fleet.limits import FleetLimits, session_slots_key, slot_queue_key, slot_waiting_key
from lousho.providers import ScriptedProvider, tool_calls
from lousho.providers.base import ModelRequest, ModelResponse
from lousho.stores.redis import RedisStore
from lousho.testing import FleetDriver
from lousho.testing.fleet import SentTask
from lousho.worker import FleetSettings
from lousho.worker import limits as limits_module
from lousho.worker.limits import touch_slots


class Note(BaseModel):
    text: str


class Charge(BaseModel):
    amount: int


booker = Agent(
    name="booker",
    model="scripted",
    tools=[
        define_tool(name="note", description="Take a note", input=Note, execute=lambda args, ctx: "noted"),
        define_tool(
            name="charge", description="Charge", input=Charge, needs_approval=True, execute=lambda args, ctx: "charged"
        ),
    ],
)


@pytest.fixture
def provider() -> ScriptedProvider:
    return ScriptedProvider(
        [
            tool_calls(("n1", "note", {"text": "a"})),  # A, turn 1
            tool_calls(("c1", "charge", {"amount": 5})),  # A, turn 2: waits for approval
            tool_calls(("n2", "note", {"text": "b"})),  # B, turn 1
            "B done.",  # B, turn 2
            "A done.",  # A, turn 3
        ]
    )


@pytest.fixture
def driver(
    redis_url: str, redis_prefix: str, redis_client: redis.Redis, provider: ScriptedProvider
) -> Iterator[FleetDriver]:
    limits = FleetLimits(max_sessions_in_flight={"booker": 1}, slot_ttl_s=0.5)
    store = RedisStore(redis_client, prefix=redis_prefix)  # the limits' keys are under this test's prefix
    with FleetDriver(
        agents=[booker], redis_url=redis_url, store=store, provider=provider, limits=limits
    ) as fleet_driver:
        yield fleet_driver


def deliver(driver: FleetDriver, task_id: str) -> str:
    """Deliver the (oldest) pending message of `task_id`."""
    task: SentTask = next(t for t in driver.pending() if t.task_id == task_id)
    return driver.deliver(task)


def server_ms(client: redis.Redis) -> int:
    """Redis's clock, which slots expire by, not this process's."""
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def attempts(driver: FleetDriver, session: str) -> dict[bytes, bytes]:
    return driver.store.client.hgetall(FleetKeys(driver.store).attempts(session))  # type: ignore[return-value]


def test_a_turn_waits_for_a_slot_without_an_attempt_and_gets_it_when_the_holder_pauses_or_finishes(
    driver: FleetDriver, provider: ScriptedProvider
) -> None:
    slots = session_slots_key(driver.store.keys, "booker")
    client = driver.client
    client.enqueue("booker", "book for A", session_id="A")
    client.enqueue("booker", "book for B", session_id="B")
    assert deliver(driver, "A/turn/1") == "tools-dispatched"  # A holds the one slot while its note runs
    for _ in range(4):  # more than max_attempts (3): waiting is no attempt, B is never parked
        assert deliver(driver, "B/turn/1") == "waiting-for-slot"
        assert attempts(driver, "B").get(b"turn:1", b"0") == b"0"
        assert [t.task_id for t in driver.pending()].count("B/turn/1") == 1  # sent again, once
    assert driver.store.client.zrange(slots, 0, -1) == [b"A"]
    assert driver.store.client.zrange(slot_waiting_key(driver.store.keys, "booker"), 0, -1) == [b"B"]
    assert len(provider.calls) == 1

    assert deliver(driver, "A/turn/1/tool/n1") == "turn-enqueued"
    assert deliver(driver, "A/turn/2") == "awaiting-approval"  # paused: its slot comes back
    assert driver.store.client.zcard(slots) == 0
    assert deliver(driver, "B/turn/1") == "tools-dispatched"  # B's waiting turn goes on
    [pending] = client.approvals("A")
    client.resolve_approval(pending.id, approved=True)
    driver.run_until_idle()  # A's next turn waits while B runs, then takes the slot B's end gave back
    assert client.status("B").text == "B done." and client.status("A").text == "A done."
    assert driver.store.client.zcard(slots) == 0
    assert len(provider.calls) == 5  # each turn asked once


def test_a_slot_nothing_refreshes_comes_back_after_its_ttl(driver: FleetDriver) -> None:
    """A session whose worker died holds its slot until `slot_ttl_s` after its last refresh."""
    slots = session_slots_key(driver.store.keys, "booker")
    client = driver.store.client
    expiry_ms = server_ms(client) + 500  # as slot_take.lua writes it, with slot_ttl_s=0.5
    client.zadd(slots, {"dead-workers-session": expiry_ms})
    driver.client.enqueue("booker", "book for A", session_id="A")
    assert deliver(driver, "A/turn/1") == "waiting-for-slot"
    while server_ms(client) <= expiry_ms:
        time.sleep(0.05)
    assert deliver(driver, "A/turn/1") == "tools-dispatched"
    assert client.zrange(slots, 0, -1) == [b"A"]


def test_a_heartbeat_pushes_the_expiry_of_the_slot_its_session_holds(driver: FleetDriver) -> None:
    slots = session_slots_key(driver.store.keys, "booker")
    client = driver.store.client
    driver.client.enqueue("booker", "book for A", session_id="A")
    assert deliver(driver, "A/turn/1") == "tools-dispatched"
    first = client.zscore(slots, "A")
    assert first is not None
    while server_ms(client) <= first - 500:  # until Redis's clock has moved on since the slot was taken
        time.sleep(0.01)
    touch_slots(driver.worker("w1").lousho_runtime, ["A"])  # what `heartbeat` does at each beat
    second = client.zscore(slots, "A")
    assert second is not None and second > first


def test_a_long_tool_call_on_another_process_keeps_its_sessions_slot(
    redis_url: str, redis_prefix: str, redis_client: redis.Redis
) -> None:
    """The slot outlives `slot_ttl_s` while the session's tool call runs: each heartbeat of the call refreshes it,
    though its process never took the slot; so a waiting session does not take it from under the run."""
    release = threading.Event()

    async def slow_note(args: Note, ctx: object) -> str:
        await asyncio.to_thread(release.wait, 30)  # the worker's event loop goes on beating meanwhile
        return "noted"

    agent = Agent(
        name="booker",
        model="scripted",
        tools=[define_tool(name="note", description="Take a note", input=Note, execute=slow_note)],
    )
    provider = ScriptedProvider([tool_calls(("n1", "note", {"text": "a"})), "A done.", "B done."])
    limits = FleetLimits(max_sessions_in_flight={"booker": 1}, slot_ttl_s=0.5)
    settings = FleetSettings(lease_ttl_s=0.3)  # a heartbeat every 0.1 s
    store = RedisStore(redis_client, prefix=redis_prefix)
    with FleetDriver(
        agents=[agent], redis_url=redis_url, store=store, provider=provider, limits=limits, settings=settings
    ) as driver:
        slots = session_slots_key(driver.store.keys, "booker")
        driver.client.enqueue("booker", "book for A", session_id="A")
        driver.client.enqueue("booker", "book for B", session_id="B")
        assert deliver(driver, "A/turn/1") == "tools-dispatched"
        taken_expiry = redis_client.zscore(slots, "A")
        assert taken_expiry is not None
        limits_module._held.clear()  # as on another process, which never took A's slot
        call = next(t for t in driver.pending() if t.task_id == "A/turn/1/tool/n1")
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(driver.deliver, call, worker="w2")
            while server_ms(redis_client) <= taken_expiry + 200:  # past the slot's first expiry, the call still runs
                time.sleep(0.02)
            assert deliver(driver, "B/turn/1") == "waiting-for-slot"
            release.set()
            assert running.result(timeout=30) == "turn-enqueued"
        driver.run_until_idle()
        assert driver.client.status("A").text == "A done." and driver.client.status("B").text == "B done."


class Refusing:
    """A vendor that refuses every request (a retry cannot help)."""

    async def generate(self, request: ModelRequest) -> ModelResponse:
        raise ProviderError("HTTP 400: refused", retryable=False, status=400)


def test_a_session_whose_turn_fails_or_parks_gives_its_slot_back(
    redis_url: str, redis_prefix: str, redis_client: redis.Redis
) -> None:
    limits = FleetLimits(max_sessions_in_flight={"booker": 1})
    store = RedisStore(redis_client, prefix=redis_prefix)
    with FleetDriver(agents=[booker], redis_url=redis_url, store=store, provider=Refusing(), limits=limits) as driver:
        slots = session_slots_key(driver.store.keys, "booker")
        driver.client.enqueue("booker", "book for A", session_id="A")
        [turn] = driver.pending()
        for _ in range(2):  # failed: the reaper would send it again; meanwhile its slot is free
            assert driver.deliver(turn).startswith("error:")
            assert redis_client.zcard(slots) == 0
        assert driver.deliver(turn) == "parked"  # the provider failed it max_attempts (3) times (issue #31)
        assert redis_client.zcard(slots) == 0


def test_free_slots_go_to_waiting_sessions_in_the_order_they_first_waited(
    redis_url: str, redis_prefix: str, redis_client: redis.Redis
) -> None:
    provider = ScriptedProvider(["A done.", "B done.", "C done."])
    limits = FleetLimits(max_sessions_in_flight={"booker": 1})
    store = RedisStore(redis_client, prefix=redis_prefix)
    with FleetDriver(agents=[booker], redis_url=redis_url, store=store, provider=provider, limits=limits) as driver:
        slots = session_slots_key(driver.store.keys, "booker")
        redis_client.zadd(slots, {"A": server_ms(redis_client) + 60_000})  # A holds the one slot
        for session in ("B", "C"):
            driver.client.enqueue("booker", f"book for {session}", session_id=session)
            assert deliver(driver, f"{session}/turn/1") == "waiting-for-slot"
        assert deliver(driver, "C/turn/1") == "waiting-for-slot"  # B waits ahead of C
        redis_client.zrem(slots, "A")  # A is done
        assert deliver(driver, "C/turn/1") == "waiting-for-slot"  # C may not take B's turn
        assert deliver(driver, "B/turn/1") == "finished"
        assert deliver(driver, "C/turn/1") == "finished"
        assert driver.client.status("B").text == "A done."  # the provider's first answer went to B
        assert [redis_client.zcard(k) for k in (slots, slot_queue_key(driver.store.keys, "booker"))] == [0, 0]
