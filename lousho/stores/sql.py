"""`SqlStore` and `SqliteStore`: checkpoints, their history and approvals in SQLite or PostgreSQL.

Built on SQLAlchemy 2 Core. Every save is a compare-and-set done by the database
itself (`UPDATE ... WHERE version = :previous`, or an INSERT that a unique key
refuses), so two processes can never both win a save, whatever their clocks say.

A session's messages are stored once (`lousho_messages`); the latest checkpoint and each
history entry are small heads naming the messages they use, so a save costs the same at
step 500 as at step 10.

The parts: `lousho.stores.sql_database` (tables, engine, transactions),
`lousho.stores.sql_checkpoints` (`SqlCheckpointStore`, the layout), `lousho.stores.sql_transcripts`
(the message rows), `lousho.stores.segments` (the head format, shared with FileStore) and
`lousho.stores.sql_approvals` (`SqlApprovalStore`); their public names are importable from here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lousho.errors import ConfigurationError, StoreUnavailableError
from lousho.store_bundle import SessionsOfCheckpoints
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.sql_approvals import SqlApprovalStore
from lousho.stores.sql_checkpoints import Pruned, SqlCheckpointStore
from lousho.stores.sql_database import SQLITE_BUSY_TIMEOUT_MS, SqlDatabase

__all__ = [
    "SQLITE_BUSY_TIMEOUT_MS",
    "Pruned",
    "SqlApprovalStore",
    "SqlCheckpointStore",
    "SqlStore",
    "SqliteStore",
    "open_sqlite_url",
    "open_url",
]


class SqlStore(SessionsOfCheckpoints):
    """A store bundle (`lousho.StoreBundle`) on SQLite or PostgreSQL: `.checkpoints`, `.approvals`,
    `sessions()`, `prune()`, `delete()`.

    `url` is an SQLAlchemy URL (`sqlite:///path.db`, `postgresql+psycopg://user:pw@host/db`);
    `schema` puts the tables in a PostgreSQL schema (created if missing);
    `engine_kwargs` go to `sqlalchemy.create_engine`;
    `codec` compresses and encrypts messages, heads' secret fields and approvals (issue #17, off by default).
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
        sqlite_synchronous: str = "NORMAL",
        codec: PayloadCodec = PLAIN,
    ) -> None:
        self._db = SqlDatabase(url, schema, engine_kwargs, sqlite_synchronous)
        # issue #31: values are bound to the store's schema (a SQLite file or a database may be moved)
        self.codec = codec = codec.for_store(f"sql:{schema or ''}")
        self.checkpoints = SqlCheckpointStore(self._db, history_limit=history_limit, codec=codec)
        self.approvals = SqlApprovalStore(self._db, codec=codec)

    @property
    def engine(self) -> Engine:
        return self._db.engine

    def create_tables(self) -> None:
        """Create missing tables now (they are otherwise created on first use)."""
        self._db.ensure_tables()

    def close(self) -> None:
        """Close pooled connections (the store opens new ones if used again)."""
        self._db.save_connections.close()
        self._db.engine.dispose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._db.label!r})"


class SqliteStore(SqlStore):
    """`SqlStore` on one SQLite file (folder created); several processes may share it (WAL, busy timeout)."""

    def __init__(
        self,
        path: str | Path = "./.lousho/jobs.db",
        *,
        history_limit: int = 50,
        synchronous: str = "NORMAL",
        codec: PayloadCodec = PLAIN,
    ) -> None:
        file = Path(path).expanduser()
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreUnavailableError(f"cannot create the folder of the SQLite file {file}: {error}") from None
        self.path = file
        super().__init__(
            sa.URL.create("sqlite", database=str(file)),
            history_limit=history_limit,
            sqlite_synchronous=synchronous,
            codec=codec,
        )


def open_sqlite_url(url: str, *, prefix: str = "lousho:", codec: PayloadCodec = PLAIN) -> SqliteStore:
    """`sqlite:///path.db` (SQLAlchemy's form: `sqlite:////abs/path.db`), the store registry's opener."""
    from lousho.stores.registry import local_path

    path = local_path(url, "sqlite")
    if not path.startswith("/"):
        raise ConfigurationError(f"the store URL {url!r} needs three slashes: sqlite:///path.db")
    return SqliteStore(path[1:], codec=codec)


def open_url(url: str, *, prefix: str = "lousho:", codec: PayloadCodec = PLAIN) -> SqlStore:
    """`postgresql://...` or `postgres://...` (psycopg 3, the driver of lousho's postgres extra, unless the
    URL names one: `postgresql+psycopg2://`), the store registry's opener."""
    scheme, _, rest = url.partition("://")
    if "+" not in scheme:
        scheme = "postgresql+psycopg"
    return SqlStore(f"{scheme}://{rest}", codec=codec)
