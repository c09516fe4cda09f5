"""The checkpoint, the store contract, and history entries.

A checkpoint is the only source of truth of a run: the engine decides what runs
next from it alone, so the same code resumes after a crash, a redelivered task
or a requeue by the reaper.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Awaitable
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lousho.compact import CompactModel
from lousho.errors import CheckpointConflictError, CorruptCheckpointError, InvalidSessionIdError, NewerFormatError
from lousho.fingerprint import AgentFingerprint
from lousho.formats import CHECKPOINT_SCHEMA_VERSION
from lousho.messages import Message, ToolCall, Usage

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "Checkpoint",
    "CheckpointStore",
    "ForkOrigin",
    "HistoryEntry",
    "Status",
    "decode_checkpoint",
    "get_checkpoint_history",
    "check_schema",
    "check_version",
    "child_session_id",
    "maybe_await",
    "validate_session_id",
]

Status = Literal["in-progress", "awaiting-approval", "finished"]
FinishReason = Literal["stop", "max-steps"]
T = TypeVar("T")


class ForkOrigin(BaseModel):
    """Where a forked session came from: the source session and the step (and save) it was forked at. Stored
    with every fork, whatever its name, so a fork named `chat-42.porto` still links back (issue #32)."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    step: int
    save: int | None = None


class Checkpoint(CompactModel):
    """A run's whole transcript plus its counters, written under its session id."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = CHECKPOINT_SCHEMA_VERSION
    """Format of this record; a reader refuses a newer one rather than misread it."""
    session_id: str
    version: int = 0
    """Bumped by every save; stores that compare it refuse a stale save (a fencing token)."""
    status: Status = "in-progress"
    """Missing in old records: those are 'in-progress' (reference: compatibility)."""
    finish_reason: FinishReason | None = None
    """Why a 'finished' run ended."""
    agent_name: str | None = None
    """Which agent runs this session (the fleet looks it up by name)."""
    messages: list[Message] = Field(default_factory=list)
    """The whole conversation, across runs; it only grows."""
    step_index: int = 0
    """Model turns taken by the current run (its `steps`, counted against `max_steps`). A turn's own
    number is counted over the whole transcript instead: `turns` (issue #14)."""
    usage: Usage = Field(default_factory=Usage)
    """Token usage of the current run."""
    run_start: int = 0
    """Index in `messages` of the current run's first input message."""
    run_input_count: int = 0
    """How many input messages the current run started from (to recognise a retry)."""
    pending_input: list[Message] = Field(default_factory=list)
    """User input queued to be sent once the pending tool calls have their results."""
    business_state: Any = None
    """The caller's own JSON state, carried along."""
    approval_id: str | None = None
    """Set while 'awaiting-approval'."""
    fingerprint: AgentFingerprint | None = None
    run_config: dict[str, Any] | None = None
    """A dynamic agent's `ctx` and the model it chose."""
    parent_session_id: str | None = None
    """Set on a sub-agent's session: the session whose tool call it runs (`agent_tool`). On the fleet
    the sub-agent tells that session when it finishes or pauses (issue #14)."""
    started_calls: list[str] = Field(default_factory=list)
    """Ids of the newest turn's calls to tools that are not re-run after an interruption
    (`on_interrupted` 'ask' or 'fail'), saved as each starts in process and dropped as its result is
    recorded: a resume that finds one here knows the call may have run (issue #17)."""
    forked_from: ForkOrigin | None = None
    """Set on a fork (`lousho.fork.fork`): its source session and step; kept by every later save (issue #32)."""

    @property
    def turns(self) -> int:
        """The model turns in the transcript, across runs: turn `n` is the n-th assistant message, the
        number in a fleet task's id (`<session>/turn/<n>`) and in the worker's results (issue #14)."""
        return sum(m.role == "assistant" for m in self.messages)

    def last_tool_turn(self) -> tuple[int, Message] | None:
        """The newest assistant message, with its index, when it asked for tools."""
        for index in range(len(self.messages) - 1, -1, -1):
            message = self.messages[index]
            if message.role == "assistant":
                return (index, message) if message.tool_calls else None
            if message.role == "user":
                return None
        return None

    def recorded_results(self) -> dict[str, Message]:
        """Tool results recorded after the newest tool-call turn, by call id."""
        turn = self.last_tool_turn()
        if turn is None:
            return {}
        return {m.tool_call_id: m for m in self.messages[turn[0] + 1 :] if m.role == "tool" and m.tool_call_id}

    def pending_tool_calls(self) -> list[ToolCall]:
        """Calls of the newest tool-call turn that have no result yet, in call order."""
        turn = self.last_tool_turn()
        if turn is None:
            return []
        done = self.recorded_results()
        return [call for call in turn[1].tool_calls if call.id not in done]

    def run_tool_calls(self) -> list[ToolCall]:
        """Every tool call the current run's model turns asked for."""
        return [c for m in self.messages[self.run_start :] if m.role == "assistant" for c in m.tool_calls]


class HistoryEntry(BaseModel):
    """One save of a session, as its history keeps it."""

    step: int
    """`checkpoint.step_index` at that save."""
    saved_at: str
    """ISO 8601 timestamp (UTC)."""
    status: Status
    checkpoint: Checkpoint


@runtime_checkable
class CheckpointStore(Protocol):
    """The three methods every store has. Sync or async methods both work.

    A store may also offer `history(session_id, limit=None) -> list[HistoryEntry]`
    (newest first); without it the store still works, but cannot fork.
    """

    def save(self, session_id: str, checkpoint: Checkpoint) -> Awaitable[None] | None:
        """Store `checkpoint` as the session's latest. Stores that can should refuse a
        `checkpoint.version` that is not the stored one plus one (`CheckpointConflictError`)."""

    def load(self, session_id: str) -> Checkpoint | Awaitable[Checkpoint | None] | None:
        """The latest checkpoint, or None for an unknown session."""

    def delete(self, session_id: str, keep_history: bool = False) -> Awaitable[None] | None:
        """Forget the session (and its history unless `keep_history`)."""


async def maybe_await(value: T | Awaitable[T]) -> T:
    """Await `value` when a store method was async; pass it through when it was sync."""
    if inspect.isawaitable(value):
        return await value
    return value


async def get_checkpoint_history(
    store: CheckpointStore, session_id: str, limit: int | None = None
) -> list[HistoryEntry] | None:
    """The session's history, newest first; None when the store keeps no history."""
    history = getattr(store, "history", None)
    if history is None:
        return None
    entries: list[HistoryEntry] = await maybe_await(history(session_id, limit=limit))
    return entries


_SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@=+-]{0,199}")


SESSION_ID_RULE = "use 1-200 characters of letters, digits and _ . : @ = + - (starting with a letter, digit or _)"
"""What a session id must be, as `InvalidSessionIdError.rule` says it."""


def validate_session_id(session_id: object) -> str:
    """Refuse ids that keys and task ids cannot carry (`{`, `}`, `/`, `*`, spaces, over 200 chars)."""
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        error = InvalidSessionIdError(f"session id {str(session_id)[:80]!r} is not allowed: {SESSION_ID_RULE}")
        error.length = len(session_id) if isinstance(session_id, str) else None
        error.rule = SESSION_ID_RULE
        raise error
    return session_id


def child_session_id(parent_session_id: str, call: ToolCall) -> str:
    """A stable, valid session id for the sub-agent run of one call (`<parent>.sub-<call id>`, issue #14)."""
    safe = (
        call.id
        if re.fullmatch(r"[A-Za-z0-9_.:@=+-]{1,80}", call.id)
        else hashlib.sha256(call.id.encode()).hexdigest()[:20]
    )
    return f"{parent_session_id}.sub-{safe}"


def decode_checkpoint(session_id: str, raw: str | bytes | dict[str, Any]) -> Checkpoint:
    """Read a stored checkpoint, or raise `CorruptCheckpointError` saying what is wrong."""
    try:
        data = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(session_id, f"not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CorruptCheckpointError(session_id, f"expected a JSON object, found {type(data).__name__}")
    check_schema(session_id, data)
    try:
        checkpoint = Checkpoint.model_validate(data)
    except ValidationError as exc:
        raise CorruptCheckpointError(
            session_id,
            f"wrong shape ({exc.error_count()} errors: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']})",
        ) from exc
    if checkpoint.session_id != session_id:
        raise CorruptCheckpointError(session_id, f"it belongs to session {checkpoint.session_id!r}")
    return checkpoint


def check_schema(session_id: str, data: dict[str, Any]) -> None:
    """Refuse a record of a schema this lousho does not read: `NewerFormatError` when a newer lousho wrote it
    (not damage: during a rolling upgrade it is handed back for a worker that reads it, issue #35)."""
    schema = data.get("schema_version", CHECKPOINT_SCHEMA_VERSION)
    if not isinstance(schema, int):
        raise CorruptCheckpointError(session_id, f"schema version {schema!r} is not a number")
    if schema > CHECKPOINT_SCHEMA_VERSION:
        raise NewerFormatError(
            session_id,
            f"schema version {schema!r} is newer than this lousho reads ({CHECKPOINT_SCHEMA_VERSION}); upgrade lousho",
        )


def check_version(session_id: str, stored_version: int | None, checkpoint: Checkpoint) -> None:
    """The compare-and-set rule every built-in store applies: a save must follow the stored version.

    An absent session counts as version 0, so the first save of a session is version 1.
    """
    expected = (stored_version or 0) + 1
    if checkpoint.version != expected:
        raise CheckpointConflictError(session_id, checkpoint.version - 1, stored_version)
