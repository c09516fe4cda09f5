"""The reaper works from the in-flight index and the leases, never from broker messages.
Tests drive its clock (`now_ms`) instead of sleeping."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import Celery

from lousho import Message
from lousho.fleet.inflight import InflightIndex
from lousho.fleet.settings import celery_config
from lousho.scheduler import Client, reap_once
from lousho.scheduler.reaper import REQUEUE_LOST_AFTER_MS
from lousho.worker import FleetSettings, broker_url
from lousho.worker.leases import Lease
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

HOUR_MS = 3_600_000


class Recorder:
    """A Celery app whose sends are recorded instead of delivered: a broker that loses every message."""

    def __init__(self, queue: str) -> None:
        self.sent: list[tuple[str, list[Any], str]] = []
        app = Celery("recorder", set_as_current=False)
        app.conf.update(celery_config("memory://", FleetSettings(queue=queue)))
        self.conf, self.connection_for_read = app.conf, app.connection_for_read  # its queues: always empty

    def send_task(self, name: str, args: list[Any], task_id: str, **_: Any) -> None:
        self.sent.append((name, args, task_id))


def later(fleet: Fleet) -> int:
    return InflightIndex.of(fleet.store, 0).server_time_ms() + HOUR_MS


def test_a_job_whose_message_was_lost_is_requeued_and_finishes(fleet: Fleet) -> None:
    fleet.script("lost", [Message.assistant("done")])
    lossy = Client(broker=broker_url(fleet.env["LOUSHO_TEST_FLEET_REDIS"]), store=fleet.store, settings=FleetSettings(queue=fleet.queue))
    lossy.app = Recorder(fleet.queue)  # type: ignore[assignment]
    lossy.enqueue("jobs", "go", session_id="lost", require_worker=False)
    assert fleet.client.status("lost").status == "in-progress"  # the accepted record was written first

    requeued = reap_once(fleet.store, fleet.client.app, FleetSettings(queue=fleet.queue), now_ms=later(fleet))
    fleet.start_worker()
    fleet.wait_for(["lost"], timeout_s=60)

    assert requeued == ["lost"]


def test_a_session_whose_lease_is_held_is_left_alone(fleet: Fleet) -> None:
    fleet.script("busy", [Message.assistant("done")])
    recorder = Recorder(fleet.queue)
    fleet.client.app = recorder  # type: ignore[assignment]
    fleet.client.enqueue("jobs", "go", session_id="busy", require_worker=False)
    lease = Lease(fleet.redis, fleet.client.keys.lease("busy"), 60_000)
    assert lease.acquire()

    requeued = reap_once(fleet.store, recorder, FleetSettings(queue=fleet.queue), now_ms=later(fleet))

    assert requeued == []
    lease.release()


def test_a_requeued_session_is_not_requeued_again_until_its_backoff_passes(fleet: Fleet) -> None:
    recorder = Recorder(fleet.queue)
    fleet.client.app = recorder  # type: ignore[assignment]
    fleet.client.enqueue("jobs", "go", session_id="once", require_worker=False)
    settings = FleetSettings(queue=fleet.queue, reaper_interval_s=0.001, requeue_backoff_s=30)
    now = later(fleet)

    first = reap_once(fleet.store, recorder, settings, now_ms=now)
    fleet.redis.delete(*fleet.client.keys.reaper_locks, fleet.client.keys.requeued("once"))  # a worker took it
    second = reap_once(fleet.store, recorder, settings, now_ms=now + 1_000)
    fleet.redis.delete(*fleet.client.keys.reaper_locks)
    third = reap_once(fleet.store, recorder, settings, now_ms=now + 45_001)  # the backoff, and up to half again

    assert (first, second, third) == (["once"], [], ["once"])


def test_a_requeue_still_waiting_on_the_queue_is_not_sent_again_until_it_may_be_lost(fleet: Fleet) -> None:
    """Under a backlog the reaper adds one message per session, not one per pass (issue #21); a requeue
    nobody took in `requeue_wait_ms` (lost with its worker) is sent again."""
    recorder = Recorder(fleet.queue)
    fleet.client.app = recorder  # type: ignore[assignment]
    fleet.client.enqueue("jobs", "go", session_id="waits", require_worker=False)
    settings = FleetSettings(queue=fleet.queue, reaper_interval_s=0.001, requeue_backoff_s=30)
    now = later(fleet)

    passes = []
    for at in (now, now + 31_000, now + 62_000, now + settings.requeue_wait_ms + 1):
        fleet.redis.delete(*fleet.client.keys.reaper_locks)
        passes.append(reap_once(fleet.store, recorder, settings, now_ms=at))

    assert passes == [["waits"], [], [], ["waits"]]


def test_a_requeue_is_not_sent_again_while_its_queue_holds_messages_whatever_the_backoff(fleet: Fleet) -> None:
    """At most one re-send per session waits on a queue (issue #31): past `requeue_wait_ms`, another goes only
    once the queue is empty (a queued one would have been taken) or after `REQUEUE_LOST_AFTER_MS`."""
    fleet.client.enqueue("jobs", "go", session_id="backlog", require_worker=False)  # its message waits: no worker
    settings = FleetSettings(queue=fleet.queue, reaper_interval_s=0.001, requeue_backoff_s=0.5)
    now = later(fleet)

    def reap(at: int) -> list[str]:
        fleet.redis.delete(*fleet.client.keys.reaper_locks)
        return reap_once(fleet.store, fleet.client.app, settings, now_ms=at)

    first = reap(now)
    busy = [reap(now + settings.requeue_wait_ms * k) for k in (1, 10, 100)]
    queued = fleet.redis.llen(fleet.queue)
    long_lost = reap(now + REQUEUE_LOST_AFTER_MS)
    fleet.redis.delete(fleet.queue)  # the queue drained, and the last re-send with it: it was lost
    drained = reap(now + REQUEUE_LOST_AFTER_MS + settings.requeue_wait_ms)

    assert (first, busy, queued) == (["backlog"], [[], [], []], 2)
    assert (long_lost, drained) == (["backlog"], ["backlog"])


def test_several_reapers_at_once_requeue_each_session_once(fleet: Fleet) -> None:
    recorder = Recorder(fleet.queue)
    fleet.client.app = recorder  # type: ignore[assignment]
    for i in range(10):
        fleet.client.enqueue("jobs", "go", session_id=f"many-{i}", require_worker=False)
    recorder.sent.clear()
    now = later(fleet)
    results: list[list[str]] = []

    def reap() -> None:
        results.append(reap_once(fleet.store, recorder, FleetSettings(queue=fleet.queue, reaper_interval_s=5), now_ms=now))

    threads = [threading.Thread(target=reap) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    requeued = [s for r in results for s in r]
    assert sorted(requeued) == sorted(f"many-{i}" for i in range(10))
    assert len(recorder.sent) == 10


def test_a_tool_call_that_kills_its_worker_every_time_gets_an_error_result(fleet: Fleet) -> None:
    fleet.script("poison", [tool_turn(("deadly", "work", {"n": 1})), Message.assistant("survived")])
    fleet.start_reaper()
    fleet.client.enqueue("jobs", "go", session_id="poison", require_worker=False)
    for _ in range(3):  # three workers in turn die running the call (each trigger fires once)
        fleet.kill_on("tool:deadly")
        fleet.start_worker().process.wait(timeout=60)
    fleet.start_worker()
    fleet.wait_for(["poison"], timeout_s=60)

    checkpoint = fleet.client.checkpoint("poison")
    assert checkpoint is not None
    assert checkpoint.messages[-2].result()["error"] == "poison"
    assert fleet.counts("runs")["deadly"] == 3


def test_a_model_turn_that_kills_its_worker_every_time_parks_the_session(fleet: Fleet) -> None:
    fleet.script("sick", [tool_turn(("x", "work", {"n": 1})), Message.assistant("never")])
    fleet.start_reaper()
    fleet.client.enqueue("jobs", "go", session_id="sick", require_worker=False)
    for _ in range(3):  # three workers in turn die while the model answers turn 1
        fleet.kill_on("model:sick:1")
        fleet.start_worker().process.wait(timeout=60)
    fleet.start_worker()
    fleet.wait_for(["sick"], status="parked", timeout_s=60)

    status = fleet.client.status("sick")
    assert status.parked_reason is not None and "model turn" in status.parked_reason
    assert fleet.client.sessions(status="parked") == ["sick"]


def test_the_sessions_one_pass_requeues_come_due_again_at_spread_times(fleet: Fleet) -> None:
    recorder = Recorder(fleet.queue)
    fleet.client.app = recorder  # type: ignore[assignment]
    sessions = [f"spread-{i}" for i in range(40)]
    for session_id in sessions:
        fleet.client.enqueue("jobs", "go", session_id=session_id, require_worker=False)
    settings = FleetSettings(queue=fleet.queue, reaper_interval_s=0.001, requeue_backoff_s=30)
    now = later(fleet)

    assert sorted(reap_once(fleet.store, recorder, settings, now_ms=now)) == sorted(sessions)
    deadlines = [fleet.redis.zscore(fleet.store.keys.inflight_of(s), s) for s in sessions]
    after_ms = [int(deadline) - now for deadline in deadlines if deadline is not None]
    assert len(after_ms) == len(sessions)
    assert all(30_000 <= ms <= 45_000 for ms in after_ms)  # the backoff, and up to half that again
    assert len(set(after_ms)) > len(sessions) / 2 and max(after_ms) - min(after_ms) > 5_000
