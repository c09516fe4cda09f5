"""`memory_store()`: checkpoints and approvals in this process, for tests and single-process use.

Like the other stores, a session's messages are kept once and each saved checkpoint (the
latest and every history entry) refers to a prefix of them, so a save costs the same at
step 500 as at step 10. Every new message and every head is still turned into JSON, as a
real store would, so what would not survive a real store (a business_state that is not
JSON) fails here too.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Collection, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, overload

from lousho.approvals import (
    REOPENED,
    ApprovalSnapshot,
    InterruptedAction,
    decided_update,
    decode_snapshot,
    parse_decision,
    utc_now,
)
from lousho.checkpoint import Checkpoint, HistoryEntry, check_version, decode_checkpoint
from lousho.errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError, CorruptCheckpointError
from lousho.messages import Message
from lousho.store_bundle import Pruned, SessionsOfCheckpoints, cutoff_of
from lousho.stores.codec import PLAIN, PayloadCodec, approval_place
from lousho.stores.head_fields import HeadFields, head_fields
from lousho.stores.listing import Listing, read_each, waiting

if TYPE_CHECKING:
    from lousho.stores.mapping import MappingStore

__all__ = ["MemoryApprovalStore", "MemoryCheckpointStore", "MemoryStore", "memory_store"]


@dataclass(frozen=True)
class _Record:
    """One saved checkpoint: its JSON without messages, and how many of the transcript's messages it has."""

    head: str
    transcript: list[Message]
    """The session's append-only transcript, shared by its records (messages are frozen)."""
    count: int

    def checkpoint(self, session_id: str, codec: PayloadCodec = PLAIN, *, history: bool = False) -> Checkpoint:
        head = _decode_head(session_id, self.head, codec, history=history, count=self.count)
        return head.model_copy(update={"messages": self.transcript[: self.count]})


def _decode_head(
    session_id: str, raw: str, codec: PayloadCodec, *, history: bool = False, count: int | None = None
) -> Checkpoint:
    """A stored head, its sealed part opened by `codec` (issue #17) as the session's head or a history entry
    of `count` messages (issue #31); not JSON is left to `decode_checkpoint`."""
    try:
        fields = json.loads(raw)
    except ValueError:
        return decode_checkpoint(session_id, raw)
    if not isinstance(fields, dict):
        return decode_checkpoint(session_id, fields)
    return decode_checkpoint(session_id, codec.open_fields(fields, session_id, history=history, count=count))


def _transcript_for(previous: _Record | str | None, messages: list[Message]) -> list[Message]:
    """The previous transcript extended with the new messages, or a new one if the save rewrote it."""
    count = previous.count if isinstance(previous, _Record) else 0
    if (
        isinstance(previous, _Record)
        and 0 < count == len(previous.transcript) <= len(messages)
        # A session's transcript only grows and messages are frozen: the same first and last
        # objects mean the same prefix (O(1), so a save costs the same at step 500 as at 10).
        and messages[0] is previous.transcript[0]
        and messages[count - 1] is previous.transcript[-1]
    ):
        new = messages[previous.count :]
        for message in new:
            message.model_dump_json()  # JSON-only, as a real store
        previous.transcript.extend(new)
        return previous.transcript
    for message in messages:
        message.model_dump_json()
    return list(messages)


class MemoryCheckpointStore:
    """Latest checkpoint per session plus a bounded history ring (`history_limit`, 0 keeps none)."""

    def __init__(self, *, history_limit: int = 50, codec: PayloadCodec = PLAIN) -> None:
        """`codec`: seals the heads' secret fields (issue #17); the messages stay objects of this process."""
        self.history_limit = history_limit
        self.codec = codec.for_store("memory")
        self._latest: dict[str, _Record | str] = {}
        self._versions: dict[str, int] = {}
        self._history: dict[str, deque[tuple[str, _Record]]] = {}
        self._saved_at: dict[str, datetime] = {}
        """When each latest checkpoint was saved: what `prune()` compares (issue #16)."""
        self._lock = threading.Lock()

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        bodies = self.codec.seal_record(checkpoint, session_id, history=self.history_limit > 0)
        head, entry = bodies[0], bodies[-1]
        with self._lock:
            check_version(session_id, self._versions.get(session_id), checkpoint)
            transcript = _transcript_for(self._latest.get(session_id), checkpoint.messages)
            record = _Record(head, transcript, len(checkpoint.messages))
            self._latest[session_id] = record
            self._versions[session_id] = checkpoint.version
            saved_at = self._saved_at[session_id] = datetime.fromisoformat(utc_now())
            if self.history_limit > 0:
                ring = self._history.setdefault(session_id, deque(maxlen=self.history_limit))
                ring.appendleft((saved_at.isoformat(), _Record(entry, transcript, record.count)))

    def load(self, session_id: str) -> Checkpoint | None:
        stored = self._latest.get(session_id)
        if stored is None:
            return None
        if isinstance(stored, _Record):
            return stored.checkpoint(session_id, self.codec)
        return _decode_head(session_id, stored, self.codec)

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        with self._lock:
            self._latest.pop(session_id, None)
            self._versions.pop(session_id, None)
            self._saved_at.pop(session_id, None)
            if not keep_history:
                self._history.pop(session_id, None)

    def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry]:
        result = []
        for saved_at, record in list(self._history.get(session_id, ()))[:limit]:
            checkpoint = record.checkpoint(session_id, self.codec, history=True)
            result.append(
                HistoryEntry(
                    step=checkpoint.step_index, saved_at=saved_at, status=checkpoint.status, checkpoint=checkpoint
                )
            )
        return result

    def sessions(self, status: str | None = None) -> Listing[str]:
        """Session ids with a latest checkpoint, sorted; with `status`, those of that status, and the
        ones whose record cannot be read named in `skipped` (issue #21)."""
        if status is None:
            return Listing(sorted(self._latest))

        def matching(session_id: str, stored: _Record | str) -> str | None:
            head = stored.head if isinstance(stored, _Record) else stored
            return session_id if decode_checkpoint(session_id, head).status == status else None

        return read_each(sorted(self._latest.items()), matching, what="session")

    def heads(self, session_ids: Sequence[str]) -> Listing[HeadFields]:
        """The plain head fields of each named session that has a checkpoint, in the order given, never opening a
        payload (issue #32: what listings read); a head that cannot be read is named in `skipped`."""
        with self._lock:
            found = [(s, self._latest[s], self._saved_at.get(s)) for s in session_ids if s in self._latest]

        def read(session_id: str, stored: tuple[_Record | str, datetime | None]) -> HeadFields:
            record, saved = stored
            raw, count = (record.head, record.count) if isinstance(record, _Record) else (record, None)
            return head_fields(session_id, raw, saved_at=saved.isoformat() if saved else None, messages=count)

        return read_each(((s, (r, t)) for s, r, t in found), read, what="session")

    def prune(self, older_than: datetime | timedelta) -> Pruned:
        """Remove finished checkpoints last saved before the cutoff and history entries saved before it;
        unfinished sessions stay (issue #16: the same `prune()` as every other store)."""
        cutoff = cutoff_of(older_than)
        removed = dropped = 0
        with self._lock:
            for session_id, saved_at in list(self._saved_at.items()):
                stored = self._latest[session_id]
                head = stored.head if isinstance(stored, _Record) else stored
                if saved_at < cutoff and _status(session_id, head) == "finished":
                    del self._latest[session_id], self._versions[session_id], self._saved_at[session_id]
                    removed += 1
            for session_id, ring in list(self._history.items()):
                kept = [(stamp, record) for stamp, record in ring if datetime.fromisoformat(stamp) >= cutoff]
                dropped += len(ring) - len(kept)
                if kept:
                    self._history[session_id] = deque(kept, maxlen=ring.maxlen)
                else:
                    del self._history[session_id]
        return Pruned(checkpoints=removed, history=dropped)

    def put_raw(self, session_id: str, raw: str) -> None:
        """Store a raw value as the latest checkpoint (tests of corrupt, foreign and old records)."""
        self._latest[session_id] = raw
        self._saved_at[session_id] = datetime.fromisoformat(utc_now())


def _status(session_id: str, head: str) -> str | None:
    """The status of a stored head; None when it cannot be read (such a record is never pruned)."""
    try:
        return decode_checkpoint(session_id, head).status
    except CorruptCheckpointError:
        return None


class MemoryApprovalStore:
    """Approval snapshots by id; `decide` is atomic across threads.

    `snapshots` (approval id -> snapshot JSON) and `lock` let the mapping store keep its approvals
    in the user's mapping with this very code (issue #16); by default a dict of this process."""

    def __init__(
        self,
        snapshots: MutableMapping[str, str] | None = None,
        *,
        lock: threading.RLock | None = None,
        codec: PayloadCodec = PLAIN,
    ) -> None:
        """`codec`: encodes each snapshot's JSON (issue #17)."""
        self._snapshots: MutableMapping[str, str] = {} if snapshots is None else snapshots
        self._lock = lock or threading.RLock()
        self._codec = codec

    def _encode(self, snapshot: ApprovalSnapshot) -> str:
        return self._codec.encode_text(snapshot.model_dump_json(), approval_place(snapshot.id))

    def _decode(self, approval_id: str, raw: str) -> ApprovalSnapshot:
        return decode_snapshot(approval_id, self._codec.decode_text(raw, approval_place(approval_id)))

    def save(self, snapshot: ApprovalSnapshot) -> None:
        with self._lock:
            self._snapshots[snapshot.id] = self._encode(snapshot)

    def load(self, approval_id: str) -> ApprovalSnapshot | None:
        with self._lock:
            raw = self._snapshots.get(approval_id)
        return None if raw is None else self._decode(approval_id, raw)

    def decide(
        self,
        approval_id: str,
        approved: bool,
        note: str | None,
        action: InterruptedAction | None = None,
        result: Any = None,
    ) -> ApprovalSnapshot:
        parse_decision({"id": approval_id, "approved": approved, "note": note})  # strict, before any write (issue #21)
        with self._lock:
            snapshot = self.load(approval_id)
            if snapshot is None:
                raise ApprovalNotFoundError(f"no approval {approval_id!r} in this store; check the id and the store")
            if snapshot.status != "pending":
                raise ApprovalAlreadyResolvedError(
                    f"approval {approval_id!r} was already {snapshot.status} at {snapshot.decided_at}; it is not run again"
                )
            decided = snapshot.model_copy(update=decided_update(snapshot, approved, note, action, result))
            self._snapshots[approval_id] = self._encode(decided)
            return decided

    def reopen(self, approval_id: str) -> None:
        with self._lock:
            snapshot = self.load(approval_id)
            if snapshot is not None:
                reopened = snapshot.model_copy(update=REOPENED)
                self._snapshots[approval_id] = self._encode(reopened)

    def delete(self, approval_id: str) -> None:
        """Forget an approval (its session was deleted); an unknown id is left alone."""
        with self._lock:
            self._snapshots.pop(approval_id, None)

    def pending(self, session_id: str | None = None) -> Listing[ApprovalSnapshot]:
        """Approvals waiting for a decision, oldest first; those that cannot be read are named in `skipped`."""
        with self._lock:
            stored = list(self._snapshots.items())
        return waiting(read_each(stored, self._decode, what="approval"), session_id)

    def reseal(self, session_ids: Collection[str] | None = None) -> int:
        """Write every approval again (only those of `session_ids` when given), pending or decided, sealed under
        the codec's first key to its place (issue #31, `lousho reseal`); how many. Each one is read and written
        under its own lock: one that does not open raises, and it and those after it are left as they were."""
        with self._lock:
            snapshots = [self._decode(approval_id, raw) for approval_id, raw in list(self._snapshots.items())]
            chosen = [s for s in snapshots if session_ids is None or s.session_id in session_ids]
            for snapshot in chosen:
                self._snapshots[snapshot.id] = self._encode(snapshot)
        return len(chosen)

    def put_raw(self, approval_id: str, raw: str) -> None:
        """Store a raw value as an approval snapshot (tests of corrupt records)."""
        with self._lock:
            self._snapshots[approval_id] = raw


@dataclass(kw_only=True)
class MemoryStore(SessionsOfCheckpoints):
    """A store bundle (`lousho.StoreBundle`): `.checkpoints`, `.approvals`, `sessions()`, `prune()`, `delete()`."""

    checkpoints: MemoryCheckpointStore = field(default_factory=MemoryCheckpointStore)
    approvals: MemoryApprovalStore = field(default_factory=MemoryApprovalStore)


@overload
def memory_store(history_limit: int = 50, *, codec: PayloadCodec = PLAIN) -> MemoryStore: ...


@overload
def memory_store(
    history_limit: int = 50, *, storage: MutableMapping[Any, Any], codec: PayloadCodec = PLAIN
) -> MappingStore: ...


def memory_store(
    history_limit: int = 50, *, storage: MutableMapping[Any, Any] | None = None, codec: PayloadCodec = PLAIN
) -> MemoryStore | MappingStore:
    """Checkpoints (with a history ring of `history_limit` saves per session) and approvals, in memory.

    With `storage` (a dict, a `shelve`, a `dbm`: any mapping of str keys to str values), they live in that
    mapping instead, as JSON text: the mapping store, `mapping_store(storage)` (the reference's
    `memoryStore` over a `LocalStorage`, issue #16). `codec`: the payload codec (issue #17)."""
    if storage is not None:
        from lousho.stores.mapping import MappingStore  # it builds on this module

        return MappingStore(storage, history_limit=history_limit, codec=codec)
    return MemoryStore(
        checkpoints=MemoryCheckpointStore(history_limit=history_limit, codec=codec),
        approvals=MemoryApprovalStore(codec=codec),
    )
