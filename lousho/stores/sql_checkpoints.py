"""`SqlCheckpointStore`: the latest checkpoint per session and its history ring, in SQL.

Every save is a compare-and-set done by the database itself (`UPDATE ... WHERE version
= :previous`, or an INSERT that a unique key refuses), so two processes can never both
win a save, whatever their clocks say.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from lousho.checkpoint import Checkpoint, HistoryEntry, decode_checkpoint
from lousho.errors import CheckpointConflictError
from lousho.stores.sql_database import SqlDatabase, cutoff_time, naive_utc_now

__all__ = ["Pruned", "SqlCheckpointStore"]


class Pruned(NamedTuple):
    """What `prune()` removed."""

    checkpoints: int
    history: int


class SqlCheckpointStore:
    """Latest checkpoint per session (compare-and-set on `version`) plus a history ring."""

    def __init__(self, db: SqlDatabase, *, history_limit: int = 50) -> None:
        self._db = db
        self.history_limit = history_limit

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        """Store `checkpoint` if it follows the stored version; else `CheckpointConflictError`, nothing written."""
        raw, now, table = checkpoint.model_dump_json(), naive_utc_now(), self._db.checkpoints
        values = {"version": checkpoint.version, "status": checkpoint.status, "updated_at": now, "data": raw}
        previous = checkpoint.version - 1
        try:
            with self._db.write() as conn:
                where = sa.and_(table.c.session_id == session_id, table.c.version == previous)
                if conn.execute(table.update().where(where).values(**values)).rowcount != 1:
                    found = self._version(conn, session_id)
                    if previous != 0 or found is not None:
                        raise CheckpointConflictError(session_id, previous, found)
                    conn.execute(table.insert().values(session_id=session_id, **values))
                self._push_history(conn, session_id, checkpoint, raw, now)
        except exc.IntegrityError:  # PostgreSQL: a concurrent first save of this session won
            with self._db.read() as conn:
                raise CheckpointConflictError(session_id, previous, self._version(conn, session_id)) from None

    def _push_history(self, conn: Connection, session_id: str, checkpoint: Checkpoint, raw: str, now: datetime) -> None:
        if self.history_limit <= 0:
            return
        history = self._db.history
        conn.execute(
            history.insert().values(
                session_id=session_id, step=checkpoint.step_index, status=checkpoint.status, saved_at=now, data=raw
            )
        )
        newest = (
            sa.select(history.c.id)
            .where(history.c.session_id == session_id)
            .order_by(history.c.id.desc())
            .limit(self.history_limit)
        )
        conn.execute(history.delete().where(history.c.session_id == session_id, history.c.id.not_in(newest)))

    def _version(self, conn: Connection, session_id: str) -> int | None:
        table = self._db.checkpoints
        found = conn.execute(sa.select(table.c.version).where(table.c.session_id == session_id)).scalar()
        return None if found is None else int(found)

    def load(self, session_id: str) -> Checkpoint | None:
        raw = self.get_raw(session_id)
        return None if raw is None else decode_checkpoint(session_id, raw)

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        with self._db.write() as conn:
            conn.execute(self._db.checkpoints.delete().where(self._db.checkpoints.c.session_id == session_id))
            if not keep_history:
                conn.execute(self._db.history.delete().where(self._db.history.c.session_id == session_id))

    def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry]:
        """The session's saves, newest first (at most `limit`); an unknown session has none."""
        history = self._db.history
        query = sa.select(history.c.saved_at, history.c.data).where(history.c.session_id == session_id)
        query = query.order_by(history.c.id.desc()).limit(limit)
        with self._db.read() as conn:
            rows = conn.execute(query).all()
        entries = []
        for saved_at, data in rows:
            checkpoint = decode_checkpoint(session_id, data)
            stamp = saved_at.replace(tzinfo=UTC).isoformat()
            entries.append(
                HistoryEntry(
                    step=checkpoint.step_index, saved_at=stamp, status=checkpoint.status, checkpoint=checkpoint
                )
            )
        return entries

    def sessions(self, status: str | None = None) -> list[str]:
        """Session ids with a latest checkpoint, sorted; only those with `status` when given."""
        table = self._db.checkpoints
        query = sa.select(table.c.session_id).order_by(table.c.session_id)
        if status is not None:
            query = query.where(table.c.status == status)
        with self._db.read() as conn:
            return list(conn.execute(query).scalars())

    def prune(self, older_than: datetime | timedelta) -> Pruned:
        """Remove finished checkpoints last saved before the cutoff, and history entries saved before it."""
        cutoff, table, history = cutoff_time(older_than), self._db.checkpoints, self._db.history
        with self._db.write() as conn:
            removed = conn.execute(table.delete().where(table.c.status == "finished", table.c.updated_at < cutoff))
            dropped = conn.execute(history.delete().where(history.c.saved_at < cutoff))
        return Pruned(checkpoints=removed.rowcount, history=dropped.rowcount)

    def get_raw(self, session_id: str) -> str | None:
        """The stored text of the latest checkpoint, as it is (for inspection and tests)."""
        table = self._db.checkpoints
        with self._db.read() as conn:
            found = conn.execute(sa.select(table.c.data).where(table.c.session_id == session_id)).scalar()
        return None if found is None else str(found)

    def put_raw(self, session_id: str, raw: str) -> None:
        """Store `raw` as the latest checkpoint without checking it (tests of old, corrupt and foreign records)."""
        try:
            fields = json.loads(raw)
            version, status = int(fields.get("version", 0)), str(fields.get("status", "in-progress"))
        except (ValueError, TypeError, AttributeError):
            version, status = 0, "in-progress"
        values = {
            "session_id": session_id,
            "version": version,
            "status": status,
            "updated_at": naive_utc_now(),
            "data": raw,
        }
        with self._db.write() as conn:
            conn.execute(self._db.upsert(self._db.checkpoints, "session_id", values))
