"""One store bundle (issue #16, item 5): every built-in store is a `lousho.StoreBundle` with `sessions(status=)`,
`prune()` and `delete()`; `create_agent` and the settings take the protocol; store URLs are a registry of schemes,
so a new backend is one registration. (The bundle part of the contract suite runs on each store in
test_contract.py and test_redis_contract.py.)

New names are imported inside the tests, so that each test fails on its own on code without them."""

from __future__ import annotations

import typing
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lousho import ConfigurationError, create_agent, memory_store
from lousho.providers import ScriptedProvider
from lousho.settings import LoushoSettings, store_from_url
from lousho.stores.redis import RedisStore
from lousho.testing.store_contract import sample_checkpoint

KINDS = ["memory", "sqlite", "postgres", "file", "redis", "mapping"]


@pytest.fixture(params=KINDS)
def bundle(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    kind = request.param
    if kind == "memory":
        return memory_store()
    if kind == "mapping":
        return memory_store(storage={})
    if kind == "file":
        from lousho.stores.file import FileStore

        return FileStore(tmp_path / "files")
    maker = {"sqlite": "make_sqlite_store", "postgres": "make_postgres_store", "redis": "make_redis_store"}[kind]
    return request.getfixturevalue(maker)()


def _finish(store: Any, session_id: str, status: str = "finished") -> None:
    store.checkpoints.save(session_id, sample_checkpoint(session_id, version=1, status="in-progress", approval_id=None))
    store.checkpoints.save(
        session_id, sample_checkpoint(session_id, version=2, step=1, status=status, approval_id=None)
    )


def test_every_built_in_store_lists_prunes_and_deletes_sessions_as_a_bundle(bundle: Any) -> None:
    from lousho import StoreBundle

    assert isinstance(bundle, StoreBundle)
    _finish(bundle, "s-done")
    _finish(bundle, "s-open", status="in-progress")
    assert list(bundle.sessions()) == ["s-done", "s-open"]
    assert list(bundle.sessions(status="in-progress")) == ["s-open"]
    assert tuple(bundle.prune(timedelta(days=1))) == (0, 0)
    assert tuple(bundle.prune(datetime.now(UTC) + timedelta(minutes=1))) == (1, 4)
    assert list(bundle.sessions()) == ["s-open"]
    bundle.delete("s-open")
    assert list(bundle.sessions()) == [] and bundle.checkpoints.load("s-open") is None


def test_redis_prune_removes_a_finished_sessions_fleet_keys_and_keeps_a_running_ones(
    make_redis_store: Callable[..., RedisStore],
) -> None:
    store = make_redis_store()
    _finish(store, "s-done")
    _finish(store, "s-open", status="in-progress")
    for session_id in ("s-done", "s-open"):  # what a fleet's run leaves beside a checkpoint
        store.client.set(store.keys.session_key(session_id, "results"), "{}")
    assert tuple(store.prune(datetime.now(UTC) + timedelta(minutes=1))) == (1, 4)
    left = [key.decode() for key in store.client.scan_iter(match=f"{store.prefix}*")]
    assert [key for key in left if "s-done" in key] == []
    assert store.keys.session_key("s-open", "results") in left and store.checkpoints.load("s-open") is not None


def test_create_agent_and_the_settings_take_the_store_bundle_protocol() -> None:
    from lousho import StoreBundle
    from lousho.agent import DurableAgent

    assert typing.get_type_hints(create_agent)["store"] == StoreBundle | None
    assert typing.get_type_hints(DurableAgent)["store"] == StoreBundle | None
    assert typing.get_type_hints(LoushoSettings.store)["return"] is StoreBundle
    assert typing.get_type_hints(store_from_url)["return"] is StoreBundle


def test_create_agent_refuses_a_store_that_is_not_a_bundle_and_names_what_it_lacks() -> None:
    class Parts:
        checkpoints = memory_store().checkpoints
        approvals = memory_store().approvals

    with pytest.raises(ConfigurationError, match="Parts, which has no sessions, prune, delete"):
        create_agent(provider=ScriptedProvider(), store=Parts())  # type: ignore[arg-type]
    assert create_agent(provider=ScriptedProvider(), store=memory_store(storage={})).store is not None


def test_each_store_url_opens_its_store_through_the_registry(tmp_path: Path, redis_url: str) -> None:
    from lousho.stores.file import FileStore
    from lousho.stores.mapping import MappingStore
    from lousho.stores.registry import store_schemes
    from lousho.stores.sql import SqliteStore

    opened = {
        f"sqlite:///{tmp_path / 'jobs.db'}": SqliteStore,
        f"file://{tmp_path / 'files'}": FileStore,
        f"dbm://{tmp_path / 'runs.db'}": MappingStore,
        redis_url: RedisStore,
    }
    for url, kind in opened.items():
        store = LoushoSettings(store_url=url).store()
        assert type(store) is kind, url
        store.sessions()  # it works, not only opens
    assert {"redis", "sqlite", "postgresql", "file", "dbm"} <= set(store_schemes())


def test_a_postgresql_url_opens_an_sql_store_on_psycopg(postgres_url: str) -> None:
    from lousho.stores.sql import SqlStore

    plain = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    for url in (plain, plain.replace("postgresql://", "postgres://"), postgres_url):
        store = store_from_url(url)
        assert isinstance(store, SqlStore) and store.engine.url.drivername == "postgresql+psycopg"
        store.close()


def test_an_unknown_store_url_names_every_registered_scheme_dbm_included() -> None:
    with pytest.raises(ConfigurationError) as caught:
        store_from_url("mongodb://user:hunter2@db.example/app")
    message = str(caught.value)
    assert "dbm:///path.db" in message and "redis://host:port/db" in message and "hunter2" not in message


def test_a_dbm_url_takes_no_password(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="takes no user or password") as caught:
        store_from_url(f"dbm://me:hunter2@{tmp_path}/runs.db")
    assert "hunter2" not in str(caught.value)


def open_kv(url: str, *, prefix: str = "lousho:") -> Any:
    """A backend of this test module: the mapping store on a dict named by the URL."""
    from lousho.stores.mapping import mapping_store

    return mapping_store(KV.setdefault(url, {}), prefix=prefix)


KV: dict[str, dict[str, str]] = {}


def test_a_new_backend_is_one_registration(tmp_path: Path) -> None:
    """Registered by name (imported on first use) or as a function: the settings, hence the CLI, open it."""
    from lousho.stores.registry import register_store

    register_store("kv-test", "tests.stores.test_bundles:open_kv", example="kv-test://bucket")
    store = LoushoSettings(store_url="kv-test://bucket", prefix="app:").store()
    _finish(store, "s-kv")
    assert next(iter(KV["kv-test://bucket"])).startswith("app:")
    assert list(LoushoSettings(store_url="kv-test://bucket", prefix="app:").store().sessions()) == ["s-kv"]
    register_store(["kv-fn", "kv-fn2"], open_kv, example="kv-fn://bucket")
    assert list(store_from_url("kv-fn2://other").sessions()) == []
