"""The in-flight index: the sessions the fleet should be moving, each with a deadline (issue #14).

`<prefix>inflight` is a sorted set, session -> deadline in Redis server milliseconds. A save of an
'in-progress' checkpoint adds or refreshes its session there, atomically with the save (the store's
save script, with the deadline of `RedisStore.with_inflight_deadline`); a heartbeat, a decided
approval or a `resume` pushes the deadline; the reaper reads what is due and requeues it. This is the
fleet's side of it: reading and moving deadlines, on the store's Redis under its prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import redis

from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors, text

__all__ = ["InflightIndex"]


@dataclass(frozen=True)
class InflightIndex:
    """The in-flight index of one store; `deadline_ms` is how far a `touch` pushes a deadline."""

    client: redis.Redis
    key: str
    deadline_ms: int

    @classmethod
    def of(cls, store: RedisStore, deadline_ms: int) -> InflightIndex:
        return cls(store.client, store.keys.inflight, deadline_ms)

    def due(self, due_before_ms: int | None = None, limit: int | None = None) -> list[tuple[str, int]]:
        """(session, deadline ms) of in-flight sessions whose deadline is before `due_before_ms`
        (Redis server time; now when None), earliest first."""
        with redis_errors(self.client, "read the in-flight index"):
            if due_before_ms is None:
                due_before_ms = self.server_time_ms()
            rows = cast(
                list[tuple[bytes | str, float]],
                self.client.zrangebyscore(
                    self.key, "-inf", f"({due_before_ms}", start=0 if limit else None, num=limit, withscores=True
                ),
            )
        return [(text(member), int(score)) for member, score in rows]

    def touch(self, session_id: str, deadline_ms: int | None = None) -> None:
        """Set a session's deadline (default: server now + `deadline_ms`)."""
        with redis_errors(self.client, f"touch the in-flight deadline of {session_id!r}"):
            deadline = deadline_ms if deadline_ms is not None else self.server_time_ms() + self.deadline_ms
            self.client.zadd(self.key, {session_id: deadline})

    def drop(self, session_id: str) -> None:
        """Take a session out of the index (it is not running: parked, aborted, gone, a fresh fork)."""
        with redis_errors(self.client, f"drop {session_id!r} from the in-flight index"):
            self.client.zrem(self.key, session_id)

    def server_time_ms(self) -> int:
        """Redis server time: deadlines follow one clock, not each worker's."""
        with redis_errors(self.client, "read the Redis server's time"):
            seconds, micros = cast(tuple[int, int], self.client.time())
        return int(seconds) * 1000 + int(micros) // 1000
