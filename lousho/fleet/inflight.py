"""The in-flight index: the sessions the fleet should be moving, each with a deadline (issue #14).

A sorted set, session -> deadline in Redis server milliseconds. A save of an 'in-progress' checkpoint
adds or refreshes its session there, atomically with the save (the store's save script, with the
deadline of `RedisStore.with_inflight_deadline`); a heartbeat, a decided approval or a `resume`
pushes the deadline; the reaper reads what is due and requeues it. This is the fleet's side of it:
reading and moving deadlines, on the store's Redis under its prefix.

On one Redis the index is one key, `<prefix>inflight`. On a Redis Cluster (issue #18) it is sharded by
slot: a session's entry is in the shard of its own slot (`RedisKeys.inflight_of`), so the save script
writes both in one slot, and `due` reads every shard: one script call per primary (Redis 7), else a pipeline
of one `ZRANGEBYSCORE` per shard.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, cast

import redis

from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import RedisKeys, load_script, redis_errors, text
from lousho.stores.redis_slots import is_cluster, key_slot, on_shards

__all__ = ["InflightIndex"]


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

    def due(
        self, due_before_ms: int | None = None, limit: int | None = None, shards: list[str] | None = None
    ) -> list[tuple[str, int]]:
        """(session, deadline ms) of in-flight sessions whose deadline is before `due_before_ms`
        (Redis server time; now when None), earliest first, over `shards` (default: every shard)."""
        shards = self.keys.shards("inflight") if shards is None else shards
        with redis_errors(self.client, "read the in-flight index"):
            if due_before_ms is None:
                due_before_ms = self.server_time_ms()
            before = f"({due_before_ms}"
            rows = _due_per_node(self.client, shards, before, limit or 0)
            if rows is None:  # one Redis, or a server that refused the script: a ZRANGEBYSCORE per shard

                def read(pipe: Any, shard: str) -> object:
                    return pipe.zrangebyscore(
                        shard, "-inf", before, start=0 if limit else None, num=limit, withscores=True
                    )

                found = on_shards(self.client, shards, read)
                rows = [row for shard_rows in found for row in cast(list[tuple[bytes | str, float]], shard_rows)]
        earliest = heapq.nsmallest(limit, rows, key=lambda row: row[1]) if limit else sorted(rows, key=lambda r: r[1])
        return [(text(member), int(score)) for member, score in earliest]

    def count(self) -> int:
        """How many sessions the index holds, over every shard."""
        with redis_errors(self.client, "count the in-flight index"):
            sizes = on_shards(self.client, self.keys.shards("inflight"), lambda pipe, shard: pipe.zcard(shard))
        return sum(int(n) for n in sizes)

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


def _due_per_node(client: Any, shards: list[str], before: str, limit: int) -> list[tuple[bytes | str, float]] | None:
    """On a Redis Cluster, the due entries of every shard, one script call per primary (lua/due_in_shards.lua);
    None on one Redis, or when a node refused the script (Redis 6, a slot that moved during a failover)."""
    if not is_cluster(client) or not shards:
        return None
    by_node: dict[str, tuple[Any, list[str]]] = {}
    slot_map = client.nodes_manager.slots_cache  # slot -> [primary, replicas...]: read, never changed here
    rows: list[tuple[bytes | str, float]] = []
    try:
        for shard in shards:
            node = slot_map[key_slot(shard)][0]
            by_node.setdefault(node.name, (node, []))[1].append(shard)
        for node, node_shards in by_node.values():
            script = load_script(client.get_redis_connection(node), "lousho.fleet:due_in_shards")
            flat = cast(list[bytes | str], script(keys=node_shards[:1], args=[before, limit, *node_shards]))
            rows += [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]
    except (redis.RedisError, KeyError, IndexError):  # a slot not mapped, or moved: the caller pipelines
        return None
    return rows
