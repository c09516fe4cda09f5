"""Randomised SIGKILLs of workers while sessions with random tool batches and approval gates run.

Random workers die at random moments (a timer), and workers die at chosen moments (triggers in
the fleet app: while a tool runs, while the model answers, right after a model turn is saved, between
a pause's approval and its checkpoint);
new workers start; a client decides approvals (and double-clicks); the reaper recovers what the
dead left. When every session has finished, every guarantee is checked on every session.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.chaos.harness import (
    SEED,
    Aborter,
    Approver,
    Background,
    ChaosFleet,
    QueueWatch,
    Row,
    check_sessions,
    install_scripts,
    pick,
    random_script,
    record,
    settled_count,
)

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(24, 150)
WORKERS = pick(3, 4)
KILL_EVERY_S = pick((0.8, 2.0), (0.6, 2.0))
MAX_ATTEMPTS = 8


@pytest.mark.timeout(pick(180, 900))
def test_random_worker_kills_keep_every_guarantee(chaos_fleet: ChaosFleet) -> None:
    fleet, rng = chaos_fleet, random.Random(SEED)
    fleet.env["LOUSHO_TEST_MAX_ATTEMPTS"] = str(MAX_ATTEMPTS)
    sessions = [f"k{i:03d}" for i in range(SESSIONS)]
    scripts = {s: random_script(rng, s) for s in sessions}
    install_scripts(fleet, rng, scripts)
    for session, script in scripts.items():  # some workers die at chosen moments too
        if rng.random() < 0.2:
            turn = rng.randint(1, len(script) - 1)
            calls = [c for c in script[turn - 1].tool_calls if c.name == "work"]
            trigger = rng.choice([f"model:{session}:{turn}", f"turn-saved:{session}:{turn}"] + [f"tool:{c.id}" for c in calls])
            fleet.kill_on(trigger)
    gated = [s for s, script in scripts.items() if any(c.name == "charge" for m in script for c in m.tool_calls)]
    for session in gated[:3]:  # between a pause's two writes, the approval's and the paused checkpoint's (issue #33)
        fleet.kill_on(f"approval-saved:{session}")
    for _ in range(WORKERS):
        fleet.start_worker()
    fleet.start_reaper(interval_s=0.3)
    approver = Approver(fleet, SEED)
    helpers = Background()
    helpers.every(0.1, approver, "approver")
    aborter = Aborter(fleet, sessions, SEED + 5, share=0.2, every_s=pick((0.5, 1.5), (0.3, 1.0)))
    next_kill = [time.monotonic() + rng.uniform(*KILL_EVERY_S)]

    def chaos() -> None:
        fleet.reap_self_killed()
        if time.monotonic() >= next_kill[0] and fleet.alive():
            fleet.kill(rng.choice(fleet.alive()))
            next_kill[0] = time.monotonic() + rng.uniform(*KILL_EVERY_S)
        while len(fleet.alive()) < WORKERS:
            fleet.start_worker()
            fleet.faults["workers started"] += 1

    started = time.monotonic()
    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    helpers.every(0.05, chaos, "chaos")
    helpers.every(0.1, aborter, "aborter")
    queue = QueueWatch(fleet, sessions)
    helpers.every(0.5, queue, "queue watch")
    deadline = started + pick(150, 840)
    while time.monotonic() < deadline and settled_count(fleet, sessions) < len(sessions):
        time.sleep(0.25)
    helpers.stop()
    elapsed = time.monotonic() - started

    triggers_left = fleet.account_triggers()
    violations, figures = check_sessions(fleet, scripts, approver, max_attempts=MAX_ATTEMPTS, aborter=aborter)
    violations += approver.violations + aborter.violations + helpers.errors + queue.violations
    figures = {**figures, **queue.figures()}
    figures["slowest abort to land"] = f"{aborter.slowest_s:.1f} s"
    figures["double decisions refused"] = approver.refused_twice
    figures["kill triggers never reached"] = triggers_left
    record(Row("random worker kills", len(sessions), "sessions", dict(fleet.faults), violations, elapsed, dict(figures)))
    assert violations == [], "\n".join(violations[:30]) + "\n" + fleet.worker_logs()[-6000:]
