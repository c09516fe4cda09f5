"""Approval pauses of an in-process run: pausing on a gated call (or a sub-agent's approval),
and applying a decision to continue (reference: 'Approvals in the middle of a tool batch')."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from lousho.approvals import ApprovalSnapshot, ApprovalStore, utc_now
from lousho.checkpoint import Checkpoint, maybe_await
from lousho.engine import PlannedCall, plan_tool_call
from lousho.errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError, SDKError
from lousho.events import ApprovalRequestedEvent
from lousho.messages import ToolCall
from lousho.subagents import resume_sub_agent
from lousho.tools import tool_error

if TYPE_CHECKING:
    from lousho.run import Run

__all__ = ["pause_for_approval", "prepare_resume", "record_decision"]

NOT_RUN = tool_error("not run", "This call came after one that needed approval and was not run.")


async def pause_for_approval(
    run: Run, checkpoint: Checkpoint, call: ToolCall, child_approval_id: str | None
) -> Checkpoint:
    """Save the approval first, then the 'awaiting-approval' checkpoint that points at it.

    In that order, a crash in between leaves an unreferenced approval, never a session
    waiting on an approval that does not exist. A sub-agent's pause keeps its approval id,
    with the sub-agent's snapshot nested in this run's."""
    store = run.approval_store
    assert store is not None
    turn = checkpoint.last_tool_turn()
    calls = turn[1].tool_calls if turn else []
    remaining = calls[[c.id for c in calls].index(call.id) + 1 :]
    child = await maybe_await(store.load(child_approval_id)) if child_approval_id else None
    approval_id = child_approval_id or f"appr_{uuid.uuid4().hex}"
    paused = run._stamp(checkpoint, status="awaiting-approval", approval_id=approval_id)
    snapshot = ApprovalSnapshot(
        id=approval_id,
        session_id=run.session_id,
        agent_name=run.agent.name,
        tool_call=call,
        remaining_tool_calls=remaining,
        checkpoint=paused,
        fingerprint=paused.fingerprint,
        max_steps=run.max_steps,
        child=child,
    )
    await maybe_await(store.save(snapshot))
    paused = await run._write(paused)
    await run.emit(ApprovalRequestedEvent(approval_id=approval_id, call=child.tool_call if child else call))
    return paused


async def prepare_resume(
    run: Run, snapshot: ApprovalSnapshot, checkpoint: Checkpoint, source: ApprovalStore | None
) -> Checkpoint:
    """Check, before anything runs, that this decision may be applied by this agent."""
    if checkpoint.status != "awaiting-approval" or checkpoint.approval_id != snapshot.id:
        raise ApprovalNotFoundError(
            f"approval {snapshot.id!r} is not what session {snapshot.session_id!r} waits on "
            f"(it is {checkpoint.status!r}, approval {checkpoint.approval_id!r}); it was applied already or superseded"
        )
    if snapshot.applied_at is not None:
        raise ApprovalAlreadyResolvedError(f"approval {snapshot.id!r} was already applied at {snapshot.applied_at}")

    async def reopen() -> None:
        if source is not None:
            await maybe_await(source.reopen(snapshot.id))

    try:
        run.check_tools_exist([snapshot.tool_call], None)
    except SDKError:
        await reopen()
        raise
    await run.check_drift(snapshot.fingerprint, on_error=reopen)
    return checkpoint.model_copy(update={"status": "in-progress", "approval_id": None})


async def record_decision(
    run: Run, checkpoint: Checkpoint, snapshot: ApprovalSnapshot, source: ApprovalStore | None
) -> Checkpoint:
    """Record the paused call's one result; then mark the approval applied."""
    call = snapshot.tool_call
    tool = run.agent.tools.get(call.name)
    if snapshot.child is not None and tool is not None and tool.sub_agent is not None:
        child = await resume_sub_agent(run, call, tool.sub_agent, snapshot)
        checkpoint = await run.record_sub_agent_result(checkpoint, call, child)
    elif snapshot.status == "approved":
        plan = await plan_tool_call(call, run.agent, run._ctx(call), skip_approval=True)
        checkpoint = await run.run_calls(checkpoint, [plan])
    else:
        rejection = tool_error("rejected", snapshot.note or "A human rejected this call; it was not run.")
        checkpoint = await run.run_calls(checkpoint, [PlannedCall(call, result=rejection, preset=True)])
    if source is not None:
        await maybe_await(source.save(snapshot.model_copy(update={"applied_at": utc_now()})))
    if snapshot.remaining_tool_calls is None and checkpoint.status == "in-progress":
        # A snapshot from before `remaining_tool_calls` existed: the calls after the paused one
        # do not run, but each gets a result so the transcript stays valid (reference: compatibility).
        skipped = [PlannedCall(c, result=NOT_RUN, preset=True) for c in checkpoint.pending_tool_calls()]
        checkpoint = await run.run_calls(checkpoint, skipped)
    return checkpoint
