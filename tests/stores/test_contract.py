"""The store contract, run on every built-in store: memory, SQLite, PostgreSQL, files and the mapping store
on a dict, a shelve and a dbm file (issue #16; Redis: test_redis_contract.py); each also with the payload
codec on, compression and encryption (`<backend>+codec`, issue #17)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lousho.stores.file import FileCheckpointStore, FileStore
from lousho.stores.mapping_checkpoints import MappingCheckpointStore
from lousho.stores.memory import MemoryCheckpointStore, memory_store
from lousho.stores.sql import SqlCheckpointStore
from lousho.testing.store_contract import StoreContract
from tests.stores.codecs import codec_params, with_codec
from tests.stores.mappings import MAPPINGS, mapping_stores

BACKENDS = ["memory", "sqlite", "postgres", "file", *(f"mapping-{kind}" for kind in MAPPINGS)]


class TestBuiltInStores(StoreContract):
    @pytest.fixture(params=codec_params(BACKENDS))
    def store_factory(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
        backend, _, codec = str(request.param).partition("+")
        if backend.startswith("mapping-"):
            with mapping_stores(backend.removeprefix("mapping-"), tmp_path) as make:
                yield with_codec(make) if codec else make
            return
        made = self._factory(backend, request, tmp_path)
        yield with_codec(made) if codec else made

    def _factory(self, backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
        if backend == "memory":
            return memory_store
        if backend == "sqlite":
            return request.getfixturevalue("make_sqlite_store")  # type: ignore[no-any-return]
        if backend == "postgres":
            return request.getfixturevalue("make_postgres_store")  # type: ignore[no-any-return]
        made: list[int] = []

        def make_file_store(**kwargs: Any) -> FileStore:
            made.append(1)
            return FileStore(tmp_path / f"files-{len(made)}", **kwargs)

        return make_file_store

    def write_raw(self, checkpoints: Any, session_id: str, raw: str | bytes) -> None:
        if isinstance(checkpoints, (FileCheckpointStore, MappingCheckpointStore)):
            checkpoints.put_raw(session_id, raw)
            return
        if isinstance(raw, bytes):
            raise NotImplementedError("a text column holds no arbitrary bytes")
        checkpoints.put_raw(session_id, raw)
        if isinstance(checkpoints, MemoryCheckpointStore):  # what a record written by an older version looks like
            try:
                version = json.loads(raw).get("version")
            except (ValueError, AttributeError):
                version = None
            if isinstance(version, int):
                checkpoints._versions[session_id] = version

    def write_raw_approval(self, approvals: Any, approval_id: str, raw: str) -> None:
        approvals.put_raw(approval_id, raw)

    def read_raw(self, checkpoints: Any, session_id: str) -> str | bytes | None:
        if isinstance(checkpoints, (FileCheckpointStore, SqlCheckpointStore, MappingCheckpointStore)):
            return checkpoints.get_raw(session_id)
        return checkpoints._latest.get(session_id)  # type: ignore[no-any-return]
