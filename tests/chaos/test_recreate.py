"""Sessions deleted and enqueued again under the same id while their runs are under way, under load and
worker kills (issue #21). Each new run's model reuses the old run's call ids with other arguments, so a
result that leaks from the old run into the new one shows: every session must end with exactly its
last run's turns, and each result must be the one its own call's arguments give."""

from __future__ import annotations

import json
import random
import time

import pytest

from lousho import Message
from tests.chaos.harness import SEED, Background, ChaosFleet, QueueWatch, Row, pick, record, tool_turn
from tests.engine.helpers import assert_valid_transcript

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(16, 120)
WORKERS = pick(2, 4)


def script(rng: random.Random, session: str, run: int) -> list[Message]:
    """The same call ids in every run; arguments from a range of the run's own (run 1: n < 100)."""
    turns = []
    for t in range(rng.randint(1, 2)):
        calls = [(f"c{t}-{i}", "work", {"n": 100 * (run - 1) + rng.randint(0, 99), "sleep_s": rng.choice([0.1, 0.5, 1.0, 1.5])})
                 for i in range(rng.randint(1, 3))]  # fmt: skip
        turns.append(tool_turn(*calls))
    return [*turns, Message.assistant(f"{session} done (run {run})")]


def check(fleet: ChaosFleet, session: str, answers: list[Message]) -> list[str]:
    checkpoint = fleet.store.checkpoints.load(session)
    if checkpoint is None or checkpoint.status != "finished":
        return [f"{session}: not finished ({fleet.client.status(session).status})"]
    try:
        assert_valid_transcript(checkpoint.messages)
    except AssertionError as exc:
        return [f"{session}: invalid transcript: {exc}"]
    assistants = [m for m in checkpoint.messages if m.role == "assistant"]
    if [(m.content, m.tool_calls) for m in assistants] != [(m.content, m.tool_calls) for m in answers]:
        return [f"{session}: its turns are not those of its last run"]
    calls = [c for m in assistants for c in m.tool_calls]
    results = [json.loads(m.content or "null") for m in checkpoint.messages if m.role == "tool"]
    expected = [{"n": c.arguments["n"], "square": c.arguments["n"] ** 2} for c in calls]
    return [] if results == expected else [f"{session}: results {results} are not its own calls' {expected}"]


@pytest.mark.timeout(pick(150, 900))
def test_a_recreated_session_never_inherits_an_old_run(chaos_fleet: ChaosFleet) -> None:
    fleet, rng = chaos_fleet, random.Random(SEED + 21)
    sessions = [f"re{i:03d}" for i in range(SESSIONS)]
    latest = {s: script(rng, s, 1) for s in sessions}
    for session, answers in latest.items():
        fleet.script(session, answers)
    for _ in range(WORKERS):
        fleet.start_worker()
    fleet.start_reaper(interval_s=0.3)
    runs = dict.fromkeys(sessions, 1)
    next_kill = [time.monotonic() + rng.uniform(1.5, 3.0)]

    def recreate() -> None:
        """Mostly a session with a call under way (the moment that used to leak), sometimes any."""
        candidates = [s for s in sessions if runs[s] < 3]
        busy = [s for s in candidates if (c := fleet.store.checkpoints.load(s)) is not None and c.pending_tool_calls()]
        if not candidates:
            return
        session = rng.choice(busy if busy and rng.random() < 0.8 else candidates)
        fleet.store.checkpoints.delete(session)  # the README's way to start a session over
        runs[session] += 1
        latest[session] = script(rng, session, runs[session])
        fleet.script(session, latest[session])
        fleet.client.enqueue("jobs", f"run {runs[session]} of {session}", session_id=session, require_worker=False)  # workers die meanwhile
        fleet.faults["sessions deleted and enqueued again"] += 1

    def kill() -> None:
        if time.monotonic() >= next_kill[0] and fleet.alive():
            fleet.kill(rng.choice(fleet.alive()))
            next_kill[0] = time.monotonic() + rng.uniform(1.5, 3.0)
        while len(fleet.alive()) < WORKERS:
            fleet.start_worker()

    started = time.monotonic()
    for session in sessions:
        fleet.client.enqueue("jobs", f"run 1 of {session}", session_id=session)
    helpers = Background()
    helpers.every(pick(0.25, 0.1), recreate, "recreate")
    helpers.every(0.05, kill, "kill")
    queue = QueueWatch(fleet, sessions)
    helpers.every(0.5, queue, "queue watch")
    time.sleep(pick(6, 40))
    helpers.stop()  # no more deletes: every session's last run must now finish
    deadline = time.monotonic() + pick(90, 300)
    while time.monotonic() < deadline and any(fleet.client.status(s).status != "finished" for s in sessions):
        time.sleep(0.25)
    while len(fleet.alive()) < WORKERS:
        fleet.start_worker()
    elapsed = time.monotonic() - started

    # The queue's length is a figure here, not a check: the old runs' messages are still on it (each a
    # no-op when it comes), beside the new runs' own.
    violations = [v for s in sessions for v in check(fleet, s, latest[s])] + helpers.errors
    figures = {"runs in all": sum(runs.values()), **queue.figures()}
    record(Row("delete and re-create under load", len(sessions), "sessions", dict(fleet.faults), violations, elapsed, figures))
    assert violations == [], "\n".join(violations[:30]) + "\n" + fleet.worker_logs()[-6000:]
