"""Approvals and aborts on the fleet: decided from a web app's `Client` in another process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lousho import Message
from tests.engine.helpers import assert_valid_transcript
from tests.fleet.conftest import ROOT, Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

RESOLVE = """
import sys
from lousho.scheduler import Client
from lousho.stores.codec import PayloadCodec
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url
url, prefix, queue, approval_id, broker = sys.argv[1:6]
store = RedisStore(url, prefix=prefix, codec=PayloadCodec.from_env())  # the fleet's codec, when it runs with one
client = Client(broker=broker or broker_url(url), store=store, settings=FleetSettings(queue=queue))
client.resolve_approval(approval_id, approved=True, note="approved from another process")
"""


def test_an_approval_is_resolved_from_another_process_and_finishes_on_another_worker(fleet: Fleet) -> None:
    fleet.script("pay", [
        tool_turn(("w1", "work", {"n": 1}), ("c1", "charge", {"amount": 30}), ("w2", "work", {"n": 2})),
        Message.assistant("paid"),
    ])
    first = fleet.start_worker("first")
    fleet.client.enqueue("jobs", "pay please", session_id="pay")
    fleet.wait_for(["pay"], status="awaiting-approval", timeout_s=60)
    first.stop()
    pending = fleet.client.approvals("pay")
    assert [a.tool_call.id for a in pending] == ["c1"]
    assert [c.id for c in pending[0].remaining_tool_calls or []] == ["w2"]

    fleet.start_worker("second")
    broker = fleet.env.get("LOUSHO_TEST_FLEET_BROKER", "")  # RabbitMQ's, in tests/topologies (issue #18)
    subprocess.run([sys.executable, "-c", RESOLVE, fleet.env["LOUSHO_TEST_FLEET_REDIS"], fleet.prefix, fleet.queue, pending[0].id,
                    broker], check=True, cwd=ROOT, timeout=60)
    fleet.wait_for(["pay"], timeout_s=60)

    checkpoint = fleet.client.checkpoint("pay")
    assert checkpoint is not None
    assert_valid_transcript(checkpoint.messages)
    results = {m.tool_call_id: m.result() for m in checkpoint.messages if m.role == "tool"}
    assert results["c1"] == {"charged": 30, "idempotency_key": "c1"}
    assert fleet.counts("runs") == {"w1": 1, "c1": 1, "w2": 1}


def test_a_rejection_on_the_fleet_records_the_note_and_the_run_goes_on(fleet: Fleet) -> None:
    fleet.script("nope", [tool_turn(("c1", "charge", {"amount": 999})), Message.assistant("not charged")])
    fleet.start_worker()
    fleet.client.enqueue("jobs", "charge", session_id="nope")
    fleet.wait_for(["nope"], status="awaiting-approval", timeout_s=60)

    approval = fleet.client.approvals("nope")[0]
    fleet.client.resolve_approval(approval.id, approved=False, note="too much")
    fleet.wait_for(["nope"], timeout_s=60)

    checkpoint = fleet.client.checkpoint("nope")
    assert checkpoint is not None
    assert checkpoint.messages[-2].result() == {"error": "rejected", "note": "too much"}
    assert "c1" not in fleet.counts("runs")


@pytest.mark.parametrize("approved", [True, False])
def test_a_decision_on_the_approval_of_a_pause_a_kill_cut_short_is_applied(fleet: Fleet, approved: bool) -> None:
    """A worker SIGKILLed between a pause's two writes (the approval stored, the paused checkpoint not): the
    human decides the approval it listed; the step run again pauses on the same approval and applies the
    decision. It used to write a second approval for the call and wait on it for ever (issue #33's chaos run)."""
    fleet.script("cut", [tool_turn(("w1", "work", {"n": 1}), ("c1", "charge", {"amount": 30})), Message.assistant("done")])
    fleet.kill_on("approval-saved:cut")
    first = fleet.start_worker("first")
    fleet.start_reaper()
    fleet.client.enqueue("jobs", "pay please", session_id="cut")
    first.process.wait(timeout=60)  # it killed itself right after storing the approval
    assert fleet.client.status("cut").status == "in-progress"  # the pause was never saved
    [listed] = fleet.client.approvals("cut")
    assert listed.tool_call.id == "c1"

    fleet.client.resolve_approval(listed.id, approved=approved, note="decided while its worker was dead")
    fleet.start_worker("second")
    fleet.wait_for(["cut"], timeout_s=60)

    checkpoint = fleet.client.checkpoint("cut")
    assert checkpoint is not None
    assert_valid_transcript(checkpoint.messages)
    paid = next(m.result() for m in checkpoint.messages if m.tool_call_id == "c1")
    if approved:
        assert paid == {"charged": 30, "idempotency_key": "c1"}
        assert fleet.counts("runs") == {"w1": 1, "c1": 1}
    else:
        assert paid == {"error": "rejected", "note": "decided while its worker was dead"}
        assert fleet.counts("runs") == {"w1": 1}
    assert list(fleet.client.approvals("cut")) == []
    decided = fleet.store.approvals.load(listed.id)
    assert decided is not None and decided.applied_at is not None


def test_a_decision_made_between_a_pause_s_two_writes_is_applied(fleet: Fleet) -> None:
    """The human decides as soon as the approval is listed, before the paused checkpoint is saved: the decision's
    wake-up finds the pausing step's lease held ('busy'), and the pausing save takes the session out of the
    in-flight index the decision put it back in. The pausing step applies the decision itself."""
    fleet.script("race", [tool_turn(("c1", "charge", {"amount": 5})), Message.assistant("done")])
    fleet.redis.sadd(fleet.key("hold-pause"), "race")  # the pause waits after the approval's write
    fleet.start_worker("first")
    fleet.start_worker("second")
    fleet.client.enqueue("jobs", "pay please", session_id="race")
    deadline = time.monotonic() + 60
    while not (listed := list(fleet.client.approvals("race"))) and time.monotonic() < deadline:
        time.sleep(0.05)
    fleet.client.resolve_approval(listed[0].id, approved=True)
    while "'busy'" not in "".join(w.log() for w in fleet.workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "'busy'" in "".join(w.log() for w in fleet.workers)  # the wake-up came while the pause held the lease
    fleet.redis.set(fleet.key("woken:race"), 1)

    fleet.wait_for(["race"], timeout_s=30)
    assert fleet.counts("runs") == {"c1": 1}


def test_abort_cancels_the_running_call_and_new_input_continues_the_run(fleet: Fleet) -> None:
    fleet.script("ab", [
        tool_turn(("slow", "work", {"n": 1, "sleep_s": 30}), ("next", "work", {"n": 2})),
        Message.assistant("redirected"),
    ])
    fleet.start_worker()
    fleet.start_worker()
    fleet.client.enqueue("jobs", "start", session_id="ab")
    fleet.pid_running("slow")

    fleet.client.abort("ab")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        checkpoint = fleet.client.checkpoint("ab")
        if checkpoint is not None and not checkpoint.pending_tool_calls():
            break
        time.sleep(0.1)
    assert checkpoint is not None and checkpoint.status == "in-progress"
    results = {m.tool_call_id: m.result() for m in checkpoint.messages if m.role == "tool"}
    assert results["slow"]["error"] == "cancelled"
    assert fleet.client.status("ab").aborted

    fleet.client.enqueue("jobs", "never mind, stop there", session_id="ab")
    fleet.wait_for(["ab"], timeout_s=60)
    final = fleet.client.checkpoint("ab")
    assert final is not None
    assert_valid_transcript(final.messages)
    assert [m.role for m in final.messages[-2:]] == ["user", "assistant"]
