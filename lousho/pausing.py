"""Approval pauses of a run, in process or on the fleet: pausing on a gated call (or a sub-agent's
approval), and checking that a decision may be applied (reference: 'Approvals in the middle of a
tool batch'). Recording the decision is the loop's (`Run.apply_decision`, the fleet's fold)."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from lousho.approvals import (
    ApprovalKind,
    ApprovalSnapshot,
    ApprovalStore,
    approval_chain,
    approval_snapshot,
    check_call_unchanged,
)
from lousho.checkpoint import Checkpoint, CheckpointStore, maybe_await
from lousho.errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError, CorruptApprovalError, SDKError
from lousho.events import ApprovalRequestedEvent
from lousho.messages import ToolCall
from lousho.run_context import RunContext, load_stored
from lousho.tools import tool_error

__all__ = [
    "NOT_RUN",
    "check_stored_calls_unchanged",
    "pause_for_approval",
    "prepare_resume",
    "rejection",
]

NOT_RUN = tool_error("not run", "This call came after one that needed approval and was not run.")


def rejection(snapshot: ApprovalSnapshot) -> dict[str, Any]:
    """The result of a call a human rejected: the tool error the model reads."""
    return tool_error("rejected", snapshot.note or "A human rejected this call; it was not run.")


async def pause_for_approval(
    run: RunContext,
    checkpoint: Checkpoint,
    call: ToolCall,
    child_approval_id: str | None,
    kind: ApprovalKind = "approval",
) -> Checkpoint:
    """Save the approval first, then the 'awaiting-approval' checkpoint that points at it.

    In that order, a crash in between leaves an unreferenced approval, never a session
    waiting on an approval that does not exist. A sub-agent's pause keeps its approval id,
    with the sub-agent's snapshot nested in this run's. `kind='interrupted'`: the call may
    have run already (`on_interrupted='ask'`, issue #17)."""
    store = run.approval_store
    assert store is not None
    child = await maybe_await(store.load(child_approval_id)) if child_approval_id else None
    if child is not None and child.session_id == run.session_id:
        child = child.child  # this run's own earlier pause on it, whose checkpoint was never saved (a crash)
    earlier = None
    if child_approval_id:
        approval_id = child_approval_id
    else:
        approval_id, earlier = await _approval_of_this_pause(store, run.session_id, checkpoint, call, kind)
    paused = run.stamp(checkpoint, status="awaiting-approval", approval_id=approval_id)
    if earlier is None:
        snapshot = approval_snapshot(
            paused, call, session_id=run.session_id, max_steps=run.max_steps, child=child, kind=kind
        )
        await maybe_await(store.save(snapshot))
    paused = await run.write(paused)
    await run.emit(ApprovalRequestedEvent(approval_id=approval_id, call=child.tool_call if child else call))
    return paused


async def _approval_of_this_pause(
    store: ApprovalStore, session_id: str | None, checkpoint: Checkpoint, call: ToolCall, kind: ApprovalKind
) -> tuple[str, ApprovalSnapshot | None]:
    """The id of the approval a session pausing at `checkpoint` on `call` waits on, and that approval when
    this same pause stored it before (the process died before the paused checkpoint was saved).

    The id is derived from the pause, so the pause run again after such a crash finds the approval a human
    may have seen, and decided, meanwhile, instead of writing a second one for the same call: the decision
    stands (it was lost before; found by the chaos suite, issue #33). An approval under that id of another
    pause (another transcript, applied already, unreadable) is left alone and a fresh id is used."""
    if session_id is None:  # nothing ties two runs without a session together
        return f"appr_{uuid.uuid4().hex}", None
    pause = [session_id, checkpoint.version, call.id, kind]
    approval_id = "appr_" + hashlib.sha256(json.dumps(pause).encode()).hexdigest()[:32]
    try:
        earlier: ApprovalSnapshot | None = await maybe_await(store.load(approval_id))
    except CorruptApprovalError:
        return f"appr_{uuid.uuid4().hex}", None
    if earlier is None:
        return approval_id, None
    same_pause = (
        earlier.applied_at is None
        and earlier.session_id == session_id
        and earlier.kind == kind
        and earlier.tool_call == call
        and earlier.checkpoint.version == checkpoint.version + 1
        and earlier.checkpoint.messages == checkpoint.messages
    )
    return (approval_id, earlier) if same_pause else (f"appr_{uuid.uuid4().hex}", None)


async def prepare_resume(
    run: RunContext, snapshot: ApprovalSnapshot, checkpoint: Checkpoint, source: ApprovalStore | None
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
        check_call_unchanged(snapshot, checkpoint)
        run.check_tools_exist([snapshot.tool_call], None)
    except SDKError:
        await reopen()
        raise
    await run.check_drift(snapshot.fingerprint, on_error=reopen)
    return checkpoint.model_copy(update={"status": "in-progress", "approval_id": None})


# -- approvals bound to the call shown (issue #17) ------------------------------------------------


async def check_stored_calls_unchanged(
    approvals: ApprovalStore, checkpoints: CheckpointStore | None, approval_id: str
) -> None:
    """`check_calls_unchanged` for the stored approval `approval_id`, on stores that may be async; an
    unknown id passes (the decision itself then raises `ApprovalNotFoundError`)."""
    snapshot: ApprovalSnapshot | None = await maybe_await(approvals.load(approval_id))
    for part in approval_chain(snapshot) if snapshot is not None else ():
        check_call_unchanged(part, await load_stored(checkpoints, part.session_id))
