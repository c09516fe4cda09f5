"""A custom store as small as it gets (three methods over a dict) passes the required part of the contract.

This file is also the example of how a store author runs the suite on their own store.
"""

from __future__ import annotations

from typing import Any

import pytest

from lousho import Checkpoint
from lousho.checkpoint import decode_checkpoint
from lousho.testing.store_contract import CheckpointStoreContract


class DictCheckpointStore:
    """save/load/delete over a dict of JSON strings; no versions, no history, no approvals."""

    def __init__(self) -> None:
        self.records: dict[str, str] = {}

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        self.records[session_id] = checkpoint.model_dump_json()

    def load(self, session_id: str) -> Checkpoint | None:
        raw = self.records.get(session_id)
        return None if raw is None else decode_checkpoint(session_id, raw)

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        self.records.pop(session_id, None)


class AsyncDictCheckpointStore(DictCheckpointStore):
    """The same store with async methods: the suite awaits them."""

    async def save(self, session_id: str, checkpoint: Checkpoint) -> None:  # type: ignore[override]
        super().save(session_id, checkpoint)

    async def load(self, session_id: str) -> Checkpoint | None:  # type: ignore[override]
        return super().load(session_id)

    async def delete(self, session_id: str, keep_history: bool = False) -> None:  # type: ignore[override]
        super().delete(session_id, keep_history)


class TestDictStore(CheckpointStoreContract):
    @pytest.fixture
    def store(self) -> DictCheckpointStore:
        return DictCheckpointStore()

    def write_raw(self, checkpoints: Any, session_id: str, raw: str | bytes) -> None:
        if isinstance(raw, bytes):
            raise NotImplementedError
        checkpoints.records[session_id] = raw

    def read_raw(self, checkpoints: Any, session_id: str) -> str | None:
        return checkpoints.records.get(session_id)  # type: ignore[no-any-return]


class TestAsyncDictStore(TestDictStore):
    @pytest.fixture
    def store(self) -> AsyncDictCheckpointStore:
        return AsyncDictCheckpointStore()


class TestWithoutHooks(CheckpointStoreContract):
    """Without write_raw the tests of planted records skip; everything else runs."""

    @pytest.fixture
    def store(self) -> DictCheckpointStore:
        return DictCheckpointStore()
