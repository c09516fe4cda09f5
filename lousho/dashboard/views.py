"""What the dashboard's pages show, read from a store bundle (and, on a fleet, its Redis) (issue #19).

Nothing here knows FastAPI: each function takes a `DashboardContext` and returns plain data that a
template renders. Stores may be sync or async; `sync()` (the CLI's) awaits them, as `lousho` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lousho.approvals import ApprovalSnapshot
from lousho.checkpoint import Checkpoint, HistoryEntry, child_session_id, get_checkpoint_history, validate_session_id
from lousho.cli_render import short, sync
from lousho.errors import ConfigurationError, SessionNotFoundError
from lousho.fingerprint import Drift, diff_fingerprints
from lousho.messages import Message
from lousho.scheduler.client import Client
from lousho.store_bundle import StoreBundle
from lousho.stores.listing import Listing, read_each

__all__ = [
    "STATUSES",
    "DashboardContext",
    "SessionRow",
    "SessionsPage",
    "TranscriptTurn",
    "fingerprint_drift",
    "fork_source",
    "history_of",
    "load_session",
    "pending_approvals",
    "session_rows",
    "sub_sessions",
    "transcript_turns",
]

STATUSES = ("in-progress", "awaiting-approval", "finished", "parked")
"""The status filter's choices: the checkpoint's statuses, and the fleet's 'parked' (as `lousho sessions`)."""


@dataclass(frozen=True)
class DashboardContext:
    """What every page reads: the store bundle, and on a fleet the `Client` that decides and wakes runs."""

    bundle: StoreBundle
    client: Client | None = None
    read_only: bool = False

    @property
    def fleet_store(self) -> Any:
        """The RedisStore when the bundle is a fleet's (None otherwise): parked marks, workers, leases live there."""
        from lousho.stores.redis import RedisStore

        return self.bundle if isinstance(self.bundle, RedisStore) else None

    def parked_reasons(self) -> dict[str, str]:
        """Session -> why the fleet parked it (empty off a fleet)."""
        store = self.fleet_store
        if store is None:
            return {}
        from lousho.fleet.keys import FleetKeys
        from lousho.stores.redis_common import redis_errors, text

        with redis_errors(store.client, "read the parked sessions"):
            marks = store.client.hgetall(FleetKeys(store).parked)
        return {text(name): text(reason) for name, reason in marks.items()}


@dataclass(frozen=True)
class SessionRow:
    """One line of the sessions page."""

    session_id: str
    status: str
    agent: str | None
    steps: int
    messages: int
    last_answer: str
    approval_id: str | None
    parked_reason: str | None
    parent_session_id: str | None


def _last_answer(checkpoint: Checkpoint) -> str:
    return next((m.content or "" for m in reversed(checkpoint.messages) if m.role == "assistant" and m.content), "")


PAGE_ROWS = 100
"""Sessions per page: each row reads its checkpoint, and the page's rows are read again at every poll."""


@dataclass(frozen=True)
class SessionsPage:
    """One page of the sessions list: `rows` from `start`, of `total` matching ids."""

    rows: Listing[SessionRow]
    total: int
    start: int

    @property
    def next_start(self) -> int | None:
        return self.start + PAGE_ROWS if self.start + PAGE_ROWS < self.total else None

    @property
    def previous_start(self) -> int | None:
        return max(0, self.start - PAGE_ROWS) if self.start > 0 else None


def session_rows(ctx: DashboardContext, status: str | None = None, search: str = "", start: int = 0) -> SessionsPage:
    """The sessions of one status (all when None) whose id contains `search`, `PAGE_ROWS` from `start` (in id
    order); the unreadable ones are named in `rows.skipped`."""
    if status is not None and status not in STATUSES:
        raise ConfigurationError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    parked = ctx.parked_reasons()
    if status == "parked":
        ids: Listing[str] = Listing(sorted(parked))
    else:
        ids = Listing.of(sync(ctx.bundle.sessions(status)))
    # A parked session's checkpoint says 'in-progress'; the filter lists it under 'parked' only (the status shown).
    hidden = parked if status is not None and status != "parked" else {}
    matching = [session_id for session_id in ids if search.strip() in session_id and session_id not in hidden]
    start = max(0, start)
    wanted = [(session_id, None) for session_id in matching[start : start + PAGE_ROWS]]

    def row(session_id: str, _: object) -> SessionRow | None:
        checkpoint: Checkpoint | None = sync(ctx.bundle.checkpoints.load(session_id))
        if checkpoint is None:
            return None
        reason = parked.get(session_id)
        return SessionRow(
            session_id=session_id,
            status="parked" if reason is not None else checkpoint.status,
            agent=checkpoint.agent_name,
            steps=checkpoint.step_index,
            messages=len(checkpoint.messages),
            last_answer=short(_last_answer(checkpoint), 80),
            approval_id=checkpoint.approval_id,
            parked_reason=reason,
            parent_session_id=checkpoint.parent_session_id,
        )

    rows = read_each(wanted, row, what="session")
    return SessionsPage(Listing(rows, skipped={**ids.skipped, **rows.skipped}), total=len(matching), start=start)


def load_session(ctx: DashboardContext, session_id: str) -> Checkpoint:
    """The session's latest checkpoint; `SessionNotFoundError` when it has none."""
    checkpoint: Checkpoint | None = sync(ctx.bundle.checkpoints.load(validate_session_id(session_id)))
    if checkpoint is None:
        raise SessionNotFoundError(session_id, repr(ctx.bundle))
    return checkpoint


@dataclass
class ShownCall:
    """A tool call beside its result (`has_result` False: none recorded yet)."""

    id: str
    name: str
    arguments: str
    result: str = ""
    has_result: bool = False
    sub_session: str | None = None
    """The sub-agent session this call runs (`<parent>.sub-<call id>`), when there is one."""


@dataclass
class TranscriptTurn:
    """One message of the transcript; an assistant turn carries its calls, each with its result."""

    index: int
    role: str
    content: str
    calls: list[ShownCall] = field(default_factory=list)


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False, default=str, sort_keys=True)


def transcript_turns(checkpoint: Checkpoint, sub_ids: set[str] | None = None) -> list[TranscriptTurn]:
    """The transcript as the session page shows it: tool messages folded into their calls' rows."""
    results = {m.tool_call_id: m for m in checkpoint.messages if m.role == "tool" and m.tool_call_id}
    subs = sub_ids or set()
    turns: list[TranscriptTurn] = []
    for index, message in enumerate(checkpoint.messages):
        if message.role == "tool" and message.tool_call_id in {c.id for t in turns for c in t.calls}:
            continue  # shown beside its call
        turns.append(TranscriptTurn(index=index, role=message.role, content=_content(message)))
        for call in message.tool_calls:
            shown = ShownCall(id=call.id, name=call.name, arguments=_json(call.arguments))
            answer = results.get(call.id)
            if answer is not None:
                shown.result, shown.has_result = _content(answer), True
            sub = child_session_id(checkpoint.session_id, call)  # as the sub-agent's run names its session
            shown.sub_session = sub if sub in subs else None
            turns[-1].calls.append(shown)
    return turns


def _content(message: Message) -> str:
    if message.role != "tool":
        return message.content or ""
    try:
        return _json(message.result())
    except (ValueError, TypeError):
        return message.content or ""


def sub_sessions(ctx: DashboardContext, session_id: str) -> list[str]:
    """The sub-agent sessions of `session_id`: ids `<session>.sub-<call id>` whose checkpoint names it as parent."""
    prefix = f"{session_id}.sub-"
    found = []
    for candidate in sync(ctx.bundle.sessions(None)):
        if candidate.startswith(prefix):
            checkpoint: Checkpoint | None = sync(ctx.bundle.checkpoints.load(candidate))
            if checkpoint is not None and checkpoint.parent_session_id == session_id:
                found.append(candidate)
    return found


def fork_source(ctx: DashboardContext, session_id: str) -> str | None:
    """The session a default-named fork (`<source>.fork-<n>`, as `fork()` names it) came from, if it still exists."""
    source, sep, number = session_id.rpartition(".fork-")
    if not sep or not number.isdigit() or not source:
        return None
    found: Checkpoint | None = sync(ctx.bundle.checkpoints.load(source))
    return source if found is not None else None


def history_of(ctx: DashboardContext, session_id: str) -> list[HistoryEntry]:
    """The session's saves, newest first (as `lousho history`)."""
    entries = sync(get_checkpoint_history(ctx.bundle.checkpoints, validate_session_id(session_id)))
    if entries is None:
        raise ConfigurationError(f"{ctx.bundle!r} keeps no history")
    return list(entries)


def fingerprint_drift(checkpoint: Checkpoint, history: list[HistoryEntry]) -> Drift | None:
    """How the agent's fingerprint changed since the session's oldest kept save (None: nothing to compare)."""
    oldest = next((e.checkpoint.fingerprint for e in reversed(history) if e.checkpoint.fingerprint), None)
    if oldest is None or checkpoint.fingerprint is None:
        return None
    return diff_fingerprints(oldest, checkpoint.fingerprint)


def pending_approvals(ctx: DashboardContext) -> Listing[ApprovalSnapshot]:
    """Every pending approval, interrupted-call ones included (each shows its `kind`)."""
    return Listing.of(sync(ctx.bundle.approvals.pending(None)))
