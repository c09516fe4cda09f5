"""Sub-agents on the fleet (issue #14): an `agent_tool` call runs as a session of its own.

The parent's side. No tool task is sent for the call: the parent's step starts the child's session
(id `child_session_id(parent, call)`, an accepted record as `Client.enqueue` writes one, and its first
model turn), and from then on reads the child's checkpoint to know where the call is:
- running: nothing to do. The child tells the parent when it finishes, pauses or is aborted (an
  `advance`); meanwhile the parent stays in the in-flight index, so a word that is lost is made up
  for by the reaper's requeue.
- finished: the child's last answer is the call's result, committed once like any tool's.
- paused on an approval: once every call before this one has its result, the parent pauses on the
  same approval id (`pausing.py` nests the child's snapshot in the parent's, as in process). A
  decided approval is the child's to apply: the parent tells it to go on.
- aborted (its abort flag is set): the call gets the cancelled result.
- parked (its model turn killed its worker `max_attempts` times): the parent parks too, saying so;
  `Client.resume` the sub-agent's session, then the parent's.

The child's side: a step of a sub-agent's session that ends with it finished, paused or aborted
sends its parent an `advance` (`tell_parent`). Aborting the parent aborts its unfinished children.
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, cast

from lousho.checkpoint import Checkpoint, child_session_id, validate_session_id
from lousho.definition import Agent
from lousho.engine import CANCELLED_RESULT
from lousho.errors import CheckpointConflictError, InvalidInputError, InvalidSessionIdError
from lousho.fleet.dispatch import send_advance, send_model_turn, turn_number
from lousho.inputs import validate_input
from lousho.messages import ToolCall
from lousho.run import Run
from lousho.stores.redis_common import redis_errors, text
from lousho.subagents import SubAgentInput
from lousho.tools import tool_error

if TYPE_CHECKING:
    from lousho.worker.steps import SessionSteps

__all__ = ["ChildProgress", "abort_children", "sub_agent_call", "tell_parent"]

log = logging.getLogger("lousho.worker")

TELLS_PARENT = frozenset({"finished", "awaiting-approval", "aborted", "parked"})
"""Outcomes of a sub-agent's step that its parent acts on."""


class ChildProgress(enum.Enum):
    """Where a sub-agent call stands, for the parent's dispatch."""

    RUNNING = "running"
    """Started (now or before) and not done: the parent waits for its word."""
    SETTLED = "settled"
    """Its result is committed: the parent's next fold records it."""
    PAUSED = "paused"
    """The parent paused on the child's approval."""
    BLOCKED = "blocked"
    """The child waits on an approval, but a call before this one has no result yet."""
    PARKED = "parked"
    """The child is parked: so is the parent now."""


def sub_agent_of(run: Run, call: ToolCall) -> Agent | None:
    """The agent a call runs, when its tool is an `agent_tool`."""
    tool = run.agent.tools.get(call.name)
    return tool.sub_agent if tool is not None else None


async def sub_agent_call(
    steps: SessionSteps, run: Run, checkpoint: Checkpoint, call: ToolCall, args: SubAgentInput, first: bool
) -> ChildProgress:
    """Move sub-agent call `call` of the parent's `checkpoint` along; `first`: no call before it is pending."""
    agent = sub_agent_of(run, call)
    assert agent is not None
    child_id = child_session_id(steps.session_id, call)
    child = steps.runtime.store.checkpoints.load(child_id)
    if child is not None and _epoch_of(steps, child_id) != (steps.epoch or ""):
        # A sub-agent of an earlier incarnation of this session (deleted, then enqueued again under its id,
        # its model reusing the call id): its answer is not this run's. Gone, and started anew.
        steps.runtime.store.checkpoints.delete(child_id)
        child = None
    if child is None:
        return start_child(steps, checkpoint, call, args, agent)
    if child.status == "finished":
        text = next((m.content for m in reversed(child.messages) if m.role == "assistant"), None)
        steps.commit_result(checkpoint, call.id, text or "")
        return ChildProgress.SETTLED
    if _abort_flag(steps, child_id):
        steps.commit_result(checkpoint, call.id, CANCELLED_RESULT)
        return ChildProgress.SETTLED
    parked = _parked_reason(steps, child_id)
    if parked is not None:
        steps.park(f"its sub-agent session {child_id!r} is parked ({parked}); resume that session, then this one")
        return ChildProgress.PARKED
    if child.status != "awaiting-approval" or child.approval_id is None:
        return ChildProgress.RUNNING
    snapshot = steps.runtime.store.approvals.load(child.approval_id)
    if snapshot is not None and snapshot.status != "pending":
        send_advance(steps.runtime.app, child_id, "approval")  # decided: the child applies it and goes on
        return ChildProgress.RUNNING
    if not first:
        return ChildProgress.BLOCKED
    await run.pause(checkpoint, call, child_approval_id=child.approval_id)
    return ChildProgress.PAUSED


def start_child(
    steps: SessionSteps, checkpoint: Checkpoint, call: ToolCall, args: SubAgentInput, agent: Agent
) -> ChildProgress:
    """Create the child's session (a new incarnation) and send its first model turn. Input the
    child's model could not take (or a session id too long to derive from the parent's) is the call's
    result, as a tool error the parent's model reads."""
    try:
        child_id = validate_session_id(child_session_id(steps.session_id, call))
        messages = validate_input(args.input, None)
    except (InvalidInputError, InvalidSessionIdError) as exc:
        steps.commit_result(checkpoint, call.id, tool_error("invalid-input", str(exc)))
        return ChildProgress.SETTLED
    record = Checkpoint(
        session_id=child_id, version=1, agent_name=agent.name, pending_input=messages,
        parent_session_id=steps.session_id,
    )  # fmt: skip
    steps.keys.new_incarnation(child_id, epoch=steps.epoch or "")  # the parent's incarnation, as its own
    try:
        steps.runtime.store.checkpoints.save(child_id, record)
    except CheckpointConflictError:
        return ChildProgress.RUNNING  # started already, by an earlier copy of this step
    send_model_turn(steps.runtime.app, child_id, turn_number(record))
    log.info("session %s: call %s runs as sub-agent session %s", steps.session_id, call.id, child_id)
    return ChildProgress.RUNNING


def abort_children(steps: SessionSteps, run: Run, checkpoint: Checkpoint) -> None:
    """The parent is aborted: so is every child still running one of its pending calls."""
    for call in checkpoint.pending_tool_calls():
        if sub_agent_of(run, call) is None:
            continue
        child_id = child_session_id(steps.session_id, call)
        child = steps.runtime.store.checkpoints.load(child_id)
        if child is None or child.status == "finished":
            continue
        with redis_errors(steps.client, f"set the abort flag of sub-agent session {child_id!r}"):
            steps.client.set(steps.keys.abort(child_id), "1")
        send_advance(steps.runtime.app, child_id, "abort")


def tell_parent(steps: SessionSteps, outcome: str) -> None:
    """A sub-agent's step ended with its session finished, paused or aborted: its parent acts on it."""
    if steps.parent_session_id is not None and outcome in TELLS_PARENT:
        send_advance(steps.runtime.app, steps.parent_session_id, f"sub-agent-{outcome}")


def _abort_flag(steps: SessionSteps, session_id: str) -> bool:
    with redis_errors(steps.client, f"read the abort flag of {session_id!r}"):
        return bool(steps.client.exists(steps.keys.abort(session_id)))


def _epoch_of(steps: SessionSteps, session_id: str) -> str:
    with redis_errors(steps.client, f"read the epoch of {session_id!r}"):
        epoch = cast(bytes | None, steps.client.get(steps.keys.epoch(session_id)))
    return text(epoch) if epoch is not None else ""


def _parked_reason(steps: SessionSteps, session_id: str) -> str | None:
    with redis_errors(steps.client, f"read the parked mark of {session_id!r}"):
        reason = cast(bytes | None, steps.client.hget(steps.keys.parked_of(session_id), session_id))
    return text(reason) if reason is not None else None
