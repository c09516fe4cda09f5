"""The fleet's event counts, kept in Redis beside the store: reaper requeues, lease takeovers, poison results.

They are rare events that happen in many processes on many hosts (the reaper, any worker), and the
dashboard's `/metrics` (which may run on no worker's host) must show them: so they are counted
fleet-wide in one hash, `<prefix>telemetry:counters`, and exported as Prometheus counters by
`lousho.telemetry.metrics.StoreCollector` (issue #19). One HINCRBY per event, on a path that already
talks to Redis. On a Redis Cluster the hash is sharded by slot group, each process counting in the shard
of its `<host>|<pid>`'s group (`RedisKeys.fleet_wide_of`, issue #18); a read sums the 16 shards.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Literal, cast

import redis

from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors, text
from lousho.stores.redis_slots import on_shards

__all__ = ["COUNTED", "Counted", "FleetCounters"]

Counted = Literal["reaper_requeues", "lease_takeovers", "poison_results", "messages_handed_back"]
COUNTED: tuple[Counted, ...] = ("reaper_requeues", "lease_takeovers", "poison_results", "messages_handed_back")


@dataclass(frozen=True)
class FleetCounters:
    """The fleet-wide counts of one store's prefix: `key` is where this process counts, `shards` every key."""

    client: redis.Redis
    key: str
    shards: tuple[str, ...]

    @classmethod
    def of(cls, store: RedisStore) -> FleetCounters:
        keys = store.keys
        here = f"{socket.gethostname()}|{os.getpid()}"
        return cls(
            store.client,
            keys.fleet_wide_of("telemetry:counters", here),
            tuple(keys.fleet_wide_shards("telemetry:counters")),
        )

    def add(self, name: Counted, by: int = 1) -> None:
        with redis_errors(self.client, f"count {name}"):
            self.client.hincrby(self.key, name, by)

    def read(self) -> dict[Counted, int]:
        """Every count, summed over the shards, 0 for those never counted."""
        with redis_errors(self.client, "read the fleet's counters"):
            shards = on_shards(self.client, list(self.shards), lambda pipe, shard: pipe.hgetall(shard))
        found: dict[str, int] = {}
        for stored in cast(list[dict[bytes | str, bytes | str]], shards):
            for name, value in stored.items():
                found[text(name)] = found.get(text(name), 0) + int(value)
        return {name: found.get(name, 0) for name in COUNTED}
