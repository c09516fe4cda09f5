"""A session's live events on the fleet (issue #34), read with `Client.events()` from real worker processes.

The model (`tests/fleet/events_app.py`) streams its answer in 20 pieces, 0.05 s apart. Workers write the pieces to
the session's event stream as they come; the checkpoint stays the truth, and the stream must agree with it.
"""

from __future__ import annotations

import threading

import pytest

from lousho.fleet.events import SessionEvent, events_key
from lousho.scheduler.events import EventFeed
from tests.fleet.conftest import Fleet

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

APP = "tests.fleet.events_app"


def saved_answer(fleet: Fleet, session: str) -> str:
    checkpoint = fleet.client.checkpoint(session)
    assert checkpoint is not None and checkpoint.status == "finished"
    text = checkpoint.messages[-1].content
    assert isinstance(text, str)
    return text


def joined(events: list[SessionEvent], turn: int, attempt: int) -> str:
    return "".join(e.text or "" for e in events if e.kind == "text-delta" and (e.turn, e.attempt) == (turn, attempt))


def test_deltas_reach_the_reader_before_the_turn_is_saved_in_order_and_join_to_the_saved_text(fleet: Fleet) -> None:
    fleet.start_worker(app=APP)
    session = fleet.client.enqueue("writer", "what is durable?", session_id="live-1")
    seen: list[SessionEvent] = []
    saved_when_first_delta_came: list[bool] = []
    for event in fleet.client.events(session, block_s=0.5, timeout_s=60):
        if event.kind == "text-delta" and not saved_when_first_delta_came:
            checkpoint = fleet.client.checkpoint(session)
            assert checkpoint is not None
            saved_when_first_delta_came.append(any(m.role == "assistant" for m in checkpoint.messages))
        seen.append(event)

    text = saved_answer(fleet, session)
    kinds = [e.kind for e in seen]
    assert kinds[0] == "turn-started" and (seen[0].turn, seen[0].attempt) == (1, 1)
    assert kinds[-2:] == ["checkpoint-saved", "finished"], kinds
    assert saved_when_first_delta_came == [False], "the first delta came after the turn's save"
    deltas = [e for e in seen if e.kind == "text-delta"]
    assert len(deltas) >= 3, "the answer came in one piece, not streamed"
    last_delta = kinds.index("text-delta") + len(deltas) - 1
    assert kinds[last_delta + 1 :] == ["checkpoint-saved", "finished"], "every delta is written before the save"
    assert joined(seen, 1, 1) == text
    ids = [tuple(map(int, e.id.split("-"))) for e in seen]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(e.session_id == session for e in seen)


def test_a_worker_killed_mid_stream_shows_attempt_2_whose_text_is_the_saved_text(fleet: Fleet) -> None:
    fleet.start_worker("w1", app=APP)
    fleet.start_worker("w2", app=APP)
    fleet.start_reaper()
    fleet.redis.sadd(fleet.key("kill"), "die:live-kill")
    session = fleet.client.enqueue("writer", "survive this", session_id="live-kill")
    seen = list(fleet.client.events(session, block_s=0.5, timeout_s=60))

    text = saved_answer(fleet, session)
    starts = [(e.turn, e.attempt) for e in seen if e.kind == "turn-started"]
    assert starts == [(1, 1), (1, 2)], starts
    partial = joined(seen, 1, 1)
    assert partial and text.startswith(partial) and partial != text, "attempt 1 streamed part of the answer"
    assert joined(seen, 1, 2) == text
    kinds = [e.kind for e in seen]
    assert "requeued" in kinds[kinds.index("turn-started") : kinds.index("turn-started", 1)]
    assert sum(e.kind == "checkpoint-saved" and e.data["status"] == "finished" for e in seen) == 1


def test_a_provider_retry_mid_stream_starts_the_turn_again_and_the_text_after_it_is_the_saved_text(
    fleet: Fleet,
) -> None:
    """A retryable provider error mid-answer (no worker died: the same attempt asks the model again) is told as a
    `turn-started` of the same turn and attempt with `retry: 2`; a reader drops what it joined before it."""
    fleet.start_worker(app=APP)
    fleet.redis.sadd(fleet.key("kill"), "fail:live-retry")
    session = fleet.client.enqueue("writer", "retry this", session_id="live-retry")
    seen = list(fleet.client.events(session, block_s=0.5, timeout_s=60))

    text = saved_answer(fleet, session)
    starts = [(e.turn, e.attempt, e.data.get("retry")) for e in seen if e.kind == "turn-started"]
    assert starts == [(1, 1, None), (1, 1, 2)], starts
    again = max(i for i, e in enumerate(seen) if e.kind == "turn-started")
    before = "".join(e.text or "" for e in seen[:again] if e.kind == "text-delta")
    after = "".join(e.text or "" for e in seen[again:] if e.kind == "text-delta")
    assert before and text.startswith(before) and before != text, "the failed ask streamed part of the answer"
    assert after == text
    assert not any(e.kind in ("failed", "parked", "requeued") for e in seen), [e.kind for e in seen]


def test_a_reader_resuming_from_an_event_id_misses_none_and_sees_none_twice(fleet: Fleet) -> None:
    fleet.start_worker(app=APP)
    session = fleet.client.enqueue("writer", "resume me", session_id="live-resume")
    first: list[SessionEvent] = []
    for event in fleet.client.events(session, block_s=0.5, timeout_s=60):
        first.append(event)
        if event.kind == "text-delta":
            break  # a browser whose connection dropped mid-answer
    rest = list(fleet.client.events(session, after=first[-1].id, block_s=0.5, timeout_s=60))

    everything = list(fleet.client.events(session, block_s=0.5, timeout_s=60))
    assert [e.id for e in first + rest] == [e.id for e in everything]
    assert first + rest == everything
    assert joined(first + rest, 1, 1) == saved_answer(fleet, session)


async def test_the_async_feed_reads_the_same_events_as_the_sync_one(fleet: Fleet) -> None:
    fleet.start_worker(app=APP)
    session = fleet.client.enqueue("writer", "async please", session_id="live-async")
    read = [event async for event in fleet.client.events(session, block_s=0.5, timeout_s=60)]
    assert [e.kind for e in read][-1] == "finished"
    assert read == list(fleet.client.events(session, block_s=0.5))
    assert joined(read, 1, 1) == saved_answer(fleet, session)


def test_an_agent_with_events_off_writes_none_and_its_run_finishes(fleet: Fleet) -> None:
    fleet.start_worker(app=APP)
    session = fleet.client.enqueue("quiet", "no stream", session_id="live-quiet")
    fleet.wait_for([session])
    assert saved_answer(fleet, session).startswith("Answer to 'no stream'")
    assert fleet.redis.xlen(events_key(fleet.store, session)) == 0  # opened by the Client, written by no worker
    assert list(fleet.client.events(session, block_s=0.2)) == []


def test_the_stream_is_bounded_expires_with_the_session_and_goes_with_its_delete(fleet: Fleet) -> None:
    fleet.start_worker(app=APP, LOUSHO_TEST_DELTA_DELAY_S="0")
    session = fleet.client.enqueue("writer", "short", session_id="live-keys")
    fleet.wait_for([session])
    key = events_key(fleet.store, session)
    assert key == f"{fleet.prefix}{{live-keys}}:events"  # the session's hash tag: its Cluster slot
    assert fleet.redis.xlen(key) > 0
    fleet.store.checkpoints.delete(session)
    assert not fleet.redis.exists(key)
    fleet.client.enqueue("writer", "again", session_id=session)  # a new incarnation: a fresh stream
    fleet.wait_for([session])
    assert [e.kind for e in fleet.client.events(session, block_s=0.2)].count("turn-started") == 1


def test_a_feed_ends_when_the_run_waits_and_a_bad_resume_id_is_a_typed_error(fleet: Fleet) -> None:
    from lousho.errors import InvalidInputError

    fleet.start_worker(app=APP, LOUSHO_TEST_DELTA_DELAY_S="0")
    session = fleet.client.enqueue("writer", "first", session_id="live-two")
    fleet.wait_for([session])
    first = list(fleet.client.events(session, block_s=0.2))
    fleet.client.enqueue("writer", "second", session_id=session)  # the run goes on: the feed waits for it
    feed: EventFeed = fleet.client.events(session, after=first[-1].id, block_s=0.2, timeout_s=60)
    second = list(feed)
    assert [(e.turn, e.attempt) for e in second if e.kind == "turn-started"] == [(2, 1)]
    assert second[-1].kind == "finished" and joined(second, 2, 1).startswith("Answer to 'second'")
    with pytest.raises(InvalidInputError, match="event id"):
        fleet.client.events(session, after="$; FLUSHALL")
    done = threading.Event()
    threading.Thread(target=lambda: (list(fleet.client.events(session, block_s=0.2)), done.set()), daemon=True).start()
    assert done.wait(10), "a feed of a finished run did not end"
