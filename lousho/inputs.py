"""Where a caller's `input` goes, by the stored status (reference: 'What happens when you call execute() again')."""

from __future__ import annotations

from typing import Any

from lousho.checkpoint import Checkpoint
from lousho.messages import Message, Usage

__all__ = ["add_input_to_unfinished", "continue_finished", "start_session"]


def _without_system(messages: list[Message]) -> list[Message]:
    """System messages in input are ignored on a stored session: it already has its system prompt."""
    return [m for m in messages if m.role != "system"]


def _same(a: list[Message], b: list[Message]) -> bool:
    return len(a) == len(b) and all(
        x.same_turn(y) and x.tool_call_id == y.tool_call_id for x, y in zip(a, b, strict=True)
    )


def start_session(session_id: str, instructions: str, messages: list[Message], business_state: Any) -> Checkpoint:
    """A new run: the agent's instructions as the system message, then the input."""
    system = [Message.system(instructions)] if instructions else []
    user = _without_system(messages) if instructions else messages
    return Checkpoint(
        session_id=session_id,
        messages=[*system, *user],
        run_start=len(system),
        run_input_count=len(user),
        business_state=business_state,
    )


def _is_retry(checkpoint: Checkpoint, messages: list[Message]) -> bool:
    """Re-sent starting input (or re-sent input that is already queued) is a retry, not new input."""
    start = checkpoint.messages[checkpoint.run_start : checkpoint.run_start + checkpoint.run_input_count]
    return _same(messages, start) or _same(messages, checkpoint.pending_input)


def add_input_to_unfinished(checkpoint: Checkpoint, messages: list[Message]) -> Checkpoint:
    """New input on an unfinished run is queued; it is sent after the pending tool calls' results."""
    new = _without_system(messages)
    if not new or _is_retry(checkpoint, new):
        return checkpoint
    return checkpoint.model_copy(update={"pending_input": [*checkpoint.pending_input, *new]})


def continue_finished(checkpoint: Checkpoint, messages: list[Message]) -> Checkpoint | None:
    """The next turn of a finished conversation; None when there is nothing new to send.

    A re-sent copy of the stored history is recognised and not duplicated. Counters restart from zero.
    """
    new = _without_system(messages)
    stored = _without_system(checkpoint.messages)
    if len(new) >= len(stored) and stored and _same(new[: len(stored)], stored):
        new = new[len(stored) :]
    if not new:
        return None
    return checkpoint.model_copy(
        update={
            "messages": [*checkpoint.messages, *new],
            "status": "in-progress",
            "finish_reason": None,
            "step_index": 0,
            "usage": Usage(),
            "run_start": len(checkpoint.messages),
            "run_input_count": len(new),
            "pending_input": [],
        }
    )
