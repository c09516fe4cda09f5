"""SqlStore's save after its own save knows where the new messages go without asking the table (issue #30): one
statement less per save, and the same rows as before, including after a transcript that shrank."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from lousho.checkpoint import Checkpoint
from lousho.messages import Message
from lousho.stores.sql import SqliteStore
from tests.stores.transcripts import message, run


class LastSeqQueries:
    """How many times a save asks for the session's last message position."""

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        event.listen(engine, "before_cursor_execute", self._on_execute)

    def _on_execute(self, _conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        self.count += "max(lousho_messages.seq)" in statement


def _seqs(store: SqliteStore, session_id: str) -> list[int]:
    table = store._db.messages
    with store.engine.connect() as conn:
        query = sa.select(table.c.seq).where(table.c.session_id == session_id).order_by(table.c.seq)
        return list(conn.execute(query).scalars())


def test_a_save_after_its_own_asks_the_table_nothing(make_sqlite_store: Callable[..., SqliteStore]) -> None:
    store = make_sqlite_store()
    queries = LastSeqQueries(store.engine)
    saved = list(run("s", 4))
    for checkpoint in saved:
        store.checkpoints.save("s", checkpoint)
    assert queries.count == 1  # the first save only
    assert _seqs(store, "s") == list(range(6))
    assert store.checkpoints.load("s") == saved[-1]


def test_after_a_load_or_another_stores_save_it_asks(tmp_path: Path) -> None:
    first, second = SqliteStore(tmp_path / "jobs.db"), SqliteStore(tmp_path / "jobs.db")
    try:
        queries = LastSeqQueries(first.engine)
        saved = list(run("s", 4))
        first.checkpoints.save("s", saved[0])
        second.checkpoints.save("s", saved[1])
        first.checkpoints.save("s", saved[2])  # the head is the other store's
        assert queries.count == 2
        first.checkpoints.load("s")
        second.checkpoints.save("s", saved[3])
        assert second.checkpoints.load("s") == saved[3]
        assert _seqs(first, "s") == list(range(6))
    finally:
        first.close()
        second.close()


def test_messages_after_a_shrunk_transcript_go_past_every_stored_one(
    make_sqlite_store: Callable[..., SqliteStore],
) -> None:
    store = make_sqlite_store()
    saved = list(run("s", 4))  # 6 messages, rows 0-5
    for checkpoint in saved:
        store.checkpoints.save("s", checkpoint)
    shrunk = Checkpoint(session_id="s", version=5, step_index=1, messages=saved[0].messages[:2])
    store.checkpoints.save("s", shrunk)  # no new row; its head names rows 0-1
    grown = Checkpoint(session_id="s", version=6, step_index=2, messages=[*shrunk.messages, Message.user("again")])
    store.checkpoints.save("s", grown)
    longer = Checkpoint(session_id="s", version=7, step_index=3, messages=[*grown.messages, message(9)])
    store.checkpoints.save("s", longer)
    assert _seqs(store, "s") == list(range(8))  # appended at 6 and 7, not over 2
    assert store.checkpoints.load("s") == longer
    assert [e.checkpoint for e in store.checkpoints.history("s")][:3] == [longer, grown, shrunk]
