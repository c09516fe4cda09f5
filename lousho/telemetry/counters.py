"""The fleet's event counts, kept in Redis beside the store: reaper requeues, lease takeovers, poison results.

They are rare events that happen in many processes on many hosts (the reaper, any worker), and the
dashboard's `/metrics` (which may run on no worker's host) must show them: so they are counted
fleet-wide in one hash, `<prefix>telemetry:counters`, and exported as Prometheus counters by
`lousho.telemetry.metrics.StoreCollector` (issue #19). One HINCRBY per event, on a path that already
talks to Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import redis

from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors, text

__all__ = ["COUNTED", "Counted", "FleetCounters"]

Counted = Literal["reaper_requeues", "lease_takeovers", "poison_results"]
COUNTED: tuple[Counted, ...] = ("reaper_requeues", "lease_takeovers", "poison_results")


@dataclass(frozen=True)
class FleetCounters:
    """The fleet-wide counts of one store's prefix."""

    client: redis.Redis
    key: str

    @classmethod
    def of(cls, store: RedisStore) -> FleetCounters:
        return cls(store.client, f"{store.prefix}telemetry:counters")

    def add(self, name: Counted, by: int = 1) -> None:
        with redis_errors(self.client, f"count {name}"):
            self.client.hincrby(self.key, name, by)

    def read(self) -> dict[Counted, int]:
        """Every count, 0 for those never counted."""
        with redis_errors(self.client, "read the fleet's counters"):
            stored = cast(dict[bytes | str, bytes | str], self.client.hgetall(self.key))
        found = {text(name): int(value) for name, value in stored.items()}
        return {name: found.get(name, 0) for name in COUNTED}
