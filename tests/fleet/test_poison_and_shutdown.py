"""Poison is a call that kills its worker, not a call whose worker was shut down around it (issue #21)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from lousho import Message
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def wait_for_runs(fleet: Fleet, call_id: str, runs: int, timeout_s: float = 30.0) -> int:
    """The pid of the worker that started `call_id` for the `runs`-th time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fleet.counts("runs").get(call_id, 0) >= runs:
            return fleet.pid_running(call_id)
        time.sleep(0.05)
    raise AssertionError(f"{call_id} did not start {runs} times")


def test_a_call_cut_short_by_its_workers_shutdown_is_not_poison(fleet: Fleet) -> None:
    """Three deploys in a row each stop the worker in the middle of the same call (SIGTERM, then
    SIGKILL after a short grace): with max_attempts=3 the call still gets its real result."""
    fleet.script("deploys", [tool_turn(("d-1", "work", {"n": 3, "sleep_s": 4.0})), Message.assistant("done")])
    fleet.start_reaper()
    fleet.start_worker()
    fleet.client.enqueue("jobs", "go", session_id="deploys")
    for deploy in range(1, 4):
        worker = fleet.worker_with_pid(wait_for_runs(fleet, "d-1", deploy))
        os.kill(worker.pid, signal.SIGTERM)
        time.sleep(0.5)
        worker.kill(signal.SIGKILL)
        fleet.start_worker()
    fleet.wait_for(["deploys"], timeout_s=90)

    checkpoint = fleet.client.checkpoint("deploys")
    assert checkpoint is not None
    assert [m.content for m in checkpoint.messages if m.role == "tool"] == ['{"n": 3, "square": 9}']
    assert fleet.counts("runs")["d-1"] == 4


def test_calls_whose_workers_die_together_are_not_poison(fleet: Fleet) -> None:
    """Two sessions' calls on two workers of one host, both killed at the same moment three times (a node
    or a deploy that does not wait): neither call killed its worker, and both get their real results."""
    for session, n in (("node-a", 2), ("node-b", 5)):
        fleet.script(session, [tool_turn((f"{session}-1", "work", {"n": n, "sleep_s": 4.0})), Message.assistant("done")])
    fleet.start_reaper()
    fleet.start_worker()
    fleet.start_worker()
    fleet.client.enqueue("jobs", "go", session_id="node-a")
    fleet.client.enqueue("jobs", "go", session_id="node-b")
    for death in range(1, 4):
        pids = {wait_for_runs(fleet, f"{s}-1", death) for s in ("node-a", "node-b")}
        assert len(pids) == 2, "both calls on one worker: the test needs one each"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            fleet.worker_with_pid(pid).kill(signal.SIGKILL)
        fleet.start_worker()
        fleet.start_worker()
    fleet.wait_for(["node-a", "node-b"], timeout_s=90)

    for session, n in (("node-a", 2), ("node-b", 5)):
        checkpoint = fleet.client.checkpoint(session)
        assert checkpoint is not None
        assert [m.content for m in checkpoint.messages if m.role == "tool"] == [f'{{"n": {n}, "square": {n * n}}}']
        assert fleet.counts("runs")[f"{session}-1"] == 4
