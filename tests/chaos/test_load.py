"""Load: many sessions at once on a small fleet on this machine; none lost, every guarantee kept, and the
time it took. Each session is a model turn asking for 1-3 tool calls, their results, and a final answer
(3 Celery tasks per session at least: 2 model turns and 1 per call; about 6 saves)."""

from __future__ import annotations

import random
import time

import pytest

from lousho import Message
from tests.chaos.harness import (
    SEED,
    ChaosFleet,
    Row,
    check_sessions,
    finished_count,
    install_scripts,
    pick,
    record,
    tool_turn,
)

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(200, 1000)
WORKERS = 4


@pytest.mark.timeout(pick(180, 600))
def test_many_sessions_at_once_none_lost(chaos_fleet: ChaosFleet) -> None:
    fleet, rng = chaos_fleet, random.Random(SEED + 30)
    sessions = [f"l{i:04d}" for i in range(SESSIONS)]
    scripts = {
        s: [tool_turn(*[(f"{s}-c{i}", "work", {"n": i}) for i in range(rng.randint(1, 3))]), Message.assistant("ok")]
        for s in sessions
    }
    install_scripts(fleet, random.Random(0), {})  # no model delays: as fast as the fleet goes
    for session, script in scripts.items():
        fleet.script(session, script)
        fleet.call_session.update({c.id: session for c in script[0].tool_calls})
    for _ in range(WORKERS):
        fleet.start_worker()
    fleet.start_reaper(interval_s=0.5)

    started = time.monotonic()
    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    enqueued = time.monotonic() - started
    deadline = started + pick(150, 560)
    done = 0
    while time.monotonic() < deadline and done < len(sessions):
        time.sleep(0.2)
        done = finished_count(fleet, sessions)
    elapsed = time.monotonic() - started

    violations, figures = check_sessions(fleet, scripts)
    tasks = sum(line.count(" succeeded in ") for line in fleet.worker_logs().splitlines())
    figures["sessions/s"] = round(len(sessions) / elapsed, 1)
    figures["tasks run"] = tasks
    figures["tasks/s"] = round(tasks / elapsed, 1)
    figures["enqueue all (web app)"] = f"{enqueued:.2f} s"
    figures["workers"] = f"{WORKERS} (solo pool)"
    record(Row("load", len(sessions), "sessions", {}, violations, elapsed, dict(figures)))
    assert done == len(sessions), f"{len(sessions) - done} session(s) not finished"
    assert violations == [], "\n".join(violations[:30])
