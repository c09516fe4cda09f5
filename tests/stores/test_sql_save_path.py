"""SqlStore's save on the driver's cursor (issue #20): SQLite keeps one connection per thread out of
the pool, which must never starve the pool, survive `close()`, and be replaced after a driver error,
which leaves the stored checkpoint as it was."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from lousho.errors import StoreUnavailableError
from lousho.stores.sql import SqliteStore, SqlStore
from lousho.testing.store_contract import sample_checkpoint


def test_saves_from_more_threads_than_the_pool_holds_never_starve_it(tmp_path: Path) -> None:
    store = SqlStore(
        f"sqlite:///{tmp_path / 'jobs.db'}", engine_kwargs={"pool_size": 1, "max_overflow": 0, "pool_timeout": 5}
    )
    errors: list[BaseException] = []
    all_saved = threading.Barrier(7)
    done = threading.Event()

    def save(index: int) -> None:
        try:
            for version in (1, 2, 3):
                store.checkpoints.save(f"s{index}", sample_checkpoint(f"s{index}", version=version))
        except BaseException as error:  # reported below
            errors.append(error)
        all_saved.wait(timeout=60)
        done.wait(timeout=60)  # alive, holding its connection, while the others save and the test reads

    threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    try:
        all_saved.wait(timeout=60)
        assert not errors, errors
        loaded = [store.checkpoints.load(f"s{i}") for i in range(6)]  # reads check a connection out of the pool
        assert [c.version if c else None for c in loaded] == [3] * 6
        assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=60)
        store.close()


def test_a_save_after_close_opens_a_new_connection(make_sqlite_store: Callable[..., SqliteStore]) -> None:
    store = make_sqlite_store()
    store.checkpoints.save("s", sample_checkpoint("s", version=1))
    store.close()

    store.checkpoints.save("s", sample_checkpoint("s", version=2))

    loaded = store.checkpoints.load("s")
    assert loaded is not None and loaded.version == 2


def test_a_driver_error_rolls_the_save_back_and_the_next_save_works(
    make_sqlite_store: Callable[..., SqliteStore],
) -> None:
    store = make_sqlite_store()
    store.checkpoints.save("s", sample_checkpoint("s", version=1))
    failing = "CREATE TRIGGER lousho_t_fail BEFORE INSERT ON checkpoint_history BEGIN SELECT * FROM no_such_table; END"
    with store.engine.begin() as conn:
        conn.exec_driver_sql(failing)

    with pytest.raises(StoreUnavailableError, match="no such table"):
        store.checkpoints.save("s", sample_checkpoint("s", version=2, step=1))

    with store.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT version FROM lousho_checkpoints WHERE session_id = 's'")).scalar()
        assert stored == 1  # the head's UPDATE, before the failing INSERT, was rolled back
        conn.exec_driver_sql("DROP TRIGGER lousho_t_fail")
        conn.commit()
    store.checkpoints.save("s", sample_checkpoint("s", version=2, step=1))
    loaded = store.checkpoints.load("s")
    assert loaded is not None and loaded.version == 2 and loaded.step_index == 1


def test_an_in_memory_database_reads_back_its_saves() -> None:
    store = SqlStore("sqlite://")  # the database lives in its one connection: the save must use that one
    try:
        for version in (1, 2):
            store.checkpoints.save("s", sample_checkpoint("s", version=version))
        loaded = store.checkpoints.load("s")
        assert loaded is not None and loaded.version == 2
        assert [entry.checkpoint.version for entry in store.checkpoints.history("s")] == [2, 1]
    finally:
        store.close()
