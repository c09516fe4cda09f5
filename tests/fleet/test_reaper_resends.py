"""The reaper queues at most one re-send per session, whatever the backoff (issue #31, finding 4).

With `LOUSHO_REQUEUE_BACKOFF_S=0.5` and 20 sessions on one worker, the queue's backlog outlasts the sessions'
deadlines: the reaper re-sends them (it cannot tell a waiting message from a lost one). Before issue #31 a re-send
that waited longer than four backoffs was sent again: 336 messages queued at the peak, 73 stale re-sends (14 for
one session) still queued once every session had finished. The queue is read as the worker sees it (the Redis
list the broker keeps), every 20 ms, while the real reaper runs."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from lousho import Message
from lousho.scheduler import reap_once
from lousho.settings import LoushoSettings
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts a Celery worker process (tests/fixtures/workers.py)

SESSIONS = [f"pile-{i}" for i in range(20)]


def queued_resends(fleet: Fleet) -> Counter[str]:
    """The reaper's `advance` messages waiting on the test's queue (all priority lists), by session."""
    found: Counter[str] = Counter()
    for name in (fleet.queue, *(f"{fleet.queue}\x06\x16{p}" for p in (3, 6, 9))):
        for raw in fleet.redis.lrange(name, 0, -1):
            headers = json.loads(raw)["headers"]
            if headers["task"] == "lousho.advance" and headers["argsrepr"].endswith("reason=reaper"):
                found[headers["argsrepr"].split()[0].removeprefix("session=")] += 1
    return found


def _drained(fleet: Fleet, timeout_s: float = 10.0) -> Counter[str]:
    """The re-sends queued once the worker took what the finished sessions left (at most one each, at once
    behind the last step: it finds nothing to do); what is still queued after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while sum((left := queued_resends(fleet)).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_at_most_one_reaper_resend_per_session_is_ever_queued_and_none_is_left_after_the_sessions_finish(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOUSHO_REQUEUE_BACKOFF_S", "0.5")
    settings = LoushoSettings(queue=fleet.queue, reaper_interval_s=0.2).fleet
    assert settings.requeue_backoff_s == 0.5
    for session in SESSIONS:  # two tool calls of 0.15 s each: a solo worker's backlog of ~6 s, deadlines of 2 s
        calls = [(f"{session}-a", "work", {"n": 1, "sleep_s": 0.15}), (f"{session}-b", "work", {"n": 2, "sleep_s": 0.15})]
        fleet.script(session, [tool_turn(*calls), Message.assistant("done")])
        fleet.client.enqueue("jobs", "go", session_id=session, require_worker=False)
    peak: Counter[str] = Counter()
    sent: list[str] = []
    stop = threading.Event()

    def reaper() -> None:
        while not stop.is_set():
            sent.extend(reap_once(fleet.store, fleet.client.app, settings))
            stop.wait(settings.reaper_interval_s)

    def watch() -> None:
        while not stop.is_set():
            for session, count in queued_resends(fleet).items():
                peak[session] = max(peak[session], count)
            stop.wait(0.02)

    threads = [threading.Thread(target=reaper, daemon=True), threading.Thread(target=watch, daemon=True)]
    for thread in threads:
        thread.start()
    fleet.start_worker()
    try:
        fleet.wait_for(SESSIONS, timeout_s=120)
        left = _drained(fleet)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)

    assert sent, "the backlog outlasted the deadlines: the reaper re-sent sessions (else this test shows nothing)"
    assert max(peak.values(), default=0) <= 1, f"re-sends queued at once, by session: {dict(peak)}"
    assert sum(left.values()) == 0, f"stale re-sends still queued after every session finished: {left}"
    assert [s for s in SESSIONS if fleet.redis.exists(fleet.client.keys.requeued(s))] == []
    assert fleet.violations() == []
