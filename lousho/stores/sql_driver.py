"""The save's statements on the database driver's own cursor (issue #20).

A save runs six or seven small statements. Through SQLAlchemy Core each costs some 100 us of
Python (the execution context, result wrapping, the compiled-cache lookup, events), where SQLite
itself runs one in a few microseconds: most of SqliteStore's overhead per step. So the save
compiles its statements once for the engine's dialect (`DriverStatement`: SQLAlchemy still writes
the SQL, the schema and the paramstyle) and runs them on the pooled DBAPI connection
(`DriverTransaction`), with SQLAlchemy's own bind processing of each parameter's type and its
translation of driver errors (`exc.DBAPIError.instance`, so `IntegrityError` and the store's
`translate()` work as before). Reads and the rare statements stay on SQLAlchemy Core.
"""

from __future__ import annotations

import operator
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from sqlalchemy import exc
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

T = TypeVar("T")

__all__ = ["DriverStatement", "DriverTransaction", "SaveConnections", "instrumented", "run_transaction"]


class DriverStatement:
    """One statement compiled once for a dialect: its SQL text, and how a dict of values becomes the
    driver's parameters (in `positiontup` order for a positional paramstyle, by name otherwise, each
    through its type's bind processor, e.g. DateTime to text on SQLite)."""

    def __init__(self, statement: ClauseElement, dialect: Dialect, column_keys: Sequence[str] | None = None) -> None:
        compiled = statement.compile(dialect=dialect, column_keys=list(column_keys) if column_keys else None)
        assert isinstance(compiled, SQLCompiler)
        self.sql = compiled.string
        binds = {name: bind for bind, name in compiled.bind_names.items()}  # by the name the SQL renders
        self._positional = compiled.positional
        self._names: list[str] = list(compiled.positiontup or []) if compiled.positional else list(binds)
        self._pick = _picker(self._names)
        self._fixed = {name: bind.value for name, bind in binds.items() if bind.value is not None}
        """Values the statement holds itself (a LIMIT's)."""
        self._processors: dict[str, Callable[[Any], Any]] = {}
        for name, bind in binds.items():
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                self._processors[name] = processor

    def params(self, values: Mapping[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        """The driver's parameters for `values` (keyed by bind name: column names, `bindparam` names)."""
        if self._fixed or self._processors:
            merged = {**self._fixed, **values}
            for name, processor in self._processors.items():
                merged[name] = processor(merged[name])
            values = merged
        if self._positional:
            return self._pick(values)
        return {name: values[name] for name in self._names}


def _picker(names: list[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """`values` -> the tuple of `values[name]` for each of `names`, in C (`itemgetter`)."""
    if not names:
        return lambda values: ()
    if len(names) == 1:
        name = names[0]
        return lambda values: (values[name],)
    return operator.itemgetter(*names)


class DriverTransaction:
    """A write transaction: statements run on one DBAPI cursor, or, when the engine has cursor
    listeners (`before_cursor_execute`: tracing, logging, tests that count what a save sends), on a
    SQLAlchemy connection (`exec_driver_sql`: the same SQL text, and the listeners see it)."""

    def __init__(self, cursor: Any = None, connection: Connection | None = None) -> None:
        self._cursor = cursor
        self._connection = connection

    def execute(self, statement: DriverStatement, values: Mapping[str, Any]) -> Any:
        """Run `statement`; its cursor or result (`fetchone()`, `fetchall()`, `rowcount`)."""
        params = statement.params(values)
        if self._connection is not None:
            return self._connection.exec_driver_sql(statement.sql, params)
        try:
            self._cursor.execute(statement.sql, params)
        except Exception as error:
            raise _Failed(statement.sql, params, error) from error
        return self._cursor

    def execute_many(self, statement: DriverStatement, rows: Sequence[Mapping[str, Any]]) -> None:
        params = [statement.params(row) for row in rows]
        if self._connection is not None:
            self._connection.exec_driver_sql(statement.sql, params)
            return
        try:
            self._cursor.executemany(statement.sql, params)
        except Exception as error:
            raise _Failed(statement.sql, params, error) from error


def instrumented(engine: Engine) -> bool:
    """Whether something listens to the engine's cursor executions (then the save goes through them)."""
    dispatch = engine.dispatch
    return bool(dispatch.before_cursor_execute or dispatch.after_cursor_execute)


class _Failed(Exception):
    """A driver error with the statement it came from, turned into SQLAlchemy's by `driver_transaction`."""

    def __init__(self, sql: str, params: Any, error: Exception) -> None:
        super().__init__(str(error))
        self.sql, self.params, self.error = sql, params, error


class SaveConnections:
    """Where a save's DBAPI connection comes from. PostgreSQL: the pool, per save (a checkout pings the
    server, so a restart costs no failed save). SQLite (`keep`): one connection per thread, taken from the
    pool once and detached from it (so held ones never starve the pool), since a checkout and checkin cost
    a save as much as two of its statements (issue #20). A thread gets a new one after a driver error,
    after `close()` (`SqlStore.close`), and in a forked child (the parent's is never touched there)."""

    def __init__(self, engine: Engine, *, keep: bool) -> None:
        self._engine = engine
        self._keep = keep
        self._local = threading.local()
        self._held: weakref.WeakSet[Any] = weakref.WeakSet()
        """Every thread's kept connection, for `close()`; one whose thread ended goes with its thread-local."""
        self._generation = 0
        self._lock = threading.Lock()

    def take(self) -> Any:
        """A connection for one save (`give_back` it after)."""
        if not self._keep:
            return self._engine.raw_connection()
        held = getattr(self._local, "held", None)
        if held is not None:
            pid, generation, connection = held
            if pid == os.getpid() and generation == self._generation:
                return connection
            if pid != os.getpid():
                _INHERITED.append(connection)  # closing SQLite's connection in a forked child is unsafe
        connection = self._engine.raw_connection()
        connection.detach()
        with self._lock:
            self._held.add(connection)
            self._local.held = (os.getpid(), self._generation, connection)
        return connection

    def give_back(self, connection: Any, *, failed: bool) -> None:
        """Keep it (SQLite, no error), else close it (back to the pool; a kept one for good)."""
        if self._keep and not failed:
            return
        if self._keep:
            self._local.held = None
            with self._lock:
                self._held.discard(connection)
        _quietly(connection.close)

    def close(self) -> None:
        """Close every kept connection (`SqlStore.close`); threads take new ones when they save again."""
        with self._lock:
            held, self._held = list(self._held), weakref.WeakSet()
            self._generation += 1
        for connection in held:
            _quietly(connection.close)


_INHERITED: list[Any] = []
"""Kept connections a forked child inherited: referenced, so never closed (nor collected) there."""


def run_transaction(
    connections: SaveConnections, dialect: Dialect, begin: str | None, work: Callable[[DriverTransaction], T]
) -> T:
    """`work(transaction)` in a transaction on a connection from `connections`, committed when it returns,
    rolled back if it raises; what it returns. `begin`: the statement that opens it (SQLite: BEGIN IMMEDIATE,
    since the engine's connections are in autocommit mode); None where the driver opens one by itself (psycopg).
    A call, not a context manager: a generator's enter and exit cost a save more than its BEGIN (issue #30).

    A driver error raises as SQLAlchemy wraps it (`exc.IntegrityError`, `exc.OperationalError`...),
    and a connection the dialect finds disconnected is dropped from the pool."""
    dbapi = dialect.dbapi
    assert dbapi is not None
    connection = connections.take()
    cursor, failed = None, True
    try:
        cursor = connection.cursor()
        if begin is not None:
            cursor.execute(begin)
        result = work(DriverTransaction(cursor))
        connection.commit()
        failed = False
        return result
    except BaseException as raised:
        _quietly(connection.rollback)
        error = raised.error if isinstance(raised, _Failed) else raised
        if not isinstance(error, dbapi.Error):
            if error is raised:
                raise
            raise error from None
        if dialect.is_disconnect(error, connection.dbapi_connection, cursor):
            connection.invalidate(error)
        sql, params = (raised.sql, raised.params) if isinstance(raised, _Failed) else (begin or "COMMIT", None)
        raise exc.DBAPIError.instance(sql, params, error, dbapi.Error) from error
    finally:
        if cursor is not None:
            _quietly(cursor.close)
        connections.give_back(connection, failed=failed)


def _quietly(call: Callable[[], object]) -> None:
    """Rollback and close after a failure: the first error is the one to report (a dead connection
    fails these too; the pool replaces it)."""
    with suppress(Exception):
        call()
