"""`on_interrupted` on the fleet (issue #17): a tool call started again after a start that never
committed a result (its worker died in the middle: lua/call_begin.lua counts every start) may have
run. A 'fail' tool's call records `interrupted_result` instead of running; an 'ask' tool's call marks
itself interrupted in the session's attempts hash (`interrupted:<turn>:<call id>`), takes its start
back and leaves the fold to pause the session on an interrupted-call approval (`dispatch`). Once a
human decided it, 'rerun' sends the call again and its task runs it; 'record' and 'fail' commit the
result (`worker/approving.py`). See lousho/interruptions.py for the in-process side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from lousho.approvals import ApprovalSnapshot
from lousho.checkpoint import Checkpoint
from lousho.engine import CANCELLED_RESULT, PlannedCall
from lousho.fleet.dispatch import tool_turn
from lousho.fleet.keys import INTERRUPTED, result_field
from lousho.interruptions import interruption_of
from lousho.messages import ToolCall
from lousho.run import Run
from lousho.stores.redis_common import redis_errors
from lousho.tools import interrupted_result
from lousho.worker.begin import CallBegun

if TYPE_CHECKING:
    from lousho.worker.steps import SessionSteps

__all__ = [
    "commit_abort_results",
    "interrupted_plan",
    "is_marked_interrupted",
    "mark_interrupted",
]


def interrupted_plan(
    steps: SessionSteps, run: Run, checkpoint: Checkpoint, call: ToolCall, begun: CallBegun
) -> PlannedCall | str | None:
    """What a started call does instead of running, when an earlier start of it died: 'ask' (to pause
    on), a plan recording the interrupted error ('fail'), or None: it runs (a 'rerun' tool, a first
    start, or a human decided to run it again)."""
    started = {call.id} if begun.starts + begun.shared > 1 else set()
    policy = interruption_of(run.agent, call, started)
    if policy is None:
        return None
    decided = _rerun_decided(steps, checkpoint, call)
    if decided is not None:
        if begun.starts + begun.shared <= _RERUN_START:
            return None  # the one run the human's 'rerun' allowed
        return _ask_again(steps, decided, begun, result_field(tool_turn(checkpoint), call.id))
    if policy == "fail":
        return PlannedCall(call, result=interrupted_result(call.name), preset=True)
    return "ask"


_RERUN_START = 2
"""The start a human's 'rerun' allows: the interrupted one (its count is what is left after the ask took its own
start back, 1 by `_ask_again`) and then this one."""


def _rerun_decided(steps: SessionSteps, checkpoint: Checkpoint, call: ToolCall) -> ApprovalSnapshot | None:
    """The decided 'rerun' of `call`'s interrupted-call approval the session waits on, if that is what it waits on."""
    snapshot = steps.approval(checkpoint) if checkpoint.status == "awaiting-approval" else None
    if (
        snapshot is not None
        and snapshot.kind == "interrupted"
        and snapshot.tool_call.id == call.id
        and snapshot.status != "pending"
        and snapshot.interrupted_action == "rerun"
    ):
        return snapshot
    return None


def _ask_again(steps: SessionSteps, decided: ApprovalSnapshot, begun: CallBegun, field: str) -> str:
    """The run a human's 'rerun' allowed was cut short too: it may have run again, so the human is asked again,
    on the same approval put back to pending, as in process (issue #17). The call's start count is set back to 1
    (the ask path takes this start back), so that the next 'rerun' allows one run again."""
    steps.runtime.store.approvals.reopen(decided.id)
    epoch = steps.epoch or ""
    if begun.starts > _RERUN_START:
        steps.scripts.count(steps.session_id, epoch, f"call:{field}", _RERUN_START - begun.starts)
    if begun.shared:  # deaths shared with other sessions' runs count as starts here: they start over too
        steps.scripts.count(steps.session_id, epoch, f"shared:{field}", -begun.shared)
    return "ask"


def mark_interrupted(steps: SessionSteps, field: str) -> None:
    """Leave the mark the fold pauses on (`is_marked_interrupted`); it goes with the turn's state."""
    steps.scripts.count(steps.session_id, steps.epoch or "", f"{INTERRUPTED}{field}", 1)


def is_marked_interrupted(steps: SessionSteps, run: Run, checkpoint: Checkpoint, call: ToolCall) -> bool:
    """True when `call` is an 'ask' tool's whose task found it interrupted: the session pauses on it.
    Read only for 'ask' tools, so a turn without one costs no round trip."""
    tool = run.agent.tools.get(call.name)
    if tool is None or tool.on_interrupted != "ask":
        return False
    return steps.keys.has_interrupted_mark(checkpoint, call)


def commit_abort_results(steps: SessionSteps, run: Run, checkpoint: Checkpoint) -> ToolCall | None:
    """An abort's results, in call order: 'cancelled', or for a call that began (a start of it is counted)
    of a 'fail' tool the interrupted error; the results stop at such a call of an 'ask' tool, which is
    returned for the abort to pause on (as in process: `Run.abort`)."""
    pending = checkpoint.pending_tool_calls()
    started = _started(steps, run, checkpoint, pending)
    for call in pending:
        policy = interruption_of(run.agent, call, started)
        if policy == "ask":
            return call
        steps.commit_result(
            checkpoint, call.id, interrupted_result(call.name) if policy == "fail" else CANCELLED_RESULT
        )
    return None


def _started(steps: SessionSteps, run: Run, checkpoint: Checkpoint, calls: list[ToolCall]) -> set[str]:
    """The calls, of tools that are not 'rerun', with a start counted (alone or shared with others')."""
    watched = [c for c in calls if interruption_of(run.agent, c, {c.id}) is not None]
    if not watched:
        return set()
    fields = [result_field(tool_turn(checkpoint), c.id) for c in watched]
    names = [name for field in fields for name in (f"call:{field}", f"shared:{field}")]
    with redis_errors(steps.client, f"read the starts of the calls of {steps.session_id!r}"):
        counts = cast(list[bytes | None], steps.client.hmget(steps.keys.attempts(steps.session_id), names))
    began = [int(counts[2 * i] or 0) + int(counts[2 * i + 1] or 0) > 0 for i in range(len(watched))]
    return {call.id for call, yes in zip(watched, began, strict=True) if yes}
