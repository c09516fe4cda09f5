"""SqlStore and SqliteStore beyond the contract: migration of an older database, prune, WAL, errors."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import lousho
from lousho.errors import StoreUnavailableError
from lousho.stores.sql import SqliteStore, SqlStore
from lousho.testing.store_contract import sample_checkpoint

REPO = Path(lousho.__file__).resolve().parent.parent

OLD_CHECKPOINTS_TABLE = """
CREATE TABLE {prefix}lousho_checkpoints (
    session_id VARCHAR(200) PRIMARY KEY,
    version INTEGER NOT NULL,
    status VARCHAR(32) NOT NULL,
    updated_at TIMESTAMP NOT NULL,
    data TEXT NOT NULL
)"""


@pytest.fixture(params=["sqlite", "postgres"])
def sql_store(request: pytest.FixtureRequest) -> Callable[..., SqlStore]:
    """A maker of stores on SQLite or PostgreSQL (closed, and their schemas dropped, after the test)."""
    fixture = "make_sqlite_store" if request.param == "sqlite" else "make_postgres_store"
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]


@pytest.fixture
def sqlite_store(sqlite_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore(sqlite_path)
    yield store
    store.close()


def _table_names(engine: sa.Engine, schema: str | None = None) -> set[str]:
    return set(sa.inspect(engine).get_table_names(schema=schema))


def test_sqlite_database_with_only_the_checkpoints_table_gets_history_added(sqlite_path: Path) -> None:
    old = sample_checkpoint("s-old", version=3, step=2, status="in-progress", approval_id=None)
    with sqlite3.connect(sqlite_path) as conn:
        conn.execute(OLD_CHECKPOINTS_TABLE.format(prefix=""))
        conn.execute(
            "INSERT INTO lousho_checkpoints VALUES (?, ?, ?, ?, ?)",
            ("s-old", 3, "in-progress", "2024-01-01 00:00:00", old.model_dump_json()),
        )
    conn.close()
    store = SqliteStore(sqlite_path)
    try:
        assert store.checkpoints.load("s-old") == old
        assert {"checkpoint_history", "lousho_approvals"} <= _table_names(store.engine)
        assert store.checkpoints.history("s-old") == []  # saved before history existed
        store.checkpoints.save("s-old", old.model_copy(update={"version": 4, "step_index": 3}))
        assert [e.step for e in store.checkpoints.history("s-old")] == [3]
    finally:
        store.close()


def test_postgres_database_with_only_the_checkpoints_table_gets_history_added(
    postgres_url: str, postgres_schema: str
) -> None:
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{postgres_schema}"'))
        conn.execute(sa.text(OLD_CHECKPOINTS_TABLE.format(prefix=f'"{postgres_schema}".')))
    store = SqlStore(postgres_url, schema=postgres_schema)
    try:
        assert store.checkpoints.load("s-old") is None
        assert {"checkpoint_history", "lousho_approvals"} <= _table_names(engine, postgres_schema)
    finally:
        store.close()
        engine.dispose()


def _age(store: SqlStore, days: int, session_id: str | None = None) -> None:
    """Make a session's rows (or all rows) look `days` old."""
    then = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=days)
    checkpoints, history = store._db.checkpoints, store._db.history
    with store.engine.begin() as conn:
        for table, column in ((checkpoints, checkpoints.c.updated_at), (history, history.c.saved_at)):
            where = table.c.session_id == session_id if session_id else sa.true()
            conn.execute(table.update().where(where).values({column.name: then}))


def test_prune_removes_old_finished_checkpoints_and_old_history(sql_store: Callable[..., SqlStore]) -> None:
    store = sql_store()
    for session_id, status in (("s-done", "finished"), ("s-running", "in-progress"), ("s-recent", "finished")):
        store.checkpoints.save(session_id, sample_checkpoint(session_id, version=1, step=0, status="in-progress"))
        store.checkpoints.save(session_id, sample_checkpoint(session_id, version=2, step=1, status=status))
    _age(store, days=10, session_id="s-done")
    _age(store, days=10, session_id="s-running")
    store.checkpoints.save("s-running", sample_checkpoint("s-running", version=3, step=2, status="in-progress"))

    pruned = store.prune(timedelta(days=1))

    assert (pruned.checkpoints, pruned.history) == (1, 4)
    assert store.sessions() == ["s-recent", "s-running"]
    assert [e.step for e in store.checkpoints.history("s-running")] == [2]
    assert [e.step for e in store.checkpoints.history("s-recent")] == [1, 0]
    assert store.prune(datetime.now(UTC) - timedelta(days=1)) == (0, 0)


def test_sessions_lists_ids_by_status(sql_store: Callable[..., SqlStore]) -> None:
    store = sql_store()
    store.checkpoints.save("b", sample_checkpoint("b", status="finished"))
    store.checkpoints.save("a", sample_checkpoint("a", status="in-progress"))
    assert store.sessions() == ["a", "b"]
    assert store.sessions(status="finished") == ["b"]
    assert store.sessions(status="awaiting-approval") == []


def test_sqlite_store_creates_its_folder_and_uses_wal(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "deep" / "er" / "jobs.db")
    try:
        store.checkpoints.save("s", sample_checkpoint("s"))
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "deep" / "er" / "jobs.db") as raw:  # WAL is a property of the file
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    raw.close()


def test_unreachable_postgres_raises_store_unavailable_without_the_password() -> None:
    store = SqlStore("postgresql+psycopg://lousho:s3cret-pw@127.0.0.1:1/nowhere")
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            store.checkpoints.load("s")
    finally:
        store.close()
    message = str(caught.value)
    assert "127.0.0.1:1/nowhere" in message and "s3cret-pw" not in message
    assert caught.value.code == "LOUSHO_STORE_UNAVAILABLE"


def test_sqlite_file_that_cannot_be_opened_raises_store_unavailable(tmp_path: Path) -> None:
    (tmp_path / "taken.db").mkdir()  # a folder where the database file should be
    store = SqliteStore(tmp_path / "taken.db")
    try:
        with pytest.raises(StoreUnavailableError, match=r"taken\.db"):
            store.checkpoints.save("s", sample_checkpoint("s"))
    finally:
        store.close()
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(StoreUnavailableError, match="cannot create the folder"):
        SqliteStore(tmp_path / "file" / "jobs.db")


WRITER = textwrap.dedent(
    """
    import sys
    from lousho.errors import CheckpointConflictError
    from lousho.stores.sql import SqliteStore
    from lousho.testing.store_contract import sample_checkpoint

    store, name, wins = SqliteStore(sys.argv[1]), sys.argv[2], 0
    for version in range(1, 151):
        try:
            store.checkpoints.save("s-shared", sample_checkpoint("s-shared", version=version, business_state=name))
            wins += 1
        except CheckpointConflictError:
            pass
    store.close()
    print(wins)
    """
)


def test_a_new_sqlite_file_opened_while_another_connection_writes_it_waits_for_the_lock(tmp_path: Path) -> None:
    """The switch to WAL on a file another connection is writing fails at once, busy timeout or not.

    The store retries it until the writer is done (a CI run: three processes opening one new file).
    """
    db = tmp_path / "jobs.db"
    writer = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE someone_elses (x)")
    release = threading.Timer(0.5, writer.execute, args=("COMMIT",))
    release.start()
    store = SqliteStore(db)
    try:
        store.checkpoints.save("s", sample_checkpoint("s"))
        assert store.checkpoints.load("s").version == 1  # type: ignore[union-attr]
    finally:
        store.close()
        release.join()
        writer.close()
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert check.execute("SELECT count(*) FROM someone_elses").fetchone() == (0,)


@pytest.mark.slow  # 2-7 s: out of `scripts/check --fast` (issue #33)
def test_processes_sharing_one_sqlite_file_never_both_win_a_version(tmp_path: Path) -> None:
    """Each process tries versions 1..150 in turn from a fresh file: every version is won exactly once."""
    script, db = tmp_path / "writer.py", tmp_path / "shared" / "jobs.db"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(db), name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        for name in ("a", "b", "c")
    ]
    outputs = [proc.communicate(timeout=100) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err.decode()[-2000:] for _, err in outputs]
    assert sum(int(out) for out, _ in outputs) == 150
    store = SqliteStore(db)
    try:
        assert store.checkpoints.load("s-shared").version == 150  # type: ignore[union-attr]
        assert [e.checkpoint.version for e in store.checkpoints.history("s-shared", limit=3)] == [150, 149, 148]
    finally:
        store.close()
