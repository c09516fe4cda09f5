"""The shared store contract, run on RedisStore (REDIS_URL or a private redis-server)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lousho.stores.redis import RedisStore
from lousho.stores.redis_checkpoints import RedisCheckpointStore
from lousho.testing.store_contract import StoreContract


class TestRedisStore(StoreContract):
    @pytest.fixture
    def store_factory(self, make_redis_store: Callable[..., RedisStore]) -> Callable[..., RedisStore]:
        return make_redis_store

    def write_raw(self, checkpoints: RedisCheckpointStore, session_id: str, raw: str | bytes) -> None:
        checkpoints.put_raw(session_id, raw)

    def read_raw(self, checkpoints: RedisCheckpointStore, session_id: str) -> Any:
        return checkpoints.client.get(checkpoints.keys.head(session_id))
