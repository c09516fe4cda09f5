"""Where a caller's `input` goes, by the stored status (reference: 'What happens when you call execute() again')."""

from __future__ import annotations

import functools
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

from lousho.checkpoint import Checkpoint
from lousho.errors import InvalidInputError
from lousho.messages import ACCEPTED_INPUT, Message, Usage, as_messages, unencodable_text

__all__ = [
    "add_input_to_unfinished",
    "continue_finished",
    "materialize_accepted",
    "start_session",
    "validate_business_state",
    "validate_input",
]


def _without_system(messages: list[Message]) -> list[Message]:
    """System messages in input are ignored on a stored session: it already has its system prompt."""
    return [m for m in messages if m.role != "system"]


def _same(a: list[Message], b: list[Message]) -> bool:
    return len(a) == len(b) and all(
        x.same_turn(y) and x.tool_call_id == y.tool_call_id for x, y in zip(a, b, strict=True)
    )


def _after_resent_history(stored: Checkpoint, new: list[Message]) -> list[Message]:
    """`new` (system messages aside) without a leading re-sent copy of the stored transcript."""
    history = _without_system(stored.messages)
    if len(new) >= len(history) and history and _same(new[: len(history)], history):
        return new[len(history) :]
    return new


def _refuse(problem: str) -> InvalidInputError:
    return InvalidInputError(f"{problem}; nothing was written. {ACCEPTED_INPUT[0].upper()}{ACCEPTED_INPUT[1:]}")


def _check_added(message: Message) -> None:
    """A message that the call would add to the transcript: it must keep the transcript valid."""
    if message.role == "tool":
        raise _refuse(f"a tool message (tool_call_id={message.tool_call_id!r}) answers no call the model made here")
    if message.tool_calls:
        raise _refuse(f"a {message.role} message with tool_calls would leave calls without results")
    if not (message.content or "").strip():
        raise _refuse(f"a {message.role} message without text gives the model nothing to read")


def validate_input(value: object, stored: Checkpoint | None) -> list[Message]:
    """The caller's `input` as messages, or `InvalidInputError` if the provider would get an invalid transcript.

    The one check of every entry point (`execute`/`send`, `Client.enqueue`, the CLI, the web example),
    made before anything is written (issue #21). `stored` is the session's checkpoint (None: a new
    session, which must start with a user message). On a stored session system messages are ignored
    and `[]`/None just resumes, but system messages alone are refused rather than silently dropped.
    """
    messages = as_messages(value)
    for number, message in enumerate(messages, start=1):
        where = unencodable_text(message)
        if where is not None:  # it would fail the save, after the run was begun (issue #31)
            raise _refuse(
                f"input message {number} ({message.role}) holds text that cannot be stored at {where}: a lone "
                'surrogate such as U+D800 (what the JSON escape "\\ud800" decodes to) is not valid Unicode. '
                "Send valid text, e.g. text.encode('utf-8', 'replace').decode()"
            )
    if stored is None:
        added = messages
    else:
        added = _without_system(messages)
        if stored.status == "finished":
            added = _after_resent_history(stored, added)
    for message in added:
        _check_added(message)
    first = next((m for m in messages if m.role != "system"), None)
    if stored is None and (first is None or first.role != "user"):
        got = "no message" if first is None else f"an {first.role} message first"
        raise _refuse(f"a new session needs a user message to start from (got {got})")
    if stored is not None and messages and first is None:
        raise _refuse(
            f"session {stored.session_id!r} has its system prompt (the agent's instructions) and system messages "
            "in input are not sent: send a user message, or input=[] to just resume"
        )
    return messages


def validate_business_state(value: Any) -> int:
    """The business state's size in characters of JSON, or `InvalidInputError` for one no store can save (not
    JSON, or text that is not valid Unicode), before anything is written."""
    try:
        return len(to_json(value).decode())
    except PydanticSerializationError as exc:
        raise InvalidInputError(
            f"business_state cannot be stored ({str(exc)[:200]}); nothing was written. Pass JSON: dicts, lists, "
            "numbers, booleans, None and valid text"
        ) from None


@functools.lru_cache(maxsize=256)
def system_message(instructions: str) -> Message:
    """An agent's instructions as the system message: one object per process, shared by every session that starts
    with them (messages are frozen; a worker holds hundreds of first turns at once, issue #29)."""
    return Message.system(instructions)


def start_session(session_id: str, instructions: str, messages: list[Message], business_state: Any) -> Checkpoint:
    """A new run: the agent's instructions as the system message, then the input."""
    system = [system_message(instructions)] if instructions else []
    user = _without_system(messages) if instructions else messages
    return Checkpoint(
        session_id=session_id,
        messages=[*system, *user],
        run_start=len(system),
        run_input_count=len(user),
        business_state=business_state,
    )


def materialize_accepted(checkpoint: Checkpoint, instructions: str) -> Checkpoint:
    """An accepted record (written by `Client.enqueue`, which has no agent code) gets its system prompt,
    by the rule of a new session in process (`start_session`: one opening transcript, issue #21)."""
    if checkpoint.messages or not checkpoint.pending_input:
        return checkpoint
    start = start_session(checkpoint.session_id, instructions, checkpoint.pending_input, checkpoint.business_state)
    return checkpoint.model_copy(
        update={
            "messages": start.messages,
            "pending_input": [],
            "run_start": start.run_start,
            "run_input_count": start.run_input_count,
        }
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
    new = _after_resent_history(checkpoint, _without_system(messages))
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
