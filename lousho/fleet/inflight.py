"""The in-flight index: the sessions the fleet should be moving, each with a deadline (issue #14).

A sorted set, session -> deadline in Redis server milliseconds. A save of an 'in-progress' checkpoint
adds or refreshes its session there, atomically with the save (the store's save script, with the
deadline of `RedisStore.with_inflight_deadline`); a heartbeat, a decided approval or a `resume`
pushes the deadline; the reaper reads what is due and requeues it. This is the fleet's side of it:
reading and moving deadlines, on the store's Redis under its prefix.

On one Redis the index is one key, `<prefix>inflight`. On a Redis Cluster (issue #18) it is sharded by
slot: a session's entry is in the shard of its own slot (`RedisKeys.inflight_of`), so the save script
writes both in one slot, and `due` reads every shard, one `ZRANGEBYSCORE` each, pipelined per node.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import cast

import redis

from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import RedisKeys, redis_errors, text

__all__ = ["InflightIndex"]

SHARDS_PER_PIPELINE = 2048
"""Shards read per round trip in the cluster layout: 16,384 ZRANGEBYSCOREs in eight pipelines."""


@dataclass(frozen=True)
class InflightIndex:
    """The in-flight index of one store; `deadline_ms` is how far a `touch` pushes a deadline."""

    client: redis.Redis
    keys: RedisKeys
    deadline_ms: int

    @classmethod
    def of(cls, store: RedisStore, deadline_ms: int) -> InflightIndex:
        return cls(store.client, store.keys, deadline_ms)

    @property
    def key(self) -> str:
        """The index's one key on a single Redis (the cluster layout has a shard per slot: `shards`)."""
        return self.keys.shards("inflight")[0]

    def due(self, due_before_ms: int | None = None, limit: int | None = None) -> list[tuple[str, int]]:
        """(session, deadline ms) of in-flight sessions whose deadline is before `due_before_ms`
        (Redis server time; now when None), earliest first, over every shard."""
        with redis_errors(self.client, "read the in-flight index"):
            if due_before_ms is None:
                due_before_ms = self.server_time_ms()
            shards = self.keys.shards("inflight")
            rows: list[tuple[bytes | str, float]] = []
            for start in range(0, len(shards), SHARDS_PER_PIPELINE):
                pipe = self.client.pipeline(transaction=False)
                for shard in shards[start : start + SHARDS_PER_PIPELINE]:
                    pipe.zrangebyscore(
                        shard, "-inf", f"({due_before_ms}", start=0 if limit else None, num=limit, withscores=True
                    )
                for found in cast(list[list[tuple[bytes | str, float]]], pipe.execute()):
                    rows.extend(found)
        earliest = heapq.nsmallest(limit, rows, key=lambda row: row[1]) if limit else sorted(rows, key=lambda r: r[1])
        return [(text(member), int(score)) for member, score in earliest]

    def count(self) -> int:
        """How many sessions the index holds, over every shard."""
        with redis_errors(self.client, "count the in-flight index"):
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys.shards("inflight"):
                pipe.zcard(shard)
            return sum(int(n) for n in pipe.execute())

    def touch(self, session_id: str, deadline_ms: int | None = None) -> None:
        """Set a session's deadline (default: server now + `deadline_ms`)."""
        with redis_errors(self.client, f"touch the in-flight deadline of {session_id!r}"):
            deadline = deadline_ms if deadline_ms is not None else self.server_time_ms() + self.deadline_ms
            self.client.zadd(self.keys.inflight_of(session_id), {session_id: deadline})

    def drop(self, session_id: str) -> None:
        """Take a session out of the index (it is not running: parked, aborted, gone, a fresh fork)."""
        with redis_errors(self.client, f"drop {session_id!r} from the in-flight index"):
            self.client.zrem(self.keys.inflight_of(session_id), session_id)

    def server_time_ms(self) -> int:
        """Redis server time: deadlines follow one clock, not each worker's."""
        with redis_errors(self.client, "read the Redis server's time"):
            seconds, micros = cast(tuple[int, int], self.client.time())
        return int(seconds) * 1000 + int(micros) // 1000
