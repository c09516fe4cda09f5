"""`FileApprovalStore`: approval snapshots as JSON files, one per approval (`approvals/<id>.json`)."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from lousho.approvals import (
    REOPENED,
    ApprovalSnapshot,
    InterruptedAction,
    decided_update,
    decode_snapshot,
    parse_decision,
)
from lousho.errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError
from lousho.stores.codec import PLAIN, PayloadCodec, approval_place
from lousho.stores.file_folder import Folder, atomic_write, file_name, read_file
from lousho.stores.listing import Listing, read_each, waiting

__all__ = ["FileApprovalStore"]


class FileApprovalStore:
    """Approval snapshots, one file each; `decide` holds the approval's lock, so exactly one caller wins."""

    def __init__(self, directory: str | os.PathLike[str] | Folder, *, codec: PayloadCodec = PLAIN) -> None:
        """`codec`: encodes each snapshot file (issue #17)."""
        self._folder = directory if isinstance(directory, Folder) else Folder(directory)
        self._codec = codec

    def _encode(self, snapshot: ApprovalSnapshot) -> bytes:
        return self._codec.encode_text(snapshot.model_dump_json(), approval_place(snapshot.id)).encode()

    def _decode(self, approval_id: str, raw: str | bytes) -> ApprovalSnapshot:
        return decode_snapshot(approval_id, self._codec.decode_text(raw, approval_place(approval_id)))

    def _path(self, approval_id: str) -> Path:
        return self._folder.approvals / f"{file_name(approval_id)}.json"

    def save(self, snapshot: ApprovalSnapshot) -> None:
        with self._folder.locked(f"approval-{file_name(snapshot.id)}"), self._folder.translate():
            atomic_write(self._path(snapshot.id), self._encode(snapshot))

    def load(self, approval_id: str) -> ApprovalSnapshot | None:
        with self._folder.translate():
            raw = read_file(self._path(approval_id))
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
        with self._folder.locked(f"approval-{file_name(approval_id)}"):
            snapshot = self.load(approval_id)
            if snapshot is None:
                raise ApprovalNotFoundError(
                    f"no approval {approval_id!r} in {self._folder.root}; check the id and the store"
                )
            if snapshot.status != "pending":
                raise ApprovalAlreadyResolvedError(
                    f"approval {approval_id!r} was already {snapshot.status} at {snapshot.decided_at}; it is not run again"
                )
            decided = snapshot.model_copy(update=decided_update(snapshot, approved, note, action, result))
            with self._folder.translate():
                atomic_write(self._path(approval_id), self._encode(decided))
            return decided

    def reopen(self, approval_id: str) -> None:
        """Put a decided approval back to pending; an unknown id is left alone."""
        with self._folder.locked(f"approval-{file_name(approval_id)}"):
            snapshot = self.load(approval_id)
            if snapshot is not None:
                reopened = snapshot.model_copy(update=REOPENED)
                with self._folder.translate():
                    atomic_write(self._path(approval_id), self._encode(reopened))

    def delete(self, approval_id: str) -> None:
        """Forget an approval (its session was deleted); an unknown id is left alone."""
        with self._folder.locked(f"approval-{file_name(approval_id)}"), self._folder.translate():
            self._path(approval_id).unlink(missing_ok=True)

    def pending(self, session_id: str | None = None) -> Listing[ApprovalSnapshot]:
        """Approvals waiting for a decision, oldest first; those that cannot be read are named in `skipped`."""
        with self._folder.translate():
            raws = [
                (name, read_file(self._folder.approvals / f"{name}.json"))
                for name in self._folder.names(self._folder.approvals)
            ]
        found = [(name, raw) for name, raw in raws if raw is not None]
        return waiting(read_each(found, self._decode, what="approval"), session_id)

    def reseal(self, session_ids: Collection[str] | None = None) -> int:
        """Write every approval again (only those of `session_ids` when given), pending or decided, sealed under
        the codec's first key to its place (issue #31, `lousho reseal`); how many. Each one is read and written
        under its own lock: one that does not open raises, and it and those after it are left as they were."""
        count = 0
        with self._folder.translate():
            names = self._folder.names(self._folder.approvals)
        for name in names:
            with self._folder.locked(f"approval-{file_name(name)}"):
                snapshot = self.load(name)
                if snapshot is None or (session_ids is not None and snapshot.session_id not in session_ids):
                    continue
                with self._folder.translate():
                    atomic_write(self._path(name), self._encode(snapshot))
                count += 1
        return count

    def put_raw(self, approval_id: str, raw: str | bytes) -> None:
        """Store `raw` as an approval's snapshot without checking it (tests of corrupt records)."""
        with self._folder.locked(f"approval-{file_name(approval_id)}"), self._folder.translate():
            atomic_write(self._path(approval_id), raw.encode() if isinstance(raw, str) else raw)
