"""`StoreBundle`: what every built-in store is, one shape for all of them (issue #16).

A bundle holds a session's checkpoints (with their history ring) and the approvals its runs wait
on, and manages sessions as a whole: `sessions(status=)`, `prune()`, `delete()`. `create_agent`,
the CLI (through `LoushoSettings.store()` and the URL registry `lousho.stores.registry`) and the
contract suite rely on this shape instead of probing each store with `hasattr`.

It lives beside `CheckpointStore` and `ApprovalStore`, not in `lousho.stores`, so the run loop can
name it without importing a store (the import contracts in pyproject.toml).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple, Protocol, cast, runtime_checkable

from lousho.approvals import ApprovalSnapshot, ApprovalStore
from lousho.checkpoint import Checkpoint, CheckpointStore, HistoryEntry
from lousho.errors import SDKError

__all__ = ["BundleCheckpoints", "ManagedCheckpoints", "Pruned", "SessionsOfCheckpoints", "StoreBundle", "cutoff_of"]


class Pruned(NamedTuple):
    """What `prune()` removed: latest checkpoints, and history entries."""

    checkpoints: int
    history: int


@runtime_checkable
class BundleCheckpoints(CheckpointStore, Protocol):
    """A bundle's checkpoint store: `CheckpointStore` with the history ring (so it can fork) and a listing."""

    def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry]: ...

    def sessions(self, status: str | None = None) -> list[str]: ...


@runtime_checkable
class StoreBundle(Protocol):
    """A store bundle: memory, SQLite/PostgreSQL (`SqlStore`), files, Redis and mappings are all one.

    - `checkpoints`: the session's latest checkpoint and its history ring (`BundleCheckpoints`).
    - `approvals`: the approval snapshots paused runs wait on (`ApprovalStore`).
    - `sessions(status=None)`: the session ids with a latest checkpoint, sorted, optionally of one
      status; a `lousho.stores.listing.Listing` whose `skipped` names the records it could not read.
    - `prune(older_than)`: remove finished checkpoints last saved before the cutoff, history entries
      saved before it, and the messages of sessions left with neither; unfinished sessions stay.
    - `delete(session_id, keep_history=False)`: forget a session (`checkpoints.delete`).
    """

    @property
    def checkpoints(self) -> BundleCheckpoints: ...

    @property
    def approvals(self) -> ApprovalStore: ...

    def sessions(self, status: str | None = None) -> list[str]: ...

    def prune(self, older_than: datetime | timedelta) -> Pruned: ...

    def delete(self, session_id: str, keep_history: bool = False) -> None: ...


class ManagedCheckpoints(Protocol):
    """A checkpoint store that lists and deletes its sessions itself (every built-in one does)."""

    def sessions(self, status: str | None = None) -> list[str]: ...

    def delete(self, session_id: str, keep_history: bool = False) -> None: ...


class PrunableCheckpoints(ManagedCheckpoints, Protocol):
    """One that prunes itself too (all but Redis', whose bundle prunes the fleet's keys as well)."""

    def prune(self, older_than: datetime | timedelta) -> Pruned: ...


class DeletableApprovals(Protocol):
    """An approval store that forgets an approval (every built-in one does; a bundle declares its own)."""

    def load(self, approval_id: str) -> ApprovalSnapshot | None: ...

    def pending(self, session_id: str | None = None) -> list[ApprovalSnapshot]: ...

    def delete(self, approval_id: str) -> None: ...


class SessionsOfCheckpoints:
    """`sessions`, `prune` and `delete` of a bundle, answered by its checkpoint store: one way for every
    built-in bundle (a bundle that prunes more than its checkpoints, as Redis does, overrides `prune`)."""

    checkpoints: ManagedCheckpoints
    approvals: DeletableApprovals

    def sessions(self, status: str | None = None) -> list[str]:
        return self.checkpoints.sessions(status)

    def prune(self, older_than: datetime | timedelta) -> Pruned:
        return cast(PrunableCheckpoints, self.checkpoints).prune(older_than)

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        """Forget the session, and unless its history is kept, the approvals it paused on: they hold its
        transcript too (issue #16). Those its latest save, its history ring or the pending ones name; a
        sub-agent's approval is its outermost parent's, and goes with the parent."""
        approvals = [] if keep_history else self._approvals_of(session_id)
        self.checkpoints.delete(session_id, keep_history)
        for approval_id in approvals:
            self.approvals.delete(approval_id)

    def _approvals_of(self, session_id: str) -> list[str]:
        named = {s.id for s in self.approvals.pending(session_id)}
        try:
            checkpoints = cast(BundleCheckpoints, self.checkpoints)  # every built-in bundle's is one, and sync
            head, saves = cast(Checkpoint | None, checkpoints.load(session_id)), checkpoints.history(session_id)
        except SDKError:  # a damaged record: the session is deleted all the same, its pending approvals with it
            head, saves = None, []
        named |= {c.approval_id for c in [head, *(e.checkpoint for e in saves)] if c is not None and c.approval_id}
        owned = []
        for approval_id in sorted(named):
            try:
                snapshot = self.approvals.load(approval_id)
            except SDKError:  # unreadable: it cannot be told whose it is, so it stays
                continue
            if snapshot is not None and snapshot.session_id == session_id:
                owned.append(approval_id)
        return owned


def cutoff_of(older_than: datetime | timedelta) -> datetime:
    """`prune()`'s cutoff as an aware UTC time: now minus a timedelta, or the datetime given (naive: UTC)."""
    if isinstance(older_than, timedelta):
        return datetime.now(UTC) - older_than
    return older_than if older_than.tzinfo else older_than.replace(tzinfo=UTC)
