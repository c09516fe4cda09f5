"""The `lousho_messages` rows of SqlStore: append a save's new messages, read the ones heads name.

Rows are `(session_id, seq, data)`: seq 0, 1, 2... in the order they were appended, never
rewritten. Heads (the latest checkpoint and each history entry) name slices of them; see
`lousho.stores.segments` for the head format.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.segments import Head, Transcript
from lousho.stores.sql_database import SqlDatabase

__all__ = ["MessageRows"]


class MessageRows:
    """Reads and appends of `lousho_messages`, inside the caller's transaction."""

    def __init__(self, db: SqlDatabase, codec: PayloadCodec = PLAIN) -> None:
        self._db = db
        self._codec = codec
        table = db.messages
        self._last = sa.select(sa.func.max(table.c.seq)).where(
            table.c.session_id == sa.bindparam("sid", type_=sa.String())
        )
        self._insert = table.insert()

    def append(self, conn: Connection, session_id: str, texts: Sequence[str]) -> int:
        """Append `texts` after the session's last row; the seq of the first one."""
        last = conn.execute(self._last, {"sid": session_id}).scalar()
        base = 0 if last is None else int(last) + 1
        if texts:
            rows = [{"session_id": session_id, "seq": base + i, "data": text} for i, text in enumerate(texts)]
            conn.execute(self._insert, rows)
        return base

    def read(self, conn: Connection, session_id: str, heads: Iterable[Head]) -> Transcript:
        """The rows every one of `heads` names (one range query over all of them)."""
        segments = [s for head in heads for s in head.segments if s[1] > 0]
        rows: dict[int, str] = {}
        if segments:
            low, high = min(s[0] for s in segments), max(s[0] + s[1] for s in segments)
            table = self._db.messages
            query = sa.select(table.c.seq, table.c.data).where(
                table.c.session_id == session_id, table.c.seq >= low, table.c.seq < high
            )
            rows = {int(seq): str(data) for seq, data in conn.execute(query)}
        return Transcript(session_id, rows, self._codec)

    def delete(self, conn: Connection, session_id: str) -> None:
        table = self._db.messages
        conn.execute(table.delete().where(table.c.session_id == session_id))

    def delete_unreferenced(self, conn: Connection, session_ids: Iterable[str]) -> int:
        """Delete the messages of those sessions that have neither a latest checkpoint nor history."""
        table, checkpoints, history = self._db.messages, self._db.checkpoints, self._db.history
        ids, removed = sorted(set(session_ids)), 0
        for start in range(0, len(ids), 500):
            orphan = sa.and_(
                table.c.session_id.in_(ids[start : start + 500]),
                ~sa.exists().where(checkpoints.c.session_id == table.c.session_id),
                ~sa.exists().where(history.c.session_id == table.c.session_id),
            )
            removed += conn.execute(table.delete().where(orphan)).rowcount
        return removed
