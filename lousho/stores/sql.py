"""`SqlStore` and `SqliteStore`: checkpoints, their history and approvals in SQLite or PostgreSQL.

Built on SQLAlchemy 2 Core. Every save is a compare-and-set done by the database
itself (`UPDATE ... WHERE version = :previous`, or an INSERT that a unique key
refuses), so two processes can never both win a save, whatever their clocks say.

Tables (created on first use; `checkpoint_history` is added to a database written
before history existed): `lousho_checkpoints` (latest checkpoint per session),
`checkpoint_history` (the newest `history_limit` saves per session) and
`lousho_approvals`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine

from lousho.approvals import ApprovalSnapshot, utc_now
from lousho.checkpoint import Checkpoint, HistoryEntry, decode_checkpoint
from lousho.errors import (
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    CheckpointConflictError,
    ConfigurationError,
    SDKError,
    StoreUnavailableError,
)

__all__ = ["Pruned", "SqlApprovalStore", "SqlCheckpointStore", "SqlStore", "SqliteStore"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
_WRITE = "lousho_write"


class Pruned(NamedTuple):
    """What `prune()` removed."""

    checkpoints: int
    history: int


def _tables(schema: str | None) -> tuple[sa.MetaData, sa.Table, sa.Table, sa.Table]:
    """The three tables, in `schema` when given (PostgreSQL)."""
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
    return meta, checkpoints, history, approvals


def _now() -> datetime:
    """Naive UTC: what both SQLite and a PostgreSQL `timestamp` column store without conversion."""
    return datetime.now(UTC).replace(tzinfo=None)


def _cutoff(older_than: datetime | timedelta) -> datetime:
    if isinstance(older_than, timedelta):
        return _now() - older_than
    if older_than.tzinfo is not None:
        return older_than.astimezone(UTC).replace(tzinfo=None)
    return older_than


def _sqlite_listeners(engine: Engine) -> None:
    """WAL, a busy timeout and our own BEGIN on every connection, so processes can share one file.

    sqlite3's own transaction handling skips BEGIN before SELECT, which would make a
    read-then-write unsafe; we emit BEGIN (IMMEDIATE for writes, so a writer waits for
    the lock up front instead of failing when it upgrades a read).
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")


class _Database:
    """One engine, the tables, lazy creation and the translation of driver errors."""

    def __init__(self, url: str | sa.URL, schema: str | None, engine_kwargs: dict[str, Any] | None) -> None:
        try:
            self.url = sa.make_url(url)
        except exc.ArgumentError:  # its message repeats the URL, password included
            raise ConfigurationError("not a database URL: use dialect+driver://user:password@host/database") from None
        self.label = self.url.render_as_string(hide_password=True)
        self.schema = schema
        self.meta, self.checkpoints, self.history, self.approvals = _tables(schema)
        self.engine = self._create_engine(dict(engine_kwargs or {}))
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
            _sqlite_listeners(engine)
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
            if self.url.password:
                detail = detail.replace(str(self.url.password), "***")
            raise StoreUnavailableError(
                f"the database {self.label} cannot be used: {detail}; check that the server is up and reachable, or the file writable"
            ) from error

    def ensure_tables(self) -> None:
        """Create what is missing (all tables on a new database, `checkpoint_history` on an old one)."""
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

    @contextmanager
    def read(self) -> Iterator[Connection]:
        self.ensure_tables()
        with self.translate(), self.engine.connect() as conn, conn.begin():
            yield conn

    def upsert(self, table: sa.Table, key: str, values: dict[str, Any]) -> Any:
        """INSERT ... ON CONFLICT DO UPDATE in either dialect."""
        insert = pg_insert if self.engine.dialect.name == "postgresql" else sqlite_insert
        statement = insert(table).values(**values)
        return statement.on_conflict_do_update(
            index_elements=[key], set_={k: statement.excluded[k] for k in values if k != key}
        )


class SqlCheckpointStore:
    """Latest checkpoint per session (compare-and-set on `version`) plus a history ring."""

    def __init__(self, db: _Database, *, history_limit: int = 50) -> None:
        self._db = db
        self.history_limit = history_limit

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        """Store `checkpoint` if it follows the stored version; else `CheckpointConflictError`, nothing written."""
        raw, now, table = checkpoint.model_dump_json(), _now(), self._db.checkpoints
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
        cutoff, table, history = _cutoff(older_than), self._db.checkpoints, self._db.history
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
        values = {"session_id": session_id, "version": version, "status": status, "updated_at": _now(), "data": raw}
        with self._db.write() as conn:
            conn.execute(self._db.upsert(self._db.checkpoints, "session_id", values))


class SqlApprovalStore:
    """Approval snapshots by id; `decide` is a conditional UPDATE, so exactly one caller wins."""

    def __init__(self, db: _Database) -> None:
        self._db = db

    def save(self, snapshot: ApprovalSnapshot) -> None:
        values = {
            "id": snapshot.id,
            "session_id": snapshot.session_id,
            "status": snapshot.status,
            "created_at": snapshot.created_at,
            "data": snapshot.model_dump_json(),
        }
        with self._db.write() as conn:
            conn.execute(self._db.upsert(self._db.approvals, "id", values))

    def load(self, approval_id: str) -> ApprovalSnapshot | None:
        with self._db.read() as conn:
            return self._load(conn, approval_id)

    def _load(self, conn: Connection, approval_id: str) -> ApprovalSnapshot | None:
        table = self._db.approvals
        found = conn.execute(sa.select(table.c.data).where(table.c.id == approval_id)).scalar()
        return None if found is None else _decode_snapshot(approval_id, found)

    def decide(self, approval_id: str, approved: bool, note: str | None) -> ApprovalSnapshot:
        table = self._db.approvals
        with self._db.write() as conn:
            snapshot = self._load(conn, approval_id)
            if snapshot is None:
                raise ApprovalNotFoundError(f"no approval {approval_id!r} in {self._db.label}; check the id and store")
            if snapshot.status != "pending":
                raise _already_resolved(snapshot)
            status = "approved" if approved else "rejected"
            decided = snapshot.model_copy(update={"status": status, "note": note, "decided_at": utc_now()})
            pending = sa.and_(table.c.id == approval_id, table.c.status == "pending")
            updated = conn.execute(table.update().where(pending).values(status=status, data=decided.model_dump_json()))
            if updated.rowcount != 1:  # PostgreSQL: another transaction decided it after our read
                raise _already_resolved(self._load(conn, approval_id) or snapshot)
        return decided

    def reopen(self, approval_id: str) -> None:
        """Put a decided approval back to pending; an unknown id is left alone."""
        table = self._db.approvals
        with self._db.write() as conn:
            snapshot = self._load(conn, approval_id)
            if snapshot is not None:
                reopened = snapshot.model_copy(update={"status": "pending", "note": None, "decided_at": None})
                values = {"status": "pending", "data": reopened.model_dump_json()}
                conn.execute(table.update().where(table.c.id == approval_id).values(**values))

    def pending(self, session_id: str | None = None) -> list[ApprovalSnapshot]:
        """Approvals waiting for a decision, oldest first."""
        table = self._db.approvals
        query = sa.select(table.c.id, table.c.data).where(table.c.status == "pending")
        if session_id is not None:
            query = query.where(table.c.session_id == session_id)
        with self._db.read() as conn:
            rows = conn.execute(query.order_by(table.c.created_at, table.c.id)).all()
        return [_decode_snapshot(approval_id, data) for approval_id, data in rows]


def _decode_snapshot(approval_id: str, raw: str) -> ApprovalSnapshot:
    try:
        return ApprovalSnapshot.model_validate_json(raw)
    except ValueError as error:
        raise SDKError(
            f"the stored approval {approval_id!r} cannot be read ({error}); it was left as it is",
            code="LOUSHO_APPROVAL_CORRUPT",
        ) from None


def _already_resolved(snapshot: ApprovalSnapshot) -> ApprovalAlreadyResolvedError:
    return ApprovalAlreadyResolvedError(
        f"approval {snapshot.id!r} was already {snapshot.status} at {snapshot.decided_at}; it is not run again"
    )


class SqlStore:
    """A store bundle on SQLite or PostgreSQL: `.checkpoints` and `.approvals`.

    `url` is an SQLAlchemy URL (`sqlite:///path.db`, `postgresql+psycopg://user:pw@host/db`);
    `schema` puts the tables in a PostgreSQL schema (created if missing);
    `engine_kwargs` go to `sqlalchemy.create_engine`.
    """

    checkpoints: SqlCheckpointStore
    approvals: SqlApprovalStore

    def __init__(
        self,
        url: str | sa.URL,
        *,
        history_limit: int = 50,
        engine_kwargs: dict[str, Any] | None = None,
        schema: str | None = None,
    ) -> None:
        self._db = _Database(url, schema, engine_kwargs)
        self.checkpoints = SqlCheckpointStore(self._db, history_limit=history_limit)
        self.approvals = SqlApprovalStore(self._db)

    @property
    def engine(self) -> Engine:
        return self._db.engine

    def create_tables(self) -> None:
        """Create missing tables now (they are otherwise created on first use)."""
        self._db.ensure_tables()

    def sessions(self, status: str | None = None) -> list[str]:
        return self.checkpoints.sessions(status)

    def prune(self, older_than: datetime | timedelta) -> Pruned:
        return self.checkpoints.prune(older_than)

    def close(self) -> None:
        """Close pooled connections (the store opens new ones if used again)."""
        self._db.engine.dispose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._db.label!r})"


class SqliteStore(SqlStore):
    """`SqlStore` on one SQLite file (folder created); several processes may share it (WAL, busy timeout)."""

    def __init__(self, path: str | Path = "./.lousho/jobs.db", *, history_limit: int = 50) -> None:
        file = Path(path).expanduser()
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreUnavailableError(f"cannot create the folder of the SQLite file {file}: {error}") from None
        self.path = file
        super().__init__(sa.URL.create("sqlite", database=str(file)), history_limit=history_limit)
