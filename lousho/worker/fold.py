"""Fold: committed tool results recorded into the checkpoint, in call order (issue #30).

A call's result is committed first (`commit.py`), then folded by whoever holds the session's lease: one save
per result (`fold`), the save of a turn's last result ending the step (the next model turn follows). A call that
is the only one its turn waits for commits, takes the session's lease, saves the fold and ends the step in one
script (`fold_last_result`, commit_fold.lua). Otherwise its task commits and takes the lease (`fold_when_free`)
and folds what is committed (`fold_after_call`), or, when the lease stays busy, leaves the fold to an `advance`
task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lousho.checkpoint import Checkpoint
from lousho.engine import record_tool_result
from lousho.errors import CheckpointConflictError
from lousho.fleet.dispatch import send_advance, turn_number
from lousho.messages import Message, ToolCall
from lousho.run import Run
from lousho.stores.redis_checkpoints import AndThen, SaveSkipped
from lousho.worker.approving import fold_decided_approval
from lousho.worker.begin import Begun, begin_when_free
from lousho.worker.commit import commit_call
from lousho.worker.ending import Ending, queue_key
from lousho.worker.leases import Lease
from lousho.worker.limits import settle_slot
from lousho.worker.running import RunningCall
from lousho.worker.scripts import FleetScripts
from lousho.worker.sub_agents import tell_parent

if TYPE_CHECKING:
    from lousho.worker.steps import SessionSteps

__all__ = ["fold", "fold_after_call", "fold_last_result", "fold_when_free"]


async def fold(
    steps: SessionSteps, run: Run, checkpoint: Checkpoint, results: dict[str, Any] | None = None, may_end: bool = False
) -> Checkpoint:
    """Record committed results in call order (one save each); settle a decided approval.
    `may_end`: the save of a turn's last result ends the step (the next model turn follows)."""
    results = steps.results(checkpoint) if results is None else results
    if checkpoint.status == "awaiting-approval":
        checkpoint = await fold_decided_approval(steps, run, checkpoint, results)
        if checkpoint.status == "awaiting-approval":
            return checkpoint
    for call in checkpoint.pending_tool_calls():
        if call.id not in results:
            break
        folded = record_tool_result(checkpoint, call, results[call.id])
        if may_end and not folded.pending_tool_calls() and folded.status == "in-progress":
            steps.step_end.complete_turn(turn_number(folded))
            steps.step_end.in_next_save()
        checkpoint = await run.save(folded)
        run.latest = checkpoint
    return checkpoint


async def fold_last_result(
    steps: SessionSteps, checkpoint: Checkpoint, call: ToolCall, running: RunningCall, leased: tuple[Message, Lease]
) -> str | None:
    """`call` is the only call its turn waits for, and it has run: commit its result, take the
    session's lease, save the fold and end the step, in one round trip (commit_fold.lua). None
    when the script found something that needs a look: the result is committed, and the usual
    fold (`fold_when_free`) follows. `leased`: the call's result and its lease."""
    result, call_lease = leased
    lease = steps.session_lease()
    run = await steps.make_run(checkpoint, lease)
    folded = record_tool_result(checkpoint, call, None, message=result)  # `result`: its JSON is what commits
    steps.step_end.complete_turn(turn_number(folded))
    ending = steps.step_end.prepare()
    assert steps.step_end.fenced is not None
    steps.step_end.fenced.and_then = _commit_fold(
        steps.scripts, steps.session_id, (running, result.content or "null", call_lease), lease, ending
    )
    try:
        await run.save(folded)
    except (SaveSkipped, CheckpointConflictError):
        steps.step_end.forget()
        return None
    finally:
        call_lease.held = False
        if steps.step_end.done:
            steps.step_end.finish(lease)
    return "turn-enqueued"


async def fold_when_free(steps: SessionSteps, commit: tuple[RunningCall, str, Lease] | None = None) -> str:
    """Commit the call's result (`commit`: the call, its result JSON and its lease), then fold under
    the session's lease; if the lease stays busy, leave the fold to an `advance` task."""
    lease = steps.session_lease()
    begun = None
    if commit is not None:
        running, result_json, call_lease = commit
        run = (running.epoch, running.entry)
        begun = commit_call(steps.scripts, steps.session_id, (running.field, result_json, call_lease), lease, run)
    begun = begun or await begin_when_free(steps.scripts, steps.session_id, lease, steps.runtime.settings.lock_wait_s)
    if begun is None:
        send_advance(steps.runtime.app, steps.session_id, "fold")
        return "fold-deferred"
    return await fold_after_call(steps, lease, begun)


async def fold_after_call(steps: SessionSteps, lease: Lease, begun: Begun) -> str:
    """A tool call's task, holding the session's lease (`commit_call`): fold what is committed and
    send what is next. A late copy of a call whose turn is complete does nothing."""
    try:
        outcome = await _fold_after_call(steps, lease, begun)
    except BaseException:
        steps.step_end.forget()
        raise
    finally:
        steps.step_end.finish(lease)
    settle_slot(steps, outcome)
    tell_parent(steps, outcome)
    return outcome


async def _fold_after_call(steps: SessionSteps, lease: Lease, begun: Begun) -> str:
    checkpoint = begun.checkpoint
    if checkpoint is None:
        return "unknown-session"
    if begun.parked:
        return "parked"
    steps.epoch = steps.step_end.epoch = begun.epoch
    if checkpoint.status == "finished" or not (checkpoint.pending_tool_calls() or checkpoint.approval_id):
        return "nothing-to-fold"
    steps.abort_flag = begun.aborted
    steps.parent_session_id = checkpoint.parent_session_id
    run = await steps.make_run(checkpoint, lease)
    if begun.aborted and checkpoint.status == "in-progress":
        return await steps.abort(run, checkpoint)
    return await steps.dispatch(run, checkpoint, begun.results)


def _commit_fold(
    scripts: FleetScripts, session_id: str, committing: tuple[RunningCall, str, Lease], lease: Lease, ending: Ending
) -> AndThen:
    """commit_fold.lua, to run after a save fenced on `lease` (not taken yet: the script takes it).
    `committing`: the call, its result's JSON and its lease."""
    running, result_json, call_lease = committing
    keys = [
        scripts.keys.dispatched(session_id),
        scripts.keys.results(session_id),
        scripts.keys.attempts(session_id),
        queue_key(scripts, session_id, ending),
        call_lease.key,
        scripts.keys.parked_of(session_id),
        scripts.keys.abort(session_id),
        scripts.keys.epoch(session_id),
        scripts.keys.running_of(session_id),
        *(ending.ack[:2] if ending.ack else ()),
    ]
    args: list[str | int | bytes] = [
        running.field,
        scripts.seal(session_id, running.field, result_json),
        call_lease.token,
        lease.ttl_ms,
        ending.next_message,
        ending.epoch,
        running.entry,
        ending.ack[2] if ending.ack else "",
    ]
    return AndThen(script=scripts.commit_fold, keys=keys, args=args)
