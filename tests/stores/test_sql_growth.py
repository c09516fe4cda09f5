"""SqlStore's transcript layout: a save costs the same at step 500 as at step 10, history rows are
small heads, older databases still load, and a failed save leaves the old state (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from lousho.checkpoint import Checkpoint, decode_checkpoint
from lousho.errors import CorruptCheckpointError
from lousho.messages import Message
from lousho.stores.sql import SqliteStore, SqlStore
from lousho.testing.store_contract import sample_checkpoint
from tests.stores.transcripts import message, run


@pytest.fixture(params=["sqlite", "postgres"])
def sql_store(request: pytest.FixtureRequest) -> Callable[..., SqlStore]:
    fixture = "make_sqlite_store" if request.param == "sqlite" else "make_postgres_store"
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]


class Traffic:
    """What one save sends to the database: bytes of all statement parameters, and message rows inserted."""

    def __init__(self, engine: sa.Engine) -> None:
        self.bytes = self.message_rows = 0
        event.listen(engine, "before_cursor_execute", self._on_execute)

    def _on_execute(self, _conn: Any, _cursor: Any, statement: str, params: Any, _ctx: Any, many: bool) -> None:
        rows = params if many else [params]
        self.bytes += sum(len(str(v)) for row in rows for v in (row.values() if isinstance(row, dict) else row))
        if statement.lstrip().upper().startswith("INSERT") and "lousho_messages" in statement:
            self.message_rows += len(rows)

    def reset(self) -> None:
        self.bytes = self.message_rows = 0


def _rows(store: SqlStore, table: sa.Table, session_id: str) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.select(table).where(table.c.session_id == session_id)))


def test_save_sends_and_stores_only_new_messages_and_small_heads(sql_store: Callable[..., SqlStore]) -> None:
    store = sql_store()
    traffic = Traffic(store.engine)
    sent: dict[int, int] = {}
    entry_bytes: dict[int, int] = {}
    saved = []
    for checkpoint in run("long", 500):
        traffic.reset()
        store.checkpoints.save("long", checkpoint)
        new = 3 if checkpoint.version == 1 else 1
        assert traffic.message_rows == new, f"step {checkpoint.version} inserted {traffic.message_rows} message rows"
        saved.append(checkpoint)
        if checkpoint.version in (10, 500):
            sent[checkpoint.version] = traffic.bytes
            entry_bytes[checkpoint.version] = len(_rows(store, store._db.history, "long")[-1].data)
    assert sent[500] <= sent[10] + 200, sent  # the new message, a head and a few more digits
    assert entry_bytes[500] <= entry_bytes[10] + 20 and entry_bytes[500] < 1000, entry_bytes
    assert len(_rows(store, store._db.messages, "long")) == 502  # every message once
    entries = store.checkpoints.history("long")
    assert [e.checkpoint for e in entries] == saved[::-1][:50]  # each exactly as it was saved
    fresh = SqlStore(store.engine.url, schema=store._db.schema)  # another process: no cache
    try:
        assert fresh.checkpoints.load("long") == saved[-1]
    finally:
        fresh.close()


def test_a_store_that_did_not_write_the_head_appends_only_what_differs(sql_store: Callable[..., SqlStore]) -> None:
    first = sql_store()
    second = SqlStore(first.engine.url, schema=first._db.schema)
    traffic = Traffic(second.engine)
    try:
        saved = list(run("shared", 6))
        for checkpoint in saved:  # the two alternate: every save finds a head it did not write
            writer = first if checkpoint.version % 2 else second
            traffic.reset()
            writer.checkpoints.save("shared", checkpoint)
            if writer is second:
                assert traffic.message_rows == 1
        assert len(_rows(first, first._db.messages, "shared")) == 8
        assert [e.checkpoint for e in second.checkpoints.history("shared")] == saved[::-1]
    finally:
        second.close()


def test_a_rewritten_transcript_keeps_earlier_history_as_it_was(sql_store: Callable[..., SqlStore]) -> None:
    store = sql_store()
    saved = list(run("fork", 4))
    for checkpoint in saved:
        store.checkpoints.save("fork", checkpoint)
    patched_messages = [*saved[1].messages[:2], Message.user("Find something else."), message(9)]
    patched = Checkpoint(session_id="fork", version=5, step_index=1, messages=patched_messages)
    store.checkpoints.save("fork", patched)
    after = Checkpoint(session_id="fork", version=6, step_index=2, messages=[*patched_messages, message(10)])
    store.checkpoints.save("fork", after)
    assert store.checkpoints.load("fork") == after
    assert [e.checkpoint for e in store.checkpoints.history("fork")] == [after, patched, *saved[::-1]]
    assert len(_rows(store, store._db.messages, "fork")) == 6 + 3  # the shared first two stay shared


def test_failed_save_leaves_the_previous_state_and_writes_no_rows(
    sql_store: Callable[..., SqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sql_store()
    saved = list(run("fail", 3))
    for checkpoint in saved[:2]:
        store.checkpoints.save("fail", checkpoint)

    def broken(*_args: Any) -> None:
        raise RuntimeError("the process dies after inserting the messages, the head and the history row")

    with monkeypatch.context() as patch:
        patch.setattr(store.checkpoints._sql, "trim", broken)
        with pytest.raises(RuntimeError):
            store.checkpoints.save("fail", saved[2])
    assert store.checkpoints.load("fail") == saved[1]
    assert len(_rows(store, store._db.messages, "fail")) == 4
    store.checkpoints.save("fail", saved[2])
    assert [e.checkpoint for e in store.checkpoints.history("fail")] == saved[::-1]


def test_delete_keep_history_keeps_the_messages_history_uses(sql_store: Callable[..., SqlStore]) -> None:
    store = sql_store()
    saved = list(run("again", 3))
    for checkpoint in saved:
        store.checkpoints.save("again", checkpoint)
    store.checkpoints.delete("again", keep_history=True)
    restarted = Checkpoint(session_id="again", version=1, messages=[Message.user("new start")])
    store.checkpoints.save("again", restarted)
    assert store.checkpoints.load("again") == restarted
    assert [e.checkpoint for e in store.checkpoints.history("again")] == [restarted, *saved[::-1]]
    store.checkpoints.delete("again")
    assert _rows(store, store._db.messages, "again") == []


def test_prune_removes_the_messages_of_sessions_left_with_nothing(sql_store: Callable[..., SqlStore]) -> None:
    store = sql_store()
    for session_id, status in (("gone", "finished"), ("kept", "in-progress")):
        first, second = run(session_id, 2)
        store.checkpoints.save(session_id, first)
        store.checkpoints.save(session_id, second.model_copy(update={"status": status}))
    assert store.prune(timedelta(seconds=-60)) == (1, 4)  # a cutoff in the future: everything is older
    assert _rows(store, store._db.messages, "gone") == []
    assert len(_rows(store, store._db.messages, "kept")) == 4
    assert store.checkpoints.load("kept") is not None and store.checkpoints.history("kept") == []


def test_a_head_whose_messages_are_gone_raises_and_stays(sql_store: Callable[..., SqlStore]) -> None:
    store = sql_store()
    store.checkpoints.save("lost", next(run("lost", 1)))
    head = store.checkpoints.get_raw("lost")
    with store.engine.begin() as conn:
        conn.execute(store._db.messages.delete())
    for read in (lambda: store.checkpoints.load("lost"), lambda: store.checkpoints.history("lost")):
        with pytest.raises(CorruptCheckpointError, match="'lost'"):
            read()
    assert store.checkpoints.get_raw("lost") == head
    damaged = head.replace('"s":[[', '"s":[["x",', 1) if head else ""
    store.checkpoints.put_raw("lost", damaged)
    with pytest.raises(CorruptCheckpointError, match="store header is damaged"):
        store.checkpoints.load("lost")


def test_an_older_lousho_refuses_a_head_instead_of_reading_an_empty_transcript(
    sql_store: Callable[..., SqlStore],
) -> None:
    store = sql_store()
    store.checkpoints.save("new", next(run("new", 1)))
    head = store.checkpoints.get_raw("new")
    assert head is not None and json.loads(head)["messages"] is None
    with pytest.raises(CorruptCheckpointError):
        decode_checkpoint("new", head)  # what an older lousho does with the row


OLD_TABLES = [
    """CREATE TABLE {prefix}lousho_checkpoints (session_id VARCHAR(200) PRIMARY KEY, version INTEGER NOT NULL,
       status VARCHAR(32) NOT NULL, updated_at TIMESTAMP NOT NULL, data TEXT NOT NULL)""",
    """CREATE TABLE {prefix}checkpoint_history (id {id} PRIMARY KEY, session_id VARCHAR(200) NOT NULL,
       step INTEGER NOT NULL, status VARCHAR(32) NOT NULL, saved_at TIMESTAMP NOT NULL, data TEXT NOT NULL)""",
]


def _old_rows() -> tuple[list[Checkpoint], list[dict[str, Any]]]:
    saved = [sample_checkpoint("s-old", version=v, step=v - 1, status="in-progress", approval_id=None) for v in (1, 2)]
    stamp = "2024-01-01 00:00:0{}"
    rows = [
        {"session_id": "s-old", "step": c.step_index, "status": c.status, "saved_at": stamp.format(c.version),
         "data": c.model_dump_json()}
        for c in saved
    ]  # fmt: skip
    return saved, rows


def _check_old_database_loads_and_continues(store: SqlStore, saved: list[Checkpoint]) -> None:
    assert store.checkpoints.load("s-old") == saved[-1]
    assert [e.checkpoint for e in store.checkpoints.history("s-old")] == saved[::-1]
    following = saved[-1].model_copy(
        update={"version": 3, "step_index": 2, "messages": [*saved[-1].messages, message(1)]}
    )
    store.checkpoints.save("s-old", following)
    assert store.checkpoints.load("s-old") == following
    assert [e.checkpoint for e in store.checkpoints.history("s-old")] == [following, *saved[::-1]]
    assert len(_rows(store, store._db.messages, "s-old")) == len(following.messages)


def test_sqlite_database_of_the_whole_json_layout_loads_and_continues(sqlite_path: Path) -> None:
    saved, rows = _old_rows()
    with sqlite3.connect(sqlite_path) as conn:
        for statement in OLD_TABLES:
            conn.execute(statement.format(prefix="", id="INTEGER"))
        last = saved[-1]
        conn.execute(
            "INSERT INTO lousho_checkpoints VALUES (?, ?, ?, ?, ?)",
            ("s-old", last.version, last.status, "2024-01-01 00:00:02", last.model_dump_json()),
        )
        conn.executemany(
            "INSERT INTO checkpoint_history (session_id, step, status, saved_at, data) VALUES (?, ?, ?, ?, ?)",
            [tuple(row.values()) for row in rows],
        )
    conn.close()
    store = SqliteStore(sqlite_path)
    try:
        _check_old_database_loads_and_continues(store, saved)
    finally:
        store.close()


def test_postgres_database_of_the_whole_json_layout_loads_and_continues(
    postgres_url: str, postgres_schema: str
) -> None:
    saved, rows = _old_rows()
    engine = sa.create_engine(postgres_url)
    prefix = f'"{postgres_schema}".'
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{postgres_schema}"'))
        for statement in OLD_TABLES:
            conn.execute(sa.text(statement.format(prefix=prefix, id="BIGSERIAL")))
        last = saved[-1]
        conn.execute(
            sa.text(f"INSERT INTO {prefix}lousho_checkpoints VALUES ('s-old', :v, :s, '2024-01-01 00:00:02', :d)"),
            {"v": last.version, "s": last.status, "d": last.model_dump_json()},
        )
        conn.execute(
            sa.text(
                f"INSERT INTO {prefix}checkpoint_history (session_id, step, status, saved_at, data) "
                "VALUES (:session_id, :step, :status, :saved_at, :data)"
            ),
            rows,
        )
    store = SqlStore(postgres_url, schema=postgres_schema)
    try:
        _check_old_database_loads_and_continues(store, saved)
    finally:
        store.close()
        engine.dispose()
