"""The fleet under SIGKILL (DESIGN.md: 'Reliability rules for the fleet'). Duplicate delivery, a worker paused past
its lease and a stale copy of a call are tested step by step on the in-process driver (test_driver.py)."""

from __future__ import annotations

import random
import signal

import pytest

from lousho import Message
from tests.engine.helpers import assert_finished_with_every_result
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def random_script(rng: random.Random, session: str) -> list[Message]:
    turns = []
    for t in range(rng.randint(1, 2)):
        calls = [(f"{session}-t{t}-c{i}", "work", {"n": i, "sleep_s": rng.choice([0.05, 0.2, 0.4])}) for i in range(rng.randint(1, 3))]
        turns.append(tool_turn(*calls))
    return [*turns, Message.assistant(f"{session} done")]


def assert_guarantees(fleet: Fleet, sessions: list[str]) -> None:
    assert fleet.violations() == []
    for session in sessions:
        assert_finished_with_every_result(fleet.client.checkpoint(session), session)


def test_sessions_finish_with_every_guarantee_when_workers_are_killed(fleet: Fleet) -> None:
    rng = random.Random(7)
    sessions = [f"s{i:02d}" for i in range(20)]
    scripts = {s: random_script(rng, s) for s in sessions}
    scripts["s07"] = [tool_turn(("s07-slow", "work", {"n": 1, "sleep_s": 3.0})), Message.assistant("s07 done")]
    for session, answers in scripts.items():
        fleet.script(session, answers)
    fleet.kill_on("turn-saved:s03:1")  # a worker dies right after saving s03's first model answer
    # One step per process: a kill then cuts short exactly the step it aims at, so every model turn is asked
    # once (on lousho's pool a kill cuts short each step of the process, each asked again: test_many_in_flight.py)
    for _ in range(3):
        fleet.start_worker(pool="solo")
    fleet.start_reaper()

    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    victim = fleet.worker_with_pid(fleet.pid_running("s07-slow"))
    victim.kill(signal.SIGKILL)  # and another dies in the middle of a tool call
    fleet.start_worker(pool="solo")
    fleet.start_worker(pool="solo")
    fleet.wait_for(sessions, timeout_s=120)

    assert_guarantees(fleet, sessions)
    asked = fleet.counts("asked")
    assert all(count == 1 for count in asked.values()), {k: v for k, v in asked.items() if v != 1}
    runs = fleet.counts("runs")
    assert runs.pop("s07-slow") == 2  # it had no recorded result: it ran again, with the same tool_call_id
    assert set(runs.values()) == {1}
    assert not fleet.redis.sismember(fleet.key("kill"), "turn-saved:s03:1")  # that crash did happen
