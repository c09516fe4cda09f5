"""The fleet runs the same engine as the in-process path, one Celery task per model turn and per tool call: a job
on real worker processes. The rules step by step (duplicates, zombies, folding order) are in test_driver.py."""

from __future__ import annotations

import pytest

from lousho import Message
from tests.engine.helpers import assert_valid_transcript
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def job_script() -> list[Message]:
    return [
        tool_turn(("a", "work", {"n": 2}), ("b", "work", {"n": 3, "sleep_s": 0.05}), ("c", "work", {"n": 4})),
        tool_turn(("d", "work", {"n": 5})),
        Message.assistant("all done"),
    ]


def test_a_job_runs_to_the_end_on_the_fleet(fleet: Fleet) -> None:
    fleet.start_worker()
    fleet.script("job-1", job_script())

    fleet.client.enqueue("jobs", "do the work", session_id="job-1")
    fleet.wait_for(["job-1"], timeout_s=60)

    checkpoint = fleet.client.checkpoint("job-1")
    assert checkpoint is not None
    assert_valid_transcript(checkpoint.messages)
    assert [m.tool_call_id for m in checkpoint.messages if m.role == "tool"] == ["a", "b", "c", "d"]
    assert fleet.counts("runs") == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert fleet.counts("asked") == {"job-1:1": 1, "job-1:2": 1, "job-1:3": 1}


def test_two_workers_without_a_reaper_hand_each_step_on_without_stalling(fleet: Fleet) -> None:
    """The next turn is sent after the lease is released: an idle worker must not find it held and drop it."""
    sessions = [f"hand-{i}" for i in range(5)]
    for session in sessions:
        fleet.script(session, [tool_turn((f"{session}-a", "work", {"n": 1})), tool_turn((f"{session}-b", "work", {"n": 2})), Message.assistant("done")])
    fleet.start_worker()
    fleet.start_worker()

    for session in sessions:
        fleet.client.enqueue("jobs", "go", session_id=session)
    fleet.wait_for(sessions, timeout_s=20)  # no reaper runs here: nothing would rescue a dropped turn
