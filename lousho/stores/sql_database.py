"""What the SQL store's parts share: the tables, the engine, transactions and error translation.

Tables (created on first use; a missing one is added to a database written by an older
lousho): `lousho_checkpoints` (latest checkpoint per session), `checkpoint_history` (the newest
`history_limit` saves per session), `lousho_messages` (every message of a session, stored once,
which the first two refer to; see `lousho.stores.sql_checkpoints`) and `lousho_approvals`.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine

from lousho.backoff import jittered_s
from lousho.errors import ConfigurationError, StoreUnavailableError
from lousho.redaction import redact_secrets, redact_url, url_password, url_secrets
from lousho.stores.sql_driver import DriverTransaction, SaveConnections, instrumented, run_transaction

T = TypeVar("T")

__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "SqlDatabase", "cutoff_time", "naive_utc_now", "tables"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
_WRITE = "lousho_write"
"""Execution option of a connection whose transaction writes (BEGIN IMMEDIATE on SQLite)."""


def tables(schema: str | None) -> tuple[sa.MetaData, sa.Table, sa.Table, sa.Table, sa.Table]:
    """The tables (checkpoints, history, approvals, messages), in `schema` when given (PostgreSQL)."""
    meta = sa.MetaData(schema=schema)
    checkpoints = sa.Table(
        "lousho_checkpoints",
        meta,
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Index("ix_lousho_checkpoints_status", "status", "updated_at"),
    )
    history = sa.Table(
        "checkpoint_history",
        meta,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(200), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("saved_at", sa.DateTime, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Index("ix_checkpoint_history_session", "session_id", "id"),
        sa.Index("ix_checkpoint_history_saved_at", "saved_at"),
    )
    approvals = sa.Table(
        "lousho_approvals",
        meta,
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("session_id", sa.String(200), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.String(64), nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Index("ix_lousho_approvals_pending", "status", "session_id"),
    )
    messages = sa.Table(
        "lousho_messages",
        meta,
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("data", sa.Text, nullable=False),
    )
    return meta, checkpoints, history, approvals, messages


def naive_utc_now() -> datetime:
    """Naive UTC: what both SQLite and a PostgreSQL `timestamp` column store without conversion."""
    return datetime.now(UTC).replace(tzinfo=None)


def cutoff_time(older_than: datetime | timedelta) -> datetime:
    if isinstance(older_than, timedelta):
        return naive_utc_now() - older_than
    if older_than.tzinfo is not None:
        return older_than.astimezone(UTC).replace(tzinfo=None)
    return older_than


def _sqlite_listeners(engine: Engine, synchronous: str) -> None:
    """WAL, a busy timeout and our own BEGIN on every connection, so processes can share one file.

    `synchronous=NORMAL` (the default) does not fsync on every commit: in WAL mode a commit
    survives the process dying (what lousho promises), and only a power loss or an OS crash can
    lose the last commits. `FULL` fsyncs each commit, at about a millisecond per save.

    sqlite3's own transaction handling skips BEGIN before SELECT, which would make a
    read-then-write unsafe; we emit BEGIN (IMMEDIATE for writes, so a writer waits for
    the lock up front instead of failing when it upgrades a read).
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        _switch_to_wal(cursor)
        cursor.execute(f"PRAGMA synchronous = {synchronous}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")


def _switch_to_wal(cursor: Any) -> None:
    """`PRAGMA journal_mode = WAL`, retried while another connection holds the write lock.

    On a file still in rollback mode the switch fails at once with "database is locked" when
    another process is writing (creating the tables): SQLite does not call the busy handler
    there, since that could deadlock. Once the file is in WAL the pragma takes no lock. Seen in
    CI with three processes opening one fresh file (issue #33).
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(jittered_s(floor_s=0.01))  # processes that met the lock together try apart


class SqlDatabase:
    """One engine, the tables, lazy creation and the translation of driver errors."""

    def __init__(
        self,
        url: str | sa.URL,
        schema: str | None,
        engine_kwargs: dict[str, Any] | None,
        sqlite_synchronous: str = "NORMAL",
    ) -> None:
        if sqlite_synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(f"sqlite_synchronous must be NORMAL, FULL or EXTRA, not {sqlite_synchronous!r}")
        self.sqlite_synchronous = sqlite_synchronous.upper()
        # Shown and scrubbed from the URL as written: SQLAlchemy's own rendering keeps `?password=` and
        # reads `u:p@ss@host` as password `p` on host `ss@host` (issue #21).
        written = url if isinstance(url, str) else url.render_as_string(hide_password=False)
        self.label, self._secrets = redact_url(written), url_secrets(written)
        try:
            self.url = sa.make_url(url)
        except (exc.ArgumentError, ValueError):  # its message repeats the URL, password included
            raise ConfigurationError(
                f"not a database URL: {self.label} (use dialect+driver://user:password@host/database)"
            ) from None
        if url_password(written) not in (None, self.url.password):  # SQLAlchemy ends it at its first '@'
            raise ConfigurationError(
                f"the password in the database URL {self.label} holds an '@' that ends it early (the rest would be "
                "read as the host): percent-encode it (%40)"
            )
        self.schema = schema
        self.meta, self.checkpoints, self.history, self.approvals, self.messages = tables(schema)
        self.engine = self._create_engine(dict(engine_kwargs or {}))
        # A file's connections only: an in-memory database lives in its one connection (SingletonThreadPool).
        keep = self.engine.dialect.name == "sqlite" and isinstance(self.engine.pool, sa.pool.QueuePool)
        self.save_connections = SaveConnections(self.engine, keep=keep)
        self._save_begin = "BEGIN IMMEDIATE" if self.engine.dialect.name == "sqlite" else None
        self._ready = False
        self._ready_lock = threading.Lock()

    def _create_engine(self, kwargs: dict[str, Any]) -> Engine:
        backend = self.url.get_backend_name()
        if backend not in ("sqlite", "postgresql"):
            raise ConfigurationError(f"SqlStore supports SQLite and PostgreSQL, not {backend} ({self.label})")
        kwargs.setdefault("pool_pre_ping", True)
        if backend == "postgresql":
            kwargs.setdefault("connect_args", {}).setdefault("connect_timeout", 10)
        try:
            engine = sa.create_engine(self.url, **kwargs)
        except (ImportError, exc.NoSuchModuleError) as error:
            raise ConfigurationError(f"cannot use {self.label}: {error}; install lousho[postgres] (psycopg)") from None
        if backend == "sqlite":
            _sqlite_listeners(engine, self.sqlite_synchronous)
        return engine

    @contextmanager
    def translate(self) -> Iterator[None]:
        """Driver errors become `StoreUnavailableError` naming the database (never its password)."""
        try:
            yield
        except exc.IntegrityError:
            raise
        except exc.SQLAlchemyError as error:
            orig = getattr(error, "orig", None)
            detail = (str(orig if orig is not None else error).strip().splitlines() or ["no detail"])[0]
            detail = redact_secrets(detail, *self._secrets)
            raise StoreUnavailableError(
                f"the database {self.label} cannot be used: {detail}; check that the server is up and reachable, or the file writable"
            ) from error

    def ensure_tables(self) -> None:
        """Create what is missing (all tables on a new database, the newer ones on an old one)."""
        if self._ready:
            return
        with self._ready_lock, self.translate():
            if self._ready:
                return
            try:
                self._create_missing()
            except exc.IntegrityError:  # PostgreSQL: another process created the same table at the same moment
                self._create_missing()
            self._ready = True

    def _create_missing(self) -> None:
        with self.engine.connect().execution_options(**{_WRITE: True}) as conn, conn.begin():
            if self.schema and self.engine.dialect.name == "postgresql":
                conn.execute(sa.schema.CreateSchema(self.schema, if_not_exists=True))
            for table in self.meta.sorted_tables:
                conn.execute(sa.schema.CreateTable(table, if_not_exists=True))
                for index in table.indexes:
                    conn.execute(sa.schema.CreateIndex(index, if_not_exists=True))

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite), committed when the block ends."""
        self.ensure_tables()
        with self.translate(), self.engine.connect().execution_options(**{_WRITE: True}) as conn, conn.begin():
            yield conn

    def driver_write(self, work: Callable[[DriverTransaction], T]) -> T:
        """`work(transaction)` in a write transaction on the driver's own cursor, for the save's precompiled
        statements (`lousho.stores.sql_driver`, issue #20); errors translated as `write()` translates them.
        A call rather than a context manager, as `run_transaction` is (issue #30)."""
        if instrumented(self.engine):
            with self.write() as conn:
                return work(DriverTransaction(connection=conn))
        self.ensure_tables()
        with self.translate():
            return run_transaction(self.save_connections, self.engine.dialect, self._save_begin, work)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction on one snapshot (a head and the messages it names agree)."""
        self.ensure_tables()
        with self.translate(), self.engine.connect() as conn:
            if self.engine.dialect.name == "postgresql":  # SQLite: a read transaction is one snapshot already
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    def upsert(self, table: sa.Table, key: str, values: dict[str, Any]) -> Any:
        """INSERT ... ON CONFLICT DO UPDATE in either dialect."""
        insert = pg_insert if self.engine.dialect.name == "postgresql" else sqlite_insert
        statement = insert(table).values(**values)
        return statement.on_conflict_do_update(
            index_elements=[key], set_={k: statement.excluded[k] for k in values if k != key}
        )
