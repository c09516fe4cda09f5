"""Looking at sessions and cleaning them up: list, show, history, compare, delete, prune (issue #32).

Each function takes a `Target` and returns plain typed data: `lousho sessions` prints it as a table or
JSON, the dashboard as a page; neither reads a store itself.

A listing never opens a payload: a session's status comes from the store's status index (and the fleet's
parked marks), and the rest of its row from its head's plain fields (`checkpoints.heads()`,
`lousho.stores.head_fields`): agent, steps, message count, when it was last saved. So a store whose payloads
this process cannot open (an encrypted store without `LOUSHO_PAYLOAD_KEYS`) lists in full, and a listing
costs no decryption or message parsing. Rows come newest save first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from lousho.checkpoint import Checkpoint, ForkOrigin, HistoryEntry, get_checkpoint_history, validate_session_id
from lousho.errors import ConfigurationError, SessionLiveError, SessionNotFoundError
from lousho.operations.liveness import LiveReason, live_sessions
from lousho.operations.target import Target, load_session, sync
from lousho.stores.head_fields import HeadFields, fields_of_checkpoint
from lousho.stores.listing import Listing, read_each
from lousho.trajectory import TrajectoryComparison, compare_trajectories

__all__ = [
    "CHECKPOINT_STATUSES",
    "STATUSES",
    "Deleted",
    "LiveReason",
    "SessionPage",
    "SessionRow",
    "SessionStatusChoice",
    "SessionView",
    "compare_sessions",
    "delete_sessions",
    "list_sessions",
    "live_sessions",
    "prune_sessions",
    "session_history",
    "show_session",
    "sub_sessions",
]

SessionStatusChoice = Literal["in-progress", "awaiting-approval", "finished", "parked"]
STATUSES: tuple[str, ...] = ("in-progress", "awaiting-approval", "finished", "parked")
"""The statuses a listing filters on: the checkpoint's, and the fleet's 'parked'."""
CHECKPOINT_STATUSES = ("in-progress", "awaiting-approval", "finished")


@dataclass(frozen=True)
class SessionRow:
    """One session of a listing: what its status index and its head's plain fields hold (no payload)."""

    session_id: str
    status: str
    agent: str | None
    steps: int | None
    messages: int | None
    approval_id: str | None
    parked_reason: str | None
    aborted: bool
    parent_session_id: str | None
    saved_at: str | None = None
    """When the session was last saved (ISO 8601), None when its store cannot say."""


@dataclass(frozen=True)
class SessionPage:
    """One page of a listing: `rows` from `start`, of `total` matching ids (all of them when `limit` is None)."""

    rows: Listing[SessionRow]
    total: int
    start: int
    limit: int | None

    @property
    def next_start(self) -> int | None:
        if self.limit is None or self.start + self.limit >= self.total:
            return None
        return self.start + self.limit

    @property
    def previous_start(self) -> int | None:
        if self.limit is None or self.start <= 0:
            return None
        return max(0, self.start - self.limit)


def _statuses(target: Target, status: str | None, parked: dict[str, str]) -> tuple[Listing[str], dict[str, str]]:
    """The ids to list and each one's status, from the status indexes only (no payload is opened)."""
    if status is not None and status not in STATUSES:
        raise ConfigurationError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    if status == "parked":
        return Listing(sorted(parked)), dict.fromkeys(parked, "parked")
    ids: Listing[str] = Listing.of(sync(target.bundle.sessions(status)))
    statuses: dict[str, str] = {}
    for each in [status] if status is not None else CHECKPOINT_STATUSES:
        for session_id in ids if status is not None else Listing.of(sync(target.bundle.sessions(each))):
            statuses[session_id] = each
    for session_id in parked:
        statuses[session_id] = "parked"
    if status is not None:  # a parked session's checkpoint says 'in-progress': it is listed under 'parked' only
        ids = Listing([s for s in ids if s not in parked], skipped=ids.skipped)
    return ids, statuses


def list_sessions(
    target: Target, status: str | None = None, *, search: str = "", start: int = 0, limit: int | None = None
) -> SessionPage:
    """The sessions of one status (all when None) whose id contains `search`, newest save first (then by id),
    `limit` of them from `start` (all when None); those that cannot be read are named in `rows.skipped`. No
    payload is opened (issue #32)."""
    parked = target.parked_reasons()
    ids, statuses = _statuses(target, status, parked)
    matching = [session_id for session_id in ids if search.strip() in session_id]
    heads = read_heads(target, matching)
    ordered = sorted(sorted(heads, key=lambda h: h.session_id), key=_saved_key, reverse=True)
    start = max(0, start)
    wanted = ordered[start:] if limit is None else ordered[start : start + limit]
    rows = [_row(target, head, statuses.get(head.session_id), parked.get(head.session_id)) for head in wanted]
    listing = Listing(rows, skipped={**ids.skipped, **heads.skipped})
    return SessionPage(listing, total=len(ordered), start=start, limit=limit)


def read_heads(target: Target, session_ids: list[str]) -> Listing[HeadFields]:
    """The plain head fields of each session (`checkpoints.heads()`); a store without it: each checkpoint loaded."""
    heads = getattr(target.bundle.checkpoints, "heads", None)
    if callable(heads):
        return Listing.of(sync(heads(session_ids)))

    def loaded(session_id: str, _: object) -> HeadFields | None:
        checkpoint: Checkpoint | None = sync(target.bundle.checkpoints.load(session_id))
        return None if checkpoint is None else fields_of_checkpoint(checkpoint)

    return read_each(((session_id, None) for session_id in session_ids), loaded, what="session")


def _saved_key(head: HeadFields) -> datetime:
    """A head's save time for sorting (the oldest possible when its store cannot say: listed last)."""
    try:
        saved = datetime.fromisoformat(head.saved_at or "")
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return saved if saved.tzinfo else saved.replace(tzinfo=UTC)


def _row(target: Target, head: HeadFields, status: str | None, parked: str | None) -> SessionRow:
    shown = "parked" if parked is not None else status or head.status
    return SessionRow(
        session_id=head.session_id,
        status=shown,
        agent=head.agent_name,
        steps=head.step_index,
        messages=head.messages,
        approval_id=head.approval_id,
        parked_reason=parked,
        aborted=_aborted(target, head.session_id) and shown != "finished",
        parent_session_id=head.parent_session_id,
        saved_at=head.saved_at,
    )


def _aborted(target: Target, session_id: str) -> bool:
    store = target.fleet_store
    if store is None:
        return False
    from lousho.fleet.keys import FleetKeys
    from lousho.stores.redis_common import redis_errors

    with redis_errors(store.client, f"read the abort flag of {session_id!r}"):
        return bool(store.client.exists(FleetKeys(store).abort(session_id)))


def last_answer(checkpoint: Checkpoint) -> str:
    """The newest assistant text of the transcript ('' when none)."""
    return next((m.content or "" for m in reversed(checkpoint.messages) if m.role == "assistant" and m.content), "")


@dataclass(frozen=True)
class SessionView:
    """A session as `show` and the session page show it: its checkpoint, the status shown, why it is parked."""

    checkpoint: Checkpoint
    status: str
    parked_reason: str | None
    forked_from: ForkOrigin | None
    sub_sessions: list[str]


def show_session(target: Target, session_id: str, *, with_sub_sessions: bool = False) -> SessionView:
    """The session: 'parked' and its reason on the fleet where it is parked, else its checkpoint's status."""
    checkpoint = load_session(target, session_id)
    parked = target.parked_reasons().get(checkpoint.session_id)
    return SessionView(
        checkpoint=checkpoint,
        status="parked" if parked is not None else checkpoint.status,
        parked_reason=parked,
        forked_from=checkpoint.forked_from,
        sub_sessions=sub_sessions(target, session_id) if with_sub_sessions else [],
    )


def sub_sessions(target: Target, session_id: str) -> list[str]:
    """The sub-agent sessions of `session_id`: ids `<session>.sub-<call id>` whose checkpoint names it as parent."""
    prefix = f"{session_id}.sub-"
    found = []
    for candidate in sync(target.bundle.sessions(None)):
        if candidate.startswith(prefix):
            checkpoint: Checkpoint | None = sync(target.bundle.checkpoints.load(candidate))
            if checkpoint is not None and checkpoint.parent_session_id == session_id:
                found.append(candidate)
    return found


def session_history(target: Target, session_id: str, limit: int | None = None) -> list[HistoryEntry]:
    """The session's saves, newest first (`limit`: the newest N); `SessionNotFoundError` for an unknown one."""
    if limit is not None and limit < 1:
        raise ConfigurationError(f"the history's limit is a number of saves, 1 or more, not {limit}")
    load_session(target, session_id)
    entries = sync(get_checkpoint_history(target.bundle.checkpoints, validate_session_id(session_id), limit))
    if entries is None:
        raise ConfigurationError(f"{target.bundle!r} keeps no history")
    return list(entries)


def compare_sessions(target: Target, a: str, b: str) -> TrajectoryComparison:
    """Where two runs diverged, step by step (`compare_trajectories`)."""
    return compare_trajectories(load_session(target, a), load_session(target, b))


@dataclass(frozen=True)
class Deleted:
    """What `delete_sessions` and `prune_sessions` removed (or, dry, would remove), and what they kept."""

    sessions: list[str]
    dry_run: bool = False
    kept: dict[str, LiveReason] = field(default_factory=dict)
    """Prune: the sessions old enough that were kept because they are live, each with why."""
    aborted: list[str] = field(default_factory=list)
    """A forced delete: the live sessions whose run it aborted before deleting them (or, dry, would abort)."""


STOP_WAIT_S = 10.0
"""How long a forced delete waits, after the abort, for a live session's worker to stop, before it deletes."""


def delete_sessions(
    target: Target,
    session_ids: list[str],
    *,
    dry_run: bool = False,
    force: bool = False,
    stop_wait_s: float = STOP_WAIT_S,
) -> Deleted:
    """Forget each session: its checkpoint, history, the approvals it paused on and, on a fleet, every key the
    fleet keeps for it (so the reaper never requeues it). Every id is checked first: an unknown one raises
    `SessionNotFoundError`, and a live one (`live_sessions`) `SessionLiveError`, and nothing is deleted.

    `force`: each live session's run is aborted first (`Client.abort`: its running tools see their signal), and
    its worker given up to `stop_wait_s` to stop; then it is deleted all the same. A worker still on it commits
    nothing after that: the session's incarnation (its epoch key) went with it, so its late writes are refused."""
    for session_id in session_ids:
        load_session(target, session_id)
    live = live_sessions(target, session_ids)
    if live and not force:
        raise SessionLiveError({session_id: why.explanation for session_id, why in live.items()})
    if not dry_run:
        if live:
            _abort_and_wait(target, list(live), stop_wait_s)
        for session_id in session_ids:
            target.bundle.delete(session_id)
    return Deleted(list(session_ids), dry_run=dry_run, aborted=list(live))


def _abort_and_wait(target: Target, session_ids: list[str], stop_wait_s: float) -> None:
    """Abort each session's run, then wait up to `stop_wait_s` until none of them is live."""
    client = target.fleet_client("deleting a live session with --force")
    for session_id in session_ids:
        client.abort(session_id)
    deadline = time.monotonic() + stop_wait_s
    while live_sessions(target, session_ids) and time.monotonic() < deadline:
        time.sleep(0.1)


def prune_sessions(target: Target, status: str, older_than: timedelta, *, dry_run: bool = False) -> Deleted:
    """Delete the sessions of `status` last saved longer than `older_than` ago (a Ctrl-C'd run left
    in-progress, a job no worker serves, finished runs past their keep). A session whose last save time cannot
    be read is kept, and so is a live one (`live_sessions`: a worker is running it), named in `kept` with why."""
    if older_than < timedelta(0):
        raise ConfigurationError(f"--older-than is an age, not a negative time ({older_than})")
    cutoff = datetime.now(UTC) - older_than
    ids, _ = _statuses(target, status, target.parked_reasons())
    heads = read_heads(target, list(ids))  # the listing's save times: its age column and prune agree
    old = [h.session_id for h in heads if h.saved_at is not None and _saved_key(h) < cutoff]
    live = live_sessions(target, old)
    stopped = [session_id for session_id in old if session_id not in live]
    if not dry_run:
        for session_id in stopped:
            target.bundle.delete(session_id)
    return Deleted(stopped, dry_run=dry_run, kept=live)


def require_session(target: Target, session_id: str) -> None:
    """`SessionNotFoundError` unless the session has a checkpoint."""
    if sync(target.bundle.checkpoints.load(validate_session_id(session_id))) is None:
        raise SessionNotFoundError(session_id, repr(target.bundle))
