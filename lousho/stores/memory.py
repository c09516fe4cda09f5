"""`memory_store()`: checkpoints and approvals in this process, for tests and single-process use.

Records are kept as JSON, as a real store keeps them, so what would not survive
a real store (a business_state that is not JSON) fails here too.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from lousho.approvals import ApprovalSnapshot, utc_now
from lousho.checkpoint import Checkpoint, HistoryEntry, check_version, decode_checkpoint
from lousho.errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError

__all__ = ["MemoryApprovalStore", "MemoryCheckpointStore", "MemoryStore", "memory_store"]


class MemoryCheckpointStore:
    """Latest checkpoint per session plus a bounded history ring (`history_limit`, 0 keeps none)."""

    def __init__(self, *, history_limit: int = 50) -> None:
        self.history_limit = history_limit
        self._latest: dict[str, str] = {}
        self._versions: dict[str, int] = {}
        self._history: dict[str, deque[tuple[str, str]]] = {}
        self._lock = threading.Lock()

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        raw = checkpoint.model_dump_json()
        with self._lock:
            check_version(session_id, self._versions.get(session_id), checkpoint)
            self._latest[session_id] = raw
            self._versions[session_id] = checkpoint.version
            if self.history_limit > 0:
                ring = self._history.setdefault(session_id, deque(maxlen=self.history_limit))
                ring.appendleft((utc_now(), raw))

    def load(self, session_id: str) -> Checkpoint | None:
        raw = self._latest.get(session_id)
        return None if raw is None else decode_checkpoint(session_id, raw)

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        with self._lock:
            self._latest.pop(session_id, None)
            self._versions.pop(session_id, None)
            if not keep_history:
                self._history.pop(session_id, None)

    def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry]:
        entries = list(self._history.get(session_id, ()))[:limit]
        result = []
        for saved_at, raw in entries:
            checkpoint = decode_checkpoint(session_id, raw)
            result.append(
                HistoryEntry(
                    step=checkpoint.step_index, saved_at=saved_at, status=checkpoint.status, checkpoint=checkpoint
                )
            )
        return result

    def sessions(self) -> list[str]:
        return sorted(self._latest)

    def put_raw(self, session_id: str, raw: str) -> None:
        """Store a raw value as the latest checkpoint (tests of corrupt and foreign records)."""
        self._latest[session_id] = raw


class MemoryApprovalStore:
    """Approval snapshots by id; `decide` is atomic across threads."""

    def __init__(self) -> None:
        self._snapshots: dict[str, str] = {}
        self._lock = threading.Lock()

    def save(self, snapshot: ApprovalSnapshot) -> None:
        with self._lock:
            self._snapshots[snapshot.id] = snapshot.model_dump_json()

    def load(self, approval_id: str) -> ApprovalSnapshot | None:
        raw = self._snapshots.get(approval_id)
        return None if raw is None else ApprovalSnapshot.model_validate_json(raw)

    def decide(self, approval_id: str, approved: bool, note: str | None) -> ApprovalSnapshot:
        with self._lock:
            snapshot = self.load(approval_id)
            if snapshot is None:
                raise ApprovalNotFoundError(f"no approval {approval_id!r} in this store; check the id and the store")
            if snapshot.status != "pending":
                raise ApprovalAlreadyResolvedError(
                    f"approval {approval_id!r} was already {snapshot.status} at {snapshot.decided_at}; it is not run again"
                )
            decided = snapshot.model_copy(
                update={"status": "approved" if approved else "rejected", "note": note, "decided_at": utc_now()}
            )
            self._snapshots[approval_id] = decided.model_dump_json()
            return decided

    def reopen(self, approval_id: str) -> None:
        with self._lock:
            snapshot = self.load(approval_id)
            if snapshot is not None:
                reopened = snapshot.model_copy(update={"status": "pending", "note": None, "decided_at": None})
                self._snapshots[approval_id] = reopened.model_dump_json()

    def pending(self, session_id: str | None = None) -> list[ApprovalSnapshot]:
        snapshots = [ApprovalSnapshot.model_validate_json(raw) for raw in list(self._snapshots.values())]
        return sorted(
            (s for s in snapshots if s.status == "pending" and (session_id is None or s.session_id == session_id)),
            key=lambda s: s.created_at,
        )


@dataclass(kw_only=True)
class MemoryStore:
    """A store bundle: `.checkpoints` and `.approvals`."""

    checkpoints: MemoryCheckpointStore = field(default_factory=MemoryCheckpointStore)
    approvals: MemoryApprovalStore = field(default_factory=MemoryApprovalStore)


def memory_store(history_limit: int = 50) -> MemoryStore:
    """Checkpoints (with a history ring of `history_limit` saves per session) and approvals, in memory."""
    return MemoryStore(checkpoints=MemoryCheckpointStore(history_limit=history_limit), approvals=MemoryApprovalStore())
