"""One tool call as its own task: run it (at least once), commit its result (exactly once),
then fold it into the checkpoint and send what comes next.

Round trips (issue #9): `begin.begin_call` (the checkpoint, the abort flag, committed already? the
call's lease, its start counted), the tool, then, when the call was the only one its turn waited
for, `fold.fold_last_result` (the result committed, the leases, the fold saved, the step ended: one
round trip); otherwise `fold.fold_when_free`: `commit.commit_call` (the result, the call's lease
released, the session's lease taken and the checkpoint read) and the fold's save, which ends the step.
"""

from __future__ import annotations

from typing import Any

from lousho.abort import RunAborted
from lousho.checkpoint import Checkpoint
from lousho.engine import CANCELLED_RESULT, PlannedCall, abortable, plan_tool_call, run_planned_call
from lousho.errors import PropagatingToolError
from lousho.fleet.dispatch import tool_turn
from lousho.fleet.keys import result_field
from lousho.messages import Message, ToolCall
from lousho.run import Run
from lousho.telemetry.counters import FleetCounters
from lousho.tools import interrupted_result, tool_error
from lousho.worker.begin import CallBegun, CallState, begin_call, undo_call
from lousho.worker.fold import fold_last_result, fold_when_free
from lousho.worker.heartbeat import heartbeat
from lousho.worker.interrupted import interrupted_plan, mark_interrupted
from lousho.worker.leases import Lease
from lousho.worker.running import RunningCall, running_calls
from lousho.worker.steps import SessionSteps

__all__ = ["run_tool_call"]

NOT_STARTED, CUT_SHORT = object(), object()
"""An 'ask' tool's call stopped by an abort before it began, or while it ran: no result is committed."""


async def run_tool_call(steps: SessionSteps, call_id: str, turn: int) -> str:
    """The `lousho.tool_call` task for call `call_id` of model turn `turn`: a duplicate finds the
    result committed, or the call's lease held; a copy from an earlier turn finds its turn over."""
    if turn <= 0:  # a message from before the turn was sent along: read it off the checkpoint
        checkpoint = steps.runtime.store.checkpoints.load(steps.session_id)
        turn = tool_turn(checkpoint) if checkpoint is not None else 0
    running = RunningCall(steps.keys, steps.session_id, result_field(turn, call_id))
    call_lease = Lease(
        steps.client, steps.keys.call_lease(steps.session_id, call_id), steps.runtime.settings.lease_ttl_ms
    )
    begun = begin_call(steps.scripts, steps.session_id, running.field, call_lease, running.entry)
    steps.epoch = steps.step_end.epoch = running.epoch = begun.epoch
    checkpoint = begun.checkpoint
    pending = checkpoint.pending_tool_calls() if checkpoint is not None and tool_turn(checkpoint) == turn else []
    call = next((c for c in pending if c.id == call_id), None)
    if checkpoint is None or call is None:
        undo_call(steps.scripts, steps.session_id, running.field, call_lease, (running.epoch, running.entry))
        return "unknown-session" if checkpoint is None else "recorded"
    if begun.state is CallState.BUSY:
        return "running-elsewhere"
    if begun.state is CallState.COMMITTED:  # by an earlier copy: only the fold may be left to do
        return await fold_when_free(steps)
    steps.abort_flag = begun.aborted
    try:
        run = await steps.make_run(checkpoint, call_lease)
        interrupted = interrupted_plan(steps, run, checkpoint, call, begun)  # issue #17
        if interrupted == "ask":  # not run again: the fold pauses the session on it
            mark_interrupted(steps, running.field)
            undo_call(steps.scripts, steps.session_id, running.field, call_lease, (running.epoch, running.entry))
            return await fold_when_free(steps)
        plan = interrupted if isinstance(interrupted, PlannedCall) else await _plan(steps, run, checkpoint, call)
        if plan is None:
            undo_call(steps.scripts, steps.session_id, running.field, call_lease, (running.epoch, running.entry))
            return "waiting-for-approval"
        result = await _run_started(steps, run, plan, (running, call_lease), begun)
    except BaseException as exc:
        call_lease.release()
        steps.scripts.leave_running(running.entry)
        if not isinstance(exc, PropagatingToolError):
            raise
        steps.park(f"tool call {call.id} raised PropagatingToolError: {exc}")
        return "parked"
    if result is NOT_STARTED or result is CUT_SHORT:  # an 'ask' call stopped by an abort: no result (issue #17)
        if result is NOT_STARTED:
            undo_call(steps.scripts, steps.session_id, running.field, call_lease, (running.epoch, running.entry))
        else:  # it may have run: its counted start stays, for the abort's step to pause on it
            call_lease.release()
            steps.scripts.leave_running(running.entry)
        return "aborted"
    message = Message.tool_result(call, result)  # the result's one JSON encode: committed and recorded (issue #30)
    result_json = message.content or "null"
    if checkpoint.status == "in-progress" and [c.id for c in pending] == [call.id] and not steps.aborted():
        folded = await fold_last_result(steps, checkpoint, call, running, (message, call_lease))
        return folded or await fold_when_free(steps)
    return await fold_when_free(steps, (running, result_json, call_lease))


async def _run_started(
    steps: SessionSteps, run: Run, plan: PlannedCall, leased: tuple[RunningCall, Lease], begun: CallBegun
) -> Any:
    """The call's result: the tool's, or a poison error once its worker died `max_attempts` times
    while it ran alone (or three times that, counting the deaths it shared with other sessions' runs:
    `running.py`). While it runs, a shutdown of this worker takes its start back, unless its tool is not
    'rerun' (issue #17)."""
    running, call_lease = leased
    max_attempts = steps.runtime.settings.max_attempts
    if begun.starts > max_attempts or begun.starts + begun.shared > 3 * max_attempts:
        FleetCounters.of(steps.runtime.store).add("poison_results")  # lousho_poison_results_total (issue #19)
        return tool_error(
            "poison", f"This call was started {max_attempts} times and never finished (its worker died each time)."
        )
    running.keeps_start = _policy(run, plan) != "rerun"
    running_calls.add(running)
    told = {"call_id": plan.call.id, "name": plan.call.name}
    steps.events.add("tool-call-started", soon=True, data={**told, "arguments": plan.call.arguments})  # issue #34
    try:
        async with heartbeat(steps.runtime, steps.session_id, call_lease, steps.signal, running.entry):
            result = await _run_abortable(steps, run, plan)
    finally:
        running_calls.discard(running)
    if result is not NOT_STARTED and result is not CUT_SHORT:
        steps.events.add("tool-call-finished", data={**told, "result": result})
    return result


async def _plan(steps: SessionSteps, run: Run, checkpoint: Checkpoint, call: ToolCall) -> PlannedCall | None:
    """Validate the call; a gated call runs only once its approval is decided 'approved'."""
    plan = await plan_tool_call(call, run.agent, run.tool_context(call))
    if not plan.needs_approval:
        return plan
    snapshot = steps.approval(checkpoint) if checkpoint.status == "awaiting-approval" else None
    if snapshot is None or snapshot.tool_call.id != call.id or snapshot.status != "approved":
        return None
    return await plan_tool_call(call, run.agent, run.tool_context(call), skip_approval=True)


async def _run_abortable(steps: SessionSteps, run: Run, plan: PlannedCall) -> Any:
    """Run the tool; if the session is aborted meanwhile, its signal fires and the call is cancelled.
    A call cut short of a tool that is not 'rerun' may have run (issue #17): a 'fail' tool's gets the
    interrupted error, an 'ask' tool's no result (`CUT_SHORT`; `NOT_STARTED` if it never began)."""
    policy = _policy(run, plan)
    if steps.aborted():
        return NOT_STARTED if policy == "ask" else CANCELLED_RESULT
    try:
        result = await abortable(run_planned_call(plan, run.agent, run.tool_context(plan.call)), steps.signal)
    except RunAborted:
        result = CANCELLED_RESULT
    if result is CANCELLED_RESULT and policy != "rerun":
        return CUT_SHORT if policy == "ask" else interrupted_result(plan.call.name)
    return result


def _policy(run: Run, plan: PlannedCall) -> str:
    """The call's `on_interrupted`: its tool's, or 'rerun' for a result preset by a human (issue #17)."""
    tool = run.agent.tools.get(plan.call.name)
    return "rerun" if plan.preset or tool is None else tool.on_interrupted
