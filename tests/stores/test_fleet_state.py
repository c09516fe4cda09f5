"""The fleet's state lives with the fleet, not on the checkpoint store (issue #14)."""

from __future__ import annotations

from collections.abc import Callable

from lousho.fleet.inflight import InflightIndex
from lousho.fleet.settings import FleetSettings
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.stores.redis_checkpoints import RedisCheckpointStore
from lousho.testing.store_contract import sample_checkpoint

FLEET_MEMBERS = ("cached", "read_keys", "from_reply", "inflight", "touch_inflight", "drop_inflight", "server_time_ms")


def test_the_checkpoint_store_offers_the_store_contract_and_no_fleet_members() -> None:
    assert [name for name in FLEET_MEMBERS if hasattr(RedisCheckpointStore, name)] == []
    assert isinstance(RedisCheckpointStore.inflight_deadline_ms, property), "set at construction, never assigned"


def test_a_client_gives_its_saves_the_lease_deadline_and_leaves_the_store_it_was_given_as_it_was(
    make_redis_store: Callable[..., RedisStore],
) -> None:
    store = make_redis_store(inflight_deadline_ms=120_000)
    client = Client(broker="memory://", store=store, settings=FleetSettings(lease_ttl_s=2.0))
    index = InflightIndex.of(store, 2_000)
    assert store.checkpoints.inflight_deadline_ms == 120_000
    assert client.store.checkpoints.reader is store.checkpoints.reader, "one cache for both"

    now = index.server_time_ms()
    client.enqueue("agent", "hello", session_id="by-client", require_worker=False)
    store.checkpoints.save(
        "by-store", sample_checkpoint("by-store").model_copy(update={"version": 1, "status": "in-progress"})
    )
    deadlines = dict(index.due(now + 600_000))
    assert now + 1_000 < deadlines["by-client"] <= index.server_time_ms() + 2_000
    assert now + 110_000 < deadlines["by-store"] <= index.server_time_ms() + 120_000
    assert store.checkpoints.reader.cached("by-client") is not None, "the client's save is in the store's cache"
