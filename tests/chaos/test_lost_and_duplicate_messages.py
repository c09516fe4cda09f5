"""A broker that loses and repeats messages: every task send, by the workers, the web-app client and the
reaper, is dropped or sent twice at random (seeded). The checkpoint is the truth and a message only a
wake-up: the reaper recovers the dropped ones, duplicates find their work recorded or leased."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest

from tests.chaos.harness import (
    SEED,
    Approver,
    Background,
    ChaosFleet,
    Row,
    check_sessions,
    install_scripts,
    pick,
    random_script,
    record,
    settled_count,
)

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(20, 120)
DROP, DUP = 0.1, 0.2


def lossy(app: Any, rng: random.Random, counts: Counter[str]) -> None:
    """Make `app.send_task` lose or repeat messages, like the fleet app's LOUSHO_TEST_SEND_FAULTS."""
    send = app.send_task

    def send_unreliably(*args: Any, **kwargs: Any) -> Any:
        roll = rng.random()
        if roll < DROP:
            counts["dropped (client, reaper)"] += 1
            return None
        if roll < DROP + DUP:
            counts["duplicated (client, reaper)"] += 1
            send(*args, **kwargs)
        return send(*args, **kwargs)

    app.send_task = send_unreliably


@pytest.mark.timeout(pick(180, 600))
def test_dropped_and_repeated_messages_change_nothing(chaos_fleet: ChaosFleet) -> None:
    fleet, rng = chaos_fleet, random.Random(SEED + 1)
    sessions = [f"m{i:03d}" for i in range(SESSIONS)]
    scripts = {s: random_script(rng, s) for s in sessions}
    install_scripts(fleet, rng, scripts)
    lossy(fleet.client.app, random.Random(SEED + 2), fleet.faults)
    for _ in range(3):
        fleet.start_worker(LOUSHO_TEST_SEND_FAULTS=f"drop={DROP},dup={DUP},seed={SEED}")
    fleet.start_reaper(interval_s=0.3)
    approver = Approver(fleet, SEED + 3)
    helpers = Background()
    helpers.every(0.1, approver, "approver")

    started = time.monotonic()
    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    deadline = started + pick(150, 560)
    while time.monotonic() < deadline and settled_count(fleet, sessions) < len(sessions):
        time.sleep(0.25)
    helpers.stop()
    elapsed = time.monotonic() - started

    violations, figures = check_sessions(fleet, scripts, approver)
    violations += approver.violations + helpers.errors
    for kind, count in fleet.counts("send-faults").items():
        fleet.faults[{"drop": "dropped (workers)", "dup": "duplicated (workers)"}[kind]] += count
    requeues = sum("reaper requeued" in line for line in fleet.worker_logs().splitlines())
    figures["workers alive at the end"] = len(fleet.alive())
    record(Row("lost and repeated messages", len(sessions), "sessions", dict(fleet.faults), violations, elapsed, dict(figures)))
    assert requeues == 0  # (the reaper runs in this process; workers never log it)
    assert len(fleet.alive()) == 3
    assert violations == [], "\n".join(violations[:30]) + "\n" + fleet.worker_logs()[-6000:]
