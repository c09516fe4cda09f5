"""A decided approval on the fleet: sending the approved call, committing a rejection, and folding
the call's result into the paused checkpoint (reference: 'Approvals in the middle of a tool batch').

A sub-agent's approval is stored once, as the parent's snapshot with the sub-agent's nested in it
(`pausing.py`); the decision is recorded on it, and each session of the chain applies it to its own
part (`ApprovalSnapshot.for_session`): the parent goes back to waiting on its sub-agent call, the
sub-agent runs (or rejects) the call that needed the approval (issue #14).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lousho.approvals import ApprovalKind, ApprovalSnapshot, utc_now
from lousho.checkpoint import Checkpoint
from lousho.engine import record_tool_result
from lousho.interruptions import decided_interrupted_result
from lousho.messages import ToolCall
from lousho.pausing import NOT_RUN, prepare_resume, rejection
from lousho.run import Run

if TYPE_CHECKING:
    from lousho.worker.steps import SessionSteps

__all__ = ["apply_decided_approval", "fold_decided_approval", "mark_applied", "pause_on_call"]


async def pause_on_call(
    steps: SessionSteps, run: Run, checkpoint: Checkpoint, call: ToolCall, kind: ApprovalKind = "approval"
) -> str:
    """Pause on `call`'s approval. A decision made before the paused checkpoint was saved is applied now:
    its wake-up found this step's lease busy, and the pausing save took the session out of the in-flight
    index the decision had put it back in; or the pause ran again after a crash and found the approval the
    crashed step stored, decided meanwhile (`pausing._approval_of_this_pause`; issue #33's chaos run)."""
    paused = await run.pause(checkpoint, call, kind=kind)
    return await apply_decided_approval(steps, run, paused)


async def apply_decided_approval(steps: SessionSteps, run: Run, checkpoint: Checkpoint) -> str:
    """A decided approval: commit a rejection, or send the approved call to run as its own task."""
    snapshot = steps.approval(checkpoint)
    if snapshot is None or snapshot.status == "pending" or snapshot.applied_at is not None:
        return "awaiting-approval"
    resumed = await prepare_resume(run, snapshot, checkpoint, steps.runtime.store.approvals)  # drift, tools
    decided = {"approval_id": snapshot.id, "approved": snapshot.status == "approved", "note": snapshot.note}
    steps.events.add("approval-decided", data=decided)  # issue #34
    if snapshot.child is not None:
        # A sub-agent's approval: this session goes back to waiting on its sub-agent call, and the
        # sub-agent applies the decision to its own call (sub_agents.py).
        return await steps.dispatch(run, await run.save(resumed))
    call = snapshot.tool_call
    if snapshot.kind == "interrupted":  # run it again, or commit what the human said it did (issue #17)
        rerun, result = decided_interrupted_result(snapshot)
        if not rerun:
            steps.commit_result(checkpoint, call.id, result)
            return await steps.dispatch(run, checkpoint)
    elif snapshot.status == "rejected":
        steps.commit_result(checkpoint, call.id, rejection(snapshot))
        return await steps.dispatch(run, checkpoint)
    steps.send_tools(checkpoint, [call], redispatch=True)
    return "approved-call-dispatched"


async def fold_decided_approval(
    steps: SessionSteps, run: Run, checkpoint: Checkpoint, results: dict[str, Any]
) -> Checkpoint:
    """Record the approved (or rejected) call's committed result: the session is 'in-progress' again."""
    snapshot = steps.approval(checkpoint)
    # Pending: a result committed under it is not the human's (an 'ask' call's own late one; issue #17).
    if snapshot is None or snapshot.status == "pending" or snapshot.tool_call.id not in results:
        return checkpoint
    resumed = checkpoint.model_copy(update={"status": "in-progress", "approval_id": None})
    resumed = await run.save(record_tool_result(resumed, snapshot.tool_call, results[snapshot.tool_call.id]))
    mark_applied(steps, snapshot.id)
    if snapshot.remaining_tool_calls is None:
        for call in resumed.pending_tool_calls():  # an old snapshot: the rest does not run (reference)
            steps.commit_result(resumed, call.id, NOT_RUN)
    return resumed


def mark_applied(steps: SessionSteps, approval_id: str) -> None:
    """The decision is recorded in the run: mark the stored snapshot (the outermost, for a sub-agent's)."""
    stored: ApprovalSnapshot | None = steps.runtime.store.approvals.load(approval_id)
    if stored is not None:
        steps.runtime.store.approvals.save(stored.model_copy(update={"applied_at": utc_now()}))
