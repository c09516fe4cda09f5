"""Sub-agents on a real fleet (issue #14): real worker processes, the child's tool worker killed by SIGKILL,
the child's approval listed and approved over the `Client`, and Flower showing the child's tasks under the
child's own session id. The rules one by one are in test_sub_agents_driver.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from lousho import Message
from tests.engine.helpers import assert_finished_with_every_result
from tests.fleet.conftest import Fleet, tool_turn
from tests.ops.test_flower import running_flower, wait_for_tasks

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

CHILD = "trip.sub-pay"


def script_trip(fleet: Fleet) -> None:
    fleet.script("trip", [tool_turn(("pay", "pay", {"input": "pay the hotel"})), Message.assistant("Trip paid.")])
    fleet.script(CHILD, [
        tool_turn(("c-work", "work", {"n": 3, "sleep_s": 3.0})),
        tool_turn(("c-charge", "charge", {"amount": 30})),
        Message.assistant("charged 30"),
    ])  # fmt: skip


def test_a_sub_agent_survives_the_sigkill_of_its_tool_worker_and_its_approval_resumes_both(
    fleet: Fleet, tmp_path: Path
) -> None:
    script_trip(fleet)
    for _ in range(2):
        fleet.start_worker()
    fleet.start_reaper()
    with running_flower("tests.fleet.fleet_app", fleet.env, tmp_path / "flower.log") as flower:
        fleet.client.enqueue("planner", "plan my trip", session_id="trip")
        fleet.worker_with_pid(fleet.pid_running("c-work")).kill(signal.SIGKILL)  # the child's tool worker dies
        fleet.start_worker()
        fleet.wait_for(["trip", CHILD], status="awaiting-approval", timeout_s=60)

        [listed] = fleet.client.approvals()
        assert listed.session_id == "trip"  # the parent, named
        assert (listed.waiting.session_id, listed.waiting.tool_call.name) == (CHILD, "charge")
        assert listed.waiting.tool_call.arguments == {"amount": 30}
        fleet.client.resolve_approval(listed.id, approved=True)
        fleet.wait_for(["trip", CHILD], timeout_s=60)

        # Only tasks run after the kill: a prefork worker buffers its task events and flushes them on its
        # event loop's tick, so the SIGKILLed worker's last events (say, the child's turn 1) may never reach
        # Flower. That is Celery's, not a lost step: the counts below check every step ran.
        tasks = wait_for_tasks(flower, {f"{CHILD}/turn/2/tool/c-charge", f"{CHILD}/turn/3"})

    parent, child = fleet.client.checkpoint("trip"), fleet.client.checkpoint(CHILD)
    assert_finished_with_every_result(parent, "trip")
    assert_finished_with_every_result(child, CHILD)
    assert parent is not None and [m.result() for m in parent.messages if m.role == "tool"] == ["charged 30"]
    assert fleet.violations() == []
    runs = fleet.counts("runs")
    assert runs == {"c-work": 2, "c-charge": 1}  # the killed call ran again (same tool_call_id); nothing else did
    assert set(fleet.counts("asked").values()) == {1}  # no model turn of either session was asked twice
    assert tasks[f"{CHILD}/turn/2/tool/c-charge"]["args"] == f"session={CHILD} turn=2 call=c-charge tool=charge"
    assert tasks[f"{CHILD}/turn/3"]["name"] == "lousho.model_turn"
