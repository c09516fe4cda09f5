"""`SqlApprovalStore`: approval snapshots in SQL; `decide` is a conditional UPDATE, so exactly one caller wins."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

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
from lousho.stores.listing import Listing, read_each
from lousho.stores.sql_database import SqlDatabase

__all__ = ["SqlApprovalStore"]


class SqlApprovalStore:
    """Approval snapshots by id; `decide` is a conditional UPDATE, so exactly one caller wins."""

    def __init__(self, db: SqlDatabase, *, codec: PayloadCodec = PLAIN) -> None:
        """`codec`: encodes each snapshot's JSON (issue #17); the id, session, status and time columns stay plain."""
        self._db = db
        self._codec = codec

    def _encode(self, snapshot: ApprovalSnapshot) -> str:
        return self._codec.encode_text(snapshot.model_dump_json(), approval_place(snapshot.id))

    def _decode(self, approval_id: str, raw: str) -> ApprovalSnapshot:
        return decode_snapshot(approval_id, self._codec.decode_text(raw, approval_place(approval_id)))

    def save(self, snapshot: ApprovalSnapshot) -> None:
        values = {
            "id": snapshot.id,
            "session_id": snapshot.session_id,
            "status": snapshot.status,
            "created_at": snapshot.created_at,
            "data": self._encode(snapshot),
        }
        with self._db.write() as conn:
            conn.execute(self._db.upsert(self._db.approvals, "id", values))

    def load(self, approval_id: str) -> ApprovalSnapshot | None:
        with self._db.read() as conn:
            return self._load(conn, approval_id)

    def _load(self, conn: Connection, approval_id: str) -> ApprovalSnapshot | None:
        table = self._db.approvals
        found = conn.execute(sa.select(table.c.data).where(table.c.id == approval_id)).scalar()
        return None if found is None else self._decode(approval_id, found)

    def decide(
        self,
        approval_id: str,
        approved: bool,
        note: str | None,
        action: InterruptedAction | None = None,
        result: Any = None,
    ) -> ApprovalSnapshot:
        parse_decision({"id": approval_id, "approved": approved, "note": note})  # strict, before any write (issue #21)
        table = self._db.approvals
        with self._db.write() as conn:
            snapshot = self._load(conn, approval_id)
            if snapshot is None:
                raise ApprovalNotFoundError(f"no approval {approval_id!r} in {self._db.label}; check the id and store")
            if snapshot.status != "pending":
                raise _already_resolved(snapshot)
            decided = snapshot.model_copy(update=decided_update(snapshot, approved, note, action, result))
            status = decided.status
            pending = sa.and_(table.c.id == approval_id, table.c.status == "pending")
            updated = conn.execute(table.update().where(pending).values(status=status, data=self._encode(decided)))
            if updated.rowcount != 1:  # PostgreSQL: another transaction decided it after our read
                raise _already_resolved(self._load(conn, approval_id) or snapshot)
        return decided

    def reopen(self, approval_id: str) -> None:
        """Put a decided approval back to pending; an unknown id is left alone."""
        table = self._db.approvals
        with self._db.write() as conn:
            snapshot = self._load(conn, approval_id)
            if snapshot is not None:
                reopened = snapshot.model_copy(update=REOPENED)
                values = {"status": "pending", "data": self._encode(reopened)}
                conn.execute(table.update().where(table.c.id == approval_id).values(**values))

    def delete(self, approval_id: str) -> None:
        """Forget an approval (its session was deleted); an unknown id is left alone."""
        table = self._db.approvals
        with self._db.write() as conn:
            conn.execute(table.delete().where(table.c.id == approval_id))

    def pending(self, session_id: str | None = None) -> Listing[ApprovalSnapshot]:
        """Approvals waiting for a decision, oldest first; those that cannot be read are named in `skipped`."""
        table = self._db.approvals
        query = sa.select(table.c.id, table.c.data).where(table.c.status == "pending")
        if session_id is not None:
            query = query.where(table.c.session_id == session_id)
        with self._db.read() as conn:
            rows = [
                (str(approval_id), data)
                for approval_id, data in conn.execute(query.order_by(table.c.created_at, table.c.id))
            ]
        return read_each(rows, self._decode, what="approval")

    def reseal(self, session_ids: Collection[str] | None = None) -> int:
        """Write every approval again (only those of `session_ids` when given), pending or decided, sealed under
        the codec's first key to its place (issue #31, `lousho reseal`), in one transaction; how many. One that
        does not open raises, and nothing is written."""
        table = self._db.approvals
        query = sa.select(table.c.id, table.c.data)
        if session_ids is not None:
            query = query.where(table.c.session_id.in_(list(session_ids)))
        with self._db.write() as conn:
            snapshots = [self._decode(str(approval_id), data) for approval_id, data in conn.execute(query)]
            for snapshot in snapshots:
                conn.execute(table.update().where(table.c.id == snapshot.id).values(data=self._encode(snapshot)))
        return len(snapshots)

    def put_raw(self, approval_id: str, raw: str, *, session_id: str | None = None) -> None:
        """Store `raw` as a pending approval's snapshot without checking it (tests of corrupt records)."""
        values = {"id": approval_id, "session_id": session_id, "status": "pending", "created_at": "", "data": raw}
        with self._db.write() as conn:
            conn.execute(self._db.upsert(self._db.approvals, "id", values))


def _already_resolved(snapshot: ApprovalSnapshot) -> ApprovalAlreadyResolvedError:
    return ApprovalAlreadyResolvedError(
        f"approval {snapshot.id!r} was already {snapshot.status} at {snapshot.decided_at}; it is not run again"
    )
