"""Fork a run from a step of its history, with a patch (reference: 'Fork and replay').

`fork()` only reads the source session's history and writes one new checkpoint: the
source's latest checkpoint and history are never touched. The fork is an ordinary
'in-progress' run, so resuming it follows the usual rules (pending calls first, then
queued input, then the model). `apply_patch()` is the patch step alone, saving nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict

from lousho.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ForkOrigin,
    HistoryEntry,
    get_checkpoint_history,
    maybe_await,
    validate_session_id,
)
from lousho.errors import CheckpointConflictError, CheckpointNotFoundError, ConfigurationError, SessionExistsError
from lousho.messages import Message, ToolCall, as_messages

__all__ = [
    "ForkPatch",
    "ForkResult",
    "SessionExistsError",
    "ToolResultPatch",
    "apply_patch",
    "fork",
]

PATCH_KEYS = ("messages", "business_state", "tool_result", "append_input")
"""The patch keys, in the order they are applied."""
_FORK_SUFFIX = ".fork-"
_MAX_DEFAULT_FORKS = 10_000


class ToolResultPatch(TypedDict):
    tool_call_id: str
    result: Any


class ForkPatch(TypedDict, total=False):
    """What to change in the forked checkpoint; keys are applied in this order."""

    messages: Callable[[list[Message]], list[Message]]
    """Rewrites the transcript (it must stay valid: results right after their call, in call order)."""
    business_state: Any
    """Replaces the business state."""
    tool_result: ToolResultPatch | Sequence[ToolResultPatch]
    """Replaces a call's result in place, or records it when the call has none yet (several: in call order)."""
    append_input: str | Message | Sequence[str | Message]
    """User input queued in `pending_input`: sent after the tool calls still pending."""


class ForkResult(BaseModel):
    """What `fork()` returns: the new session, the step it was forked from, and its saved checkpoint."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    step: int
    checkpoint: Checkpoint
    save: int | None = None
    """The source's save it was forked from: its checkpoint version, the address `lousho history` shows."""


async def fork(
    *,
    session_id: str,
    from_step: int | None = None,
    checkpoint_store: CheckpointStore,
    patch: ForkPatch | dict[str, Any] | None = None,
    new_session_id: str | None = None,
    from_save: int | None = None,
) -> ForkResult:
    """Start a new session from the newest history entry of `session_id`'s step `from_step`, or from
    the save `from_save` (exactly one of the two).

    A step can have several saves (the model's turn, then each tool result of that turn); a save is
    one of them: its number is the checkpoint's version at that save, which `lousho history` shows
    (issue #15). A session deleted with `keep_history=True` and run again numbers its saves from 1
    again: `from_save` then takes the newest save of that number.

    The patch is applied (`messages`, `business_state`, `tool_result`, `append_input`, in
    that order) and the result is saved as the new session's 'in-progress' checkpoint
    (version 1, no approval id; step count, usage and fingerprint kept). Resume it like
    any unfinished run.

    Raises `CheckpointNotFoundError` (LOUSHO_CHECKPOINT_NOT_FOUND) for a step the history
    does not hold, `ConfigurationError` for a store without `history()` or a bad patch, and
    `SessionExistsError` (a `ConfigurationError`) for a `new_session_id` that has a checkpoint.
    """
    validate_session_id(session_id)
    if new_session_id is not None:
        validate_session_id(new_session_id)
    patch = _checked_patch(patch)
    if (from_step is None) == (from_save is None):
        raise ConfigurationError("fork takes either from_step or from_save (a save number from the history)")
    entry = await _history_entry(checkpoint_store, session_id, from_step, from_save)
    checkpoint = apply_patch(entry.checkpoint, patch)
    found = {"step": entry.step, "save": entry.checkpoint.version}
    origin = ForkOrigin(session_id=session_id, step=entry.step, save=entry.checkpoint.version)
    checkpoint = checkpoint.model_copy(update={"forked_from": origin})  # the link back, whatever its name (#32)
    if new_session_id is not None:
        saved = await _save_new(checkpoint_store, new_session_id, checkpoint)
        if saved is None:
            raise SessionExistsError(
                f"session {new_session_id!r} already has a checkpoint; a fork never overwrites a session: "
                "pick another new_session_id (or leave it out for <session>.fork-<n>)"
            )
        return ForkResult(session_id=new_session_id, checkpoint=saved, **found)
    for n in range(1, _MAX_DEFAULT_FORKS + 1):
        candidate = validate_session_id(f"{session_id}{_FORK_SUFFIX}{n}")
        saved = await _save_new(checkpoint_store, candidate, checkpoint)
        if saved is not None:
            return ForkResult(session_id=candidate, checkpoint=saved, **found)
    raise ConfigurationError(f"session {session_id!r} has {_MAX_DEFAULT_FORKS} forks already; pass new_session_id=")


def _checked_patch(patch: ForkPatch | dict[str, Any] | None) -> dict[str, Any]:
    """The patch as a plain dict; `ConfigurationError` for a key that is not a patch key."""
    checked = dict(patch or {})
    unknown = sorted(set(checked) - set(PATCH_KEYS))
    if unknown:
        raise ConfigurationError(
            f"unknown fork patch keys: {', '.join(unknown)}; use messages, business_state, tool_result, append_input"
        )
    return checked


async def _history_entry(store: CheckpointStore, session_id: str, step: int | None, save: int | None) -> HistoryEntry:
    """The newest history entry of that step, or of that save number (history is newest first)."""
    history = await get_checkpoint_history(store, session_id)
    if history is None:
        raise ConfigurationError(
            f"{type(store).__name__} keeps no checkpoint history, so it cannot fork; use a store "
            "with history() (memory_store(), SqliteStore, RedisStore, FileStore)"
        )
    if save is not None:
        entry = next((e for e in history if e.checkpoint.version == save), None)
        if entry is None:
            saves = ", ".join(str(e.checkpoint.version) for e in reversed(history)) or "none"
            raise CheckpointNotFoundError(
                f"session {session_id!r} has no save {save} in its history; the saves kept are {saves} "
                "(the session may be unknown, or the save was dropped past history_limit)"
            )
        return entry
    entry = next((e for e in history if e.step == step), None)
    if entry is None:
        kept = sorted({e.step for e in history})
        held = f"the steps kept are {', '.join(map(str, kept))}" if kept else "its history holds no entries"
        raise CheckpointNotFoundError(
            f"session {session_id!r} has no history entry for step {step}; {held} "
            "(the session may be unknown, the step may never have run, or it was dropped past history_limit)"
        )
    return entry


async def _save_new(store: CheckpointStore, session_id: str, checkpoint: Checkpoint) -> Checkpoint | None:
    """Save as a new session's first version; None when the session exists (checked, then refused by CAS)."""
    if await maybe_await(store.load(session_id)) is not None:
        return None
    new = checkpoint.model_copy(
        update={
            "session_id": session_id,
            "version": 1,
            "status": "in-progress",
            "approval_id": None,
            "finish_reason": None,
        }
    )
    try:
        await maybe_await(store.save(session_id, new))
    except CheckpointConflictError:  # created between load and save: a CAS store refuses version 1
        return None
    return new


def apply_patch(checkpoint: Checkpoint, patch: dict[str, Any]) -> Checkpoint:
    """The checkpoint with `patch` applied, in the reference's order. Nothing is saved."""
    if "messages" in patch:
        rewrite = patch["messages"]
        if not callable(rewrite):
            raise ConfigurationError("patch['messages'] must be a function: list[Message] -> list[Message]")
        messages = as_messages(rewrite(list(checkpoint.messages)))
        _check_transcript(messages)
        checkpoint = checkpoint.model_copy(
            update={
                "messages": messages,
                "run_start": min(checkpoint.run_start, len(messages)),
                "run_input_count": min(checkpoint.run_input_count, max(len(messages) - checkpoint.run_start, 0)),
            }
        )
    if "business_state" in patch:
        checkpoint = checkpoint.model_copy(update={"business_state": patch["business_state"]})
    if "tool_result" in patch:
        patches = patch["tool_result"]
        for item in [patches] if isinstance(patches, dict) else list(patches):
            checkpoint = _patch_tool_result(checkpoint, item)
    if "append_input" in patch:
        new = [m for m in as_messages(patch["append_input"]) if m.role != "system"]
        if not new:
            raise ConfigurationError("patch['append_input'] holds no message to send")
        checkpoint = checkpoint.model_copy(update={"pending_input": [*checkpoint.pending_input, *new]})
    return checkpoint


def _patch_tool_result(checkpoint: Checkpoint, item: Any) -> Checkpoint:
    if not isinstance(item, dict) or set(item) != {"tool_call_id", "result"}:
        raise ConfigurationError(f"patch['tool_result'] must be {{'tool_call_id': str, 'result': ...}}; got {item!r}")
    call_id, result = item["tool_call_id"], item["result"]
    if hasattr(result, "model_dump"):
        result = result.model_dump(mode="json")
    messages = list(checkpoint.messages)
    located = _find_call(messages, call_id)
    if located is None:
        raise ConfigurationError(f"no tool call {call_id!r} in the forked checkpoint; check the id at that step")
    turn_index, call = located
    for index in range(turn_index + 1, len(messages)):
        message = messages[index]
        if message.role != "tool":
            break
        if message.tool_call_id == call_id:  # same position, call id and tool name
            messages[index] = Message.tool_result(call, result)
            return checkpoint.model_copy(update={"messages": messages})
    pending = checkpoint.pending_tool_calls()
    if call_id not in [c.id for c in pending]:
        raise ConfigurationError(
            f"tool call {call_id!r} has no result and is not pending at this step, so it cannot be recorded"
        )
    if pending[0].id != call_id:
        before = ", ".join(repr(c.id) for c in pending[: [c.id for c in pending].index(call_id)])
        raise ConfigurationError(
            f"tool call {call_id!r} comes after pending calls {before}, and results are recorded in call order: "
            "give those results first (tool_result=[{...}, {...}]) or fork from a step where they are recorded"
        )
    return checkpoint.model_copy(update={"messages": [*messages, Message.tool_result(call, result)]})


def _find_call(messages: list[Message], call_id: str) -> tuple[int, ToolCall] | None:
    """The newest assistant turn with a call of that id (ids are unique within a turn only)."""
    for index in range(len(messages) - 1, -1, -1):
        for call in messages[index].tool_calls if messages[index].role == "assistant" else ():
            if call.id == call_id:
                return index, call
    return None


def _check_transcript(messages: list[Message]) -> None:
    """Every result directly follows its call's turn, once, in call order; only the last turn may lack results."""
    expected: list[str] = []  # calls of the current turn still waiting for a result, in order
    for index, message in enumerate(messages):
        if message.role == "tool":
            if not expected or message.tool_call_id != expected[0]:
                want = repr(expected[0]) if expected else "no result"
                raise ConfigurationError(
                    f"patch['messages'] made an invalid transcript: message {index} is a result for "
                    f"{message.tool_call_id!r} where {want} belongs"
                )
            expected.pop(0)
            continue
        if expected:
            raise ConfigurationError(
                f"patch['messages'] made an invalid transcript: calls {', '.join(expected)} have no result "
                f"before message {index}"
            )
        if message.role == "assistant":
            expected = [c.id for c in message.tool_calls]
