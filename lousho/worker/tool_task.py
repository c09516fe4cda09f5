"""One tool call as its own task: run it (at least once), commit its result (exactly once),
then fold it into the checkpoint and send what comes next."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lousho.abort import RunAborted
from lousho.checkpoint import Checkpoint
from lousho.engine import CANCELLED_RESULT, PlannedCall, abortable, plan_tool_call, run_planned_call
from lousho.errors import PropagatingToolError
from lousho.messages import ToolCall
from lousho.run import Run
from lousho.tools import tool_error
from lousho.worker.dispatch import send_advance
from lousho.worker.heartbeat import heartbeat
from lousho.worker.leases import Lease
from lousho.worker.steps import SessionSteps

__all__ = ["run_tool_call"]


async def run_tool_call(steps: SessionSteps, call_id: str) -> str:
    """The `lousho.tool_call` task: a duplicate finds the result committed, or the call's lease held."""
    checkpoint = steps.runtime.store.checkpoints.load(steps.session_id)
    if checkpoint is None:
        return "unknown-session"
    call = next((c for c in checkpoint.pending_tool_calls() if c.id == call_id), None)
    if call is None:
        return "recorded"
    if not steps.committed(call_id):
        outcome = await _run_once(steps, checkpoint, call)
        if outcome != "ran":
            return outcome
    return await fold_when_free(steps)


async def _run_once(steps: SessionSteps, checkpoint: Checkpoint, call: ToolCall) -> str:
    settings = steps.runtime.settings
    lease = Lease(steps.client, steps.keys.call_lease(steps.session_id, call.id), settings.lease_ttl_ms)
    run = await steps.make_run(checkpoint, lease)
    plan = await _plan(steps, run, checkpoint, call)
    if plan is None:
        return "waiting-for-approval"
    if not lease.acquire():
        return "running-elsewhere"
    try:
        if steps.committed(call.id):  # another copy ran it between our first look and the lease
            return "ran"
        if steps.count_attempt(f"call:{call.id}") > settings.max_attempts:
            result: Any = tool_error(
                "poison",
                f"This call was started {settings.max_attempts} times and never finished (its worker died each time).",
            )
        else:
            async with heartbeat(steps.runtime, steps.session_id, lease, steps.signal):
                result = await _run_abortable(steps, run, plan)
        steps.commit_result(call.id, result)
    except PropagatingToolError as exc:
        steps.park(f"tool call {call.id} raised PropagatingToolError: {exc}")
        return "parked"
    finally:
        lease.release()
    return "ran"


async def _plan(steps: SessionSteps, run: Run, checkpoint: Checkpoint, call: ToolCall) -> PlannedCall | None:
    """Validate the call; a gated call runs only once its approval is decided 'approved'."""
    plan = await plan_tool_call(call, run.agent, run._ctx(call))
    if not plan.needs_approval:
        return plan
    snapshot = steps._approval(checkpoint) if checkpoint.status == "awaiting-approval" else None
    if snapshot is None or snapshot.tool_call.id != call.id or snapshot.status != "approved":
        return None
    return await plan_tool_call(call, run.agent, run._ctx(call), skip_approval=True)


async def _run_abortable(steps: SessionSteps, run: Run, plan: PlannedCall) -> Any:
    """Run the tool; if the session is aborted meanwhile, its signal fires and the call is cancelled."""
    if steps.aborted():
        return CANCELLED_RESULT
    try:
        return await abortable(run_planned_call(plan, run.agent, run._ctx(plan.call)), steps.signal)
    except RunAborted:
        return CANCELLED_RESULT


async def fold_when_free(steps: SessionSteps) -> str:
    """Fold under the session's lease; if it stays busy, leave the fold to an `advance` task."""
    deadline = time.monotonic() + steps.runtime.settings.lock_wait_s
    lease = steps.session_lease()
    while not lease.acquire():
        if time.monotonic() > deadline:
            send_advance(steps.runtime.app, steps.session_id, "fold")
            return "fold-deferred"
        await asyncio.sleep(0.02)
    try:
        checkpoint = steps.runtime.store.checkpoints.load(steps.session_id)
        if checkpoint is None:
            return "unknown-session"
        if checkpoint.status == "finished" or not (checkpoint.pending_tool_calls() or checkpoint.approval_id):
            return "nothing-to-fold"  # a late copy of a call whose turn is already complete
        run = await steps.make_run(checkpoint, lease)
        if steps.aborted() and checkpoint.status == "in-progress":
            return await steps.abort(run, checkpoint)
        return await steps.dispatch(run, checkpoint)
    finally:
        try:
            lease.release()
        finally:
            steps.send_deferred()
