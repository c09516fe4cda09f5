"""`SqlCheckpointStore`: the latest checkpoint per session and its history ring, in SQL.

Every save is a compare-and-set done by the database itself (the session's row is locked,
its version compared, then `UPDATE ... WHERE version = :previous`, or an INSERT that a unique
key refuses), so two processes can never both win a save, whatever their clocks say.

A save's cost does not grow with the transcript. The messages are stored once, in
`lousho_messages` (appended, never rewritten); the `lousho_checkpoints` row and each
`checkpoint_history` row hold a head: the checkpoint without its messages plus the slices of
`lousho_messages` it uses (format: `lousho.stores.segments`). The store remembers the last
checkpoint it saved or loaded per session, so a save finds the unchanged prefix by identity and
inserts only the new messages, in the same transaction as the compare-and-set. When it does not
know the stored head (another process wrote it, the cache was cold), it reads the stored messages
and appends only what differs. Rows written by an older lousho (a whole checkpoint JSON in
`data`) are read as they are.

Messages of a transcript a save rewrote (rare: a patched fork into the same session) stay until
the session is deleted; `delete(keep_history=True)` keeps the messages its history refers to, and
`prune()` removes the messages of sessions left with neither a checkpoint nor history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from lousho.checkpoint import Checkpoint, HistoryEntry, decode_checkpoint
from lousho.errors import CheckpointConflictError, CorruptCheckpointError, PayloadDecodeError, PayloadKeyError, SDKError
from lousho.store_bundle import Pruned
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.head_fields import HeadFields, head_fields
from lousho.stores.listing import Listing, read_each
from lousho.stores.reseal import reseal_records
from lousho.stores.segments import (
    Head,
    Known,
    SessionCache,
    Transcript,
    encode_records,
    extend_segments,
    new_writer_id,
    plan_save,
    split_record,
    written_head,
)
from lousho.stores.sql_database import SqlDatabase, cutoff_time, naive_utc_now
from lousho.stores.sql_driver import DriverStatement, DriverTransaction
from lousho.stores.sql_transcripts import MessageRows

__all__ = ["Pruned", "SqlCheckpointStore"]


class _Statements:
    """The statements of a save, compiled once for the engine's dialect and run on the driver's cursor
    (building and running them through SQLAlchemy Core cost more than SQLite itself, issue #20)."""

    def __init__(self, db: SqlDatabase) -> None:
        table, history, messages = db.checkpoints, db.history, db.messages
        sid, dialect = sa.bindparam("sid", type_=sa.String()), db.engine.dialect
        self._history, self._dialect, self._trims = history, dialect, dict[int, DriverStatement]()
        head_columns = ("version", "status", "updated_at", "data")
        self.lock = DriverStatement(
            sa.select(table.c.version, table.c.data).where(table.c.session_id == sid).with_for_update(), dialect
        )
        self.version = DriverStatement(sa.select(table.c.version).where(table.c.session_id == sid), dialect)
        self.insert = DriverStatement(table.insert(), dialect, ("session_id", *head_columns))
        self.update = DriverStatement(
            table.update().where(table.c.session_id == sid, table.c.version == sa.bindparam("previous")),
            dialect,
            head_columns,
        )
        self.push = DriverStatement(history.insert(), dialect, ("session_id", "step", "status", "saved_at", "data"))
        self.last_seq = DriverStatement(
            sa.select(sa.func.max(messages.c.seq)).where(messages.c.session_id == sid), dialect
        )
        self.append = DriverStatement(messages.insert(), dialect, ("session_id", "seq", "data"))
        self.read = DriverStatement(
            sa.select(messages.c.seq, messages.c.data).where(
                messages.c.session_id == sid,
                messages.c.seq >= sa.bindparam("low"),
                messages.c.seq < sa.bindparam("high"),
            ),
            dialect,
        )

    def trim(self, limit: int) -> DriverStatement:
        """Delete all but the session's newest `limit` history rows: those at or below the id of the
        (`limit`+1)-th newest, found by a seek on the (session_id, id) index (no row when there are
        fewer; cheaper than `NOT IN` the newest `limit`, which visits every row of the session)."""
        found = self._trims.get(limit)
        if found is None:
            history, sid = self._history, sa.bindparam("sid", type_=sa.String())
            newest = sa.select(history.c.id).where(history.c.session_id == sid).order_by(history.c.id.desc())
            cut = newest.limit(1).offset(limit).scalar_subquery()
            delete = history.delete().where(history.c.session_id == sid, history.c.id <= cut)
            found = self._trims[limit] = DriverStatement(delete, self._dialect)
        return found


_FIELDS_START = ',"messages":null,'
"""What follows a head's store header (`behind_header`)."""


@dataclass(frozen=True)
class _Saved(Known):
    """What this store's own last save of a session left (issue #30): besides `Known`, where the next message goes
    (`next_seq`) and how the head's text begins, up to its fields (`start`: its store header, which is `head`),
    so that a save over that very head neither asks the table for its last message nor parses the head."""

    next_seq: int = 0
    start: str = ""
    head: Head | None = None


class SqlCheckpointStore:
    """Latest checkpoint per session (compare-and-set on `version`) plus a history ring."""

    def __init__(
        self, db: SqlDatabase, *, history_limit: int = 50, cache_size: int = 1024, codec: PayloadCodec = PLAIN
    ) -> None:
        """`codec`: seals heads' secret fields and encodes message rows (issue #17)."""
        self._db = db
        self.history_limit = history_limit
        self._codec = codec
        self._rows = MessageRows(db, codec)
        self._cache = SessionCache(cache_size)
        self._sql = _Statements(db)

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        """Store `checkpoint` if it follows the stored version; else `CheckpointConflictError`, nothing written."""
        writer, previous = new_writer_id(), checkpoint.version - 1
        try:
            saved = self._db.driver_write(lambda transaction: self._write(transaction, session_id, checkpoint, writer))
        except exc.IntegrityError:  # PostgreSQL: a concurrent first save of this session won
            with self._db.read() as conn:
                raise CheckpointConflictError(session_id, previous, self._version(conn, session_id)) from None
        self._cache.put(session_id, saved)

    def _write(self, transaction: DriverTransaction, session_id: str, checkpoint: Checkpoint, writer: str) -> _Saved:
        """The save's statements; what the store's cache keeps of it."""
        previous, sql, sid = checkpoint.version - 1, self._sql, {"sid": session_id}
        row = transaction.execute(sql.lock, sid).fetchone()
        found = None if row is None else int(row[0])
        if found != previous and not (found is None and previous == 0):
            raise CheckpointConflictError(session_id, previous, found)
        known = self._cache.get(session_id)
        head = None if row is None else _head_of(session_id, row[1], self._codec, known)
        segments, texts = plan_save(
            self._cache,
            session_id,
            checkpoint,
            head,
            lambda h: self._stored_texts(transaction, session_id, h),
            self._codec,
        )
        base = _next_seq(known, head, previous)
        if base is None:
            last = transaction.execute(sql.last_seq, sid).fetchone()[0]
            base = 0 if last is None else int(last) + 1
        if texts:
            rows = [{"session_id": session_id, "seq": base + i, "data": text} for i, text in enumerate(texts)]
            transaction.execute_many(sql.append, rows)
        segments = extend_segments(segments, base, len(texts))
        record, entry = encode_records(checkpoint, writer, segments, codec=self._codec, session_id=session_id)
        self._write_head(transaction, session_id, checkpoint, row is None, (record, entry))
        start = record[: record.index(_FIELDS_START) + len(_FIELDS_START)]  # the header holds no such text
        messages = tuple(checkpoint.messages)
        return _Saved(checkpoint.version, writer, messages, base + len(texts), start, Head(writer, segments))

    def _write_head(
        self,
        transaction: DriverTransaction,
        session_id: str,
        checkpoint: Checkpoint,
        new: bool,
        records: tuple[str, str],
    ) -> None:
        """The compare-and-set of the head (an INSERT for a `new` session), then its history entry and the trim."""
        sql, previous, now = self._sql, checkpoint.version - 1, naive_utc_now()
        values = {"version": checkpoint.version, "status": checkpoint.status, "updated_at": now, "data": records[0]}
        if new:
            transaction.execute(sql.insert, {"session_id": session_id, **values})
        elif transaction.execute(sql.update, {"sid": session_id, "previous": previous, **values}).rowcount != 1:
            stored = transaction.execute(sql.version, {"sid": session_id}).fetchone()
            raise CheckpointConflictError(session_id, previous, None if stored is None else int(stored[0]))
        if self.history_limit > 0:
            history = {"session_id": session_id, "step": checkpoint.step_index, "status": checkpoint.status}
            transaction.execute(sql.push, {**history, "saved_at": now, "data": records[1]})
            transaction.execute(sql.trim(self.history_limit), {"sid": session_id})

    def _stored_texts(self, transaction: DriverTransaction, session_id: str, head: Head) -> list[str | None]:
        """The stored JSON of the messages `head` names (a save that does not know the stored head)."""
        segments = [s for s in head.segments if s[1] > 0]
        rows: dict[int, str] = {}
        if segments:
            low, high = min(s[0] for s in segments), max(s[0] + s[1] for s in segments)
            cursor = transaction.execute(self._sql.read, {"sid": session_id, "low": low, "high": high})
            rows = {int(seq): str(data) for seq, data in cursor.fetchall()}
        return Transcript(session_id, rows, self._codec).texts(head.segments)

    def _version(self, conn: Connection, session_id: str) -> int | None:
        table = self._db.checkpoints
        found = conn.execute(sa.select(table.c.version).where(table.c.session_id == session_id)).scalar()
        return None if found is None else int(found)

    def load(self, session_id: str) -> Checkpoint | None:
        """The latest checkpoint, or None for an unknown session; a damaged one raises and stays."""
        table = self._db.checkpoints
        with self._db.read() as conn:
            raw = conn.execute(sa.select(table.c.data).where(table.c.session_id == session_id)).scalar()
            if raw is None:
                return None
            try:
                data, head = split_record(session_id, raw, self._codec)
                transcript = None if head is None else self._rows.read(conn, session_id, [head])
                checkpoint = _decode(session_id, data, head, transcript)
            except SDKError:  # issue #31: a save never builds on what this process last read of it
                self._cache.drop(session_id)
                raise
        if head is not None:
            self._cache.put(session_id, Known(checkpoint.version, head.writer, tuple(checkpoint.messages)))
        return checkpoint

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        """Forget the session; with `keep_history` its history and the messages it refers to stay."""
        with self._db.write() as conn:
            conn.execute(self._db.checkpoints.delete().where(self._db.checkpoints.c.session_id == session_id))
            if not keep_history:
                conn.execute(self._db.history.delete().where(self._db.history.c.session_id == session_id))
                self._rows.delete(conn, session_id)
        self._cache.drop(session_id)

    def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry]:
        """The session's saves, newest first (at most `limit`), each as it was saved; an unknown session has none."""
        history = self._db.history
        query = sa.select(history.c.saved_at, history.c.data).where(history.c.session_id == session_id)
        query = query.order_by(history.c.id.desc()).limit(limit)
        with self._db.read() as conn:
            records = [
                (saved_at, *split_record(session_id, data, self._codec, history=True))
                for saved_at, data in conn.execute(query)
            ]
            heads = [head for _, _, head in records if head is not None]
            transcript = self._rows.read(conn, session_id, heads) if heads else None
        entries = []
        for saved_at, data, head in records:
            checkpoint = _decode(session_id, data, head, transcript)
            stamp = saved_at.replace(tzinfo=UTC).isoformat()
            entries.append(
                HistoryEntry(
                    step=checkpoint.step_index, saved_at=stamp, status=checkpoint.status, checkpoint=checkpoint
                )
            )
        return entries

    def sessions(self, status: str | None = None) -> Listing[str]:
        """Session ids with a latest checkpoint, sorted; only those with `status` when given. The status
        is a column of its own, so no record is unreadable here (`skipped` stays empty)."""
        table = self._db.checkpoints
        query = sa.select(table.c.session_id).order_by(table.c.session_id)
        if status is not None:
            query = query.where(table.c.status == status)
        with self._db.read() as conn:
            return Listing(conn.execute(query).scalars())

    def heads(self, session_ids: Sequence[str]) -> Listing[HeadFields]:
        """The plain head fields of each named session that has a checkpoint, in the order given, never opening a
        payload (issue #32: what listings read); a head that cannot be read is named in `skipped`."""
        table = self._db.checkpoints
        query = sa.select(table.c.session_id, table.c.updated_at, table.c.data)
        found: dict[str, tuple[datetime, str]] = {}
        with self._db.read() as conn:
            for start in range(0, len(session_ids), 500):
                chunk = list(session_ids[start : start + 500])
                for session_id, updated_at, data in conn.execute(query.where(table.c.session_id.in_(chunk))):
                    found[str(session_id)] = (updated_at, data)

        def read(session_id: str, row: tuple[datetime, str]) -> HeadFields:
            saved = row[0] if row[0].tzinfo else row[0].replace(tzinfo=UTC)  # stored naive, in UTC
            return head_fields(session_id, row[1], saved_at=saved.isoformat())

        return read_each(((s, found[s]) for s in session_ids if s in found), read, what="session")

    def prune(self, older_than: datetime | timedelta) -> Pruned:
        """Remove finished checkpoints last saved before the cutoff, history entries saved before it,
        and the messages of sessions left with neither."""
        cutoff, table, history = cutoff_time(older_than), self._db.checkpoints, self._db.history
        old_finished = sa.and_(table.c.status == "finished", table.c.updated_at < cutoff)
        with self._db.write() as conn:
            touched = set(conn.execute(sa.select(table.c.session_id).where(old_finished)).scalars())
            touched.update(conn.execute(sa.select(history.c.session_id).where(history.c.saved_at < cutoff)).scalars())
            removed = conn.execute(table.delete().where(old_finished))
            dropped = conn.execute(history.delete().where(history.c.saved_at < cutoff))
            self._rows.delete_unreferenced(conn, touched)
        for session_id in touched:
            self._cache.drop(session_id)
        return Pruned(checkpoints=removed.rowcount, history=dropped.rowcount)

    def reseal(self, session_id: str) -> int:
        """Write every stored value of the session again, sealed under the codec's first key to its place
        (issue #31, `lousho reseal`), in one transaction; how many values. A value the codec cannot read
        raises and nothing is written."""
        table, history, messages = self._db.checkpoints, self._db.history, self._db.messages
        with self._db.write() as conn:
            head = conn.execute(
                sa.select(table.c.data).where(table.c.session_id == session_id).with_for_update()
            ).scalar()
            entries = list(
                conn.execute(sa.select(history.c.id, history.c.data).where(history.c.session_id == session_id))
            )
            query = sa.select(messages.c.seq, messages.c.data).where(messages.c.session_id == session_id)
            rows = {int(seq): str(data) for seq, data in conn.execute(query)}
            records = ([(head, False)] if head is not None else []) + [(data, True) for _, data in entries]
            resealed = reseal_records(session_id, self._codec, records, rows)
            new = iter(resealed.records)
            if head is not None:
                conn.execute(table.update().where(table.c.session_id == session_id).values(data=next(new)))
            for (entry_id, _), data in zip(entries, new, strict=True):
                conn.execute(history.update().where(history.c.id == entry_id).values(data=data))
            for seq, data in resealed.messages.items():
                where = sa.and_(messages.c.session_id == session_id, messages.c.seq == seq)
                conn.execute(messages.update().where(where).values(data=data))
        self._cache.drop(session_id)
        return len(resealed.records) + len(resealed.messages)

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
        self._cache.drop(session_id)


def _head_of(session_id: str, raw: str, codec: PayloadCodec, known: Known | None) -> Head | None:
    """The stored head's header, for a save; None for a whole-checkpoint row or one that cannot be read
    (a save over it writes the whole transcript, as it always did). With encryption on, its sealed part is
    opened too: a wrong or missing key raises `PayloadKeyError` before anything is written (issue #17), even
    when the save would read no stored message. Without keys, a head this process saved last (`known`'s
    writer) has its header read alone: the save uses nothing else of it (issue #30)."""
    if known is not None and not codec.keys:
        if isinstance(known, _Saved) and known.start and raw.startswith(known.start):  # its last save's very head
            return known.head
        head = written_head(raw, known.writer)
        if head is not None:
            return head
    try:
        return split_record(session_id, raw, codec if codec.keys else None)[1]
    except (CorruptCheckpointError, PayloadDecodeError) as error:
        if isinstance(error, PayloadKeyError):
            raise
        return None


def _next_seq(known: Known | None, head: Head | None, previous: int) -> int | None:
    """Where the save's new messages go, when this store wrote the stored head (its version and writer id): one
    past the last message it stored then, since only a save appends messages, in the transaction that writes
    its head, so none was appended since. None otherwise: ask the table (issue #30: one statement less)."""
    if not isinstance(known, _Saved) or head is None or known.version != previous or known.writer != head.writer:
        return None
    return known.next_seq


def _decode(session_id: str, data: Any, head: Head | None, transcript: Transcript | None) -> Checkpoint:
    """A stored record as a checkpoint: a whole checkpoint JSON as it is, a head with the messages it names."""
    if head is None or transcript is None:
        return decode_checkpoint(session_id, data)
    data["messages"] = transcript.take(head.segments)
    return decode_checkpoint(session_id, data)
