"""How a worker process writes a session's events (issue #34's cost, lousho/fleet/events.py), on a real Redis: the
events pending at a save ride in the save's round trip, ahead of it; a task's last save event is carried to the
session's next write in the process or written by the writer thread; a session's events keep their order."""

from __future__ import annotations

import asyncio
import threading
import time

from lousho.checkpoint import Checkpoint
from lousho.fleet.event_writes import WRITES
from lousho.fleet.events import CARRY_S, EventWriter, SessionEvent, events_key, open_session_stream
from lousho.messages import Message
from lousho.stores.redis import RedisStore


def writer(store: RedisStore, session: str) -> EventWriter:
    events = EventWriter(store, session, maxlen=1000, flush_interval_s=60.0)
    events.enabled = True
    return events


def stream(store: RedisStore, session: str) -> list[SessionEvent]:
    entries = store.client.xrange(events_key(store, session))
    return [SessionEvent.from_entry(session, entry_id, fields) for entry_id, fields in entries]


async def test_events_pending_at_a_save_reach_the_stream_in_the_saves_round_trip_before_it(
    redis_store: RedisStore,
) -> None:
    open_session_stream(redis_store, "ride")
    events = writer(redis_store, "ride")
    events.turn_started(1, 1)
    events.add("tool-call-finished", data={"call_id": "c1"})
    before = await events.ride_with_save()
    assert before is not None and stream(redis_store, "ride") == [], "nothing is written before the save"

    checkpoint = Checkpoint(session_id="ride", agent_name="a", version=1, messages=[Message.user("hi")])
    redis_store.checkpoints.save("ride", checkpoint, before=before)

    assert [e.kind for e in stream(redis_store, "ride")] == ["turn-started", "tool-call-finished"]
    assert redis_store.checkpoints.load("ride") == checkpoint
    assert await events.ride_with_save() is None, "what rode is not written twice"


async def test_a_tasks_last_save_event_goes_ahead_of_the_next_tasks_events_in_the_same_process(
    redis_store: RedisStore,
) -> None:
    open_session_stream(redis_store, "carry")
    first = writer(redis_store, "carry")
    first.add("checkpoint-saved", data={"version": 1})
    first.close()  # carried: the next write of the session takes it
    second = writer(redis_store, "carry")
    second.turn_started(2, 1)
    before = await second.ride_with_save()
    assert before is not None
    pipe = redis_store.client.pipeline(transaction=False)
    before(pipe)
    pipe.execute()

    assert [e.kind for e in stream(redis_store, "carry")] == ["checkpoint-saved", "turn-started"]
    await asyncio.sleep(CARRY_S * 5)
    assert len(stream(redis_store, "carry")) == 2, "a carried event taken by a ride is not written again"


def test_a_carried_save_event_no_step_takes_is_written_by_the_writer_thread(redis_store: RedisStore) -> None:
    open_session_stream(redis_store, "alone")
    last = writer(redis_store, "alone")
    last.add("checkpoint-saved", data={"version": 3})
    last.close()
    deadline = time.monotonic() + 10
    while not stream(redis_store, "alone") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [e.data["version"] for e in stream(redis_store, "alone")] == [3]


def test_a_tasks_end_with_a_stop_is_written_at_once_and_drain_writes_what_is_held(redis_store: RedisStore) -> None:
    for session in ("ends", "held"):
        open_session_stream(redis_store, session)
    ending = writer(redis_store, "ends")
    ending.add("checkpoint-saved", data={"version": 2})
    ending.add("finished")
    ending.close()  # not carried: a reader waits for 'finished'
    held = writer(redis_store, "held")
    held.add("checkpoint-saved", data={"version": 1})
    held.close()
    WRITES.drain()  # a process that ends writes what it holds back (atexit)

    assert [e.kind for e in stream(redis_store, "ends")] == ["checkpoint-saved", "finished"]
    assert [e.kind for e in stream(redis_store, "held")] == ["checkpoint-saved"]


async def test_a_sessions_events_keep_their_order_across_flushes_rides_and_ends(redis_store: RedisStore) -> None:
    open_session_stream(redis_store, "order")
    told: list[str] = []
    for task in range(20):
        events = writer(redis_store, "order")
        events.add("tool-call-started", data={"n": f"{task}-a"})
        events.flush()  # the writer thread's
        events.add("tool-call-finished", data={"n": f"{task}-b"})
        if task % 2:
            before = await events.ride_with_save()
            assert before is not None
            pipe = redis_store.client.pipeline(transaction=False)
            before(pipe)
            pipe.execute()
        events.add("checkpoint-saved", data={"n": f"{task}-c"})
        events.close()
        told += [f"{task}-a", f"{task}-b", f"{task}-c"]
        await asyncio.sleep(0)
    WRITES.drain()

    assert [e.data["n"] for e in stream(redis_store, "order")] == told


async def test_a_save_waiting_for_its_sessions_earlier_events_never_holds_the_loop(redis_store: RedisStore) -> None:
    """On lousho's pool one event loop runs many sessions' steps: a save whose session's earlier events the writer
    thread still writes waits for them (order is kept) without blocking the loop's other steps (issue #29)."""
    open_session_stream(redis_store, "slow")
    release = threading.Event()
    WRITES.submit(lambda: release.wait(10), events_key(redis_store, "slow"))  # a write of the session under way
    events = writer(redis_store, "slow")
    events.add("tool-call-finished", data={"call_id": "c1"})
    riding = asyncio.ensure_future(events.ride_with_save())

    for _ in range(20):  # another session's step on the same loop goes on meanwhile
        await asyncio.sleep(0.01)
    assert WRITES.busy(events_key(redis_store, "slow")), "the loop went on while the earlier write was under way"
    assert not riding.done(), "the save waits for the session's earlier write"
    release.set()
    before = await asyncio.wait_for(riding, 10)

    assert before is not None, "once the earlier write is done, the events ride with the save"
    pipe = redis_store.client.pipeline(transaction=False)
    before(pipe)
    pipe.execute()
    assert [e.kind for e in stream(redis_store, "slow")] == ["tool-call-finished"]
