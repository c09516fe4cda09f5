"""`RedisStore`: checkpoints, history and approvals in Redis, shared by every process of a fleet.

```python
store = RedisStore("redis://localhost:6379/0")          # or RedisStore(redis_client), RedisStore.from_env()
agent = create_agent(..., store=store)
```

What a save costs does not grow with the transcript: messages are stored once and
appended, and each history entry refers to a prefix of them (see
`lousho.stores.redis_checkpoints` for the layout). Every save is one Lua script, a
compare-and-set on the checkpoint's version, so a worker that lost its lease cannot
overwrite newer progress. Driver errors become `StoreUnavailableError` naming the
Redis (never its password). Deploy Redis with `appendonly yes` and
`maxmemory-policy noeviction`: an evicted key is a lost checkpoint.
"""

from __future__ import annotations

import copy
import os
from datetime import datetime, timedelta
from typing import Any, cast

import redis

from lousho.errors import ConfigurationError
from lousho.store_bundle import Pruned, SessionsOfCheckpoints
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.redis_approvals import RedisApprovalStore
from lousho.stores.redis_checkpoints import LeaseLostError, RedisCheckpointStore
from lousho.stores.redis_common import RedisKeys, connect, describe
from lousho.stores.redis_prune import prune_sessions
from lousho.stores.redis_replication import ReplicaAck
from lousho.stores.redis_sentinel import connect_sentinel, is_sentinel_url
from lousho.stores.redis_slots import CLUSTER_SCHEME, RedisCluster, connect_cluster, is_cluster, keep_slot_map_sound

__all__ = ["LeaseLostError", "RedisApprovalStore", "RedisCheckpointStore", "RedisKeys", "RedisStore", "open_url"]


class RedisStore(SessionsOfCheckpoints):
    """A store bundle (`lousho.StoreBundle`) on one Redis: `.checkpoints`, `.approvals`, `sessions()`,
    `prune()`, `delete()`, and the `.client` they share.

    - `prefix`: every key starts with it (default `lousho:`); sessions are hash-tagged under it.
    - `history_limit`: saves kept per session in the history ring (0 keeps none).
    - `ttl_s`: when set, every key of a session (and each approval) expires that long after its
      last save; each save refreshes it. None keeps them until deleted.
    - `inflight_deadline_ms`: how long an 'in-progress' session may go without a save before the
      reaper may requeue it (0 turns the in-flight index off). A fleet's `create_app` and `Client`
      work on `with_inflight_deadline(lease_ttl_ms)` of the store they are given.
    - `cache_size`: sessions whose last saved transcript this process remembers (to send only
      new messages); a cold or wrong cache only costs a save that sends the whole transcript.
    - `codec`: compresses and encrypts messages, heads' secret fields, history and approvals
      (`lousho.stores.codec.PayloadCodec`, issue #17); off by default.
    - `min_replicas_acked`, `replica_ack_timeout_ms`: each save (and each approval's write) returns only once
      `WAIT` says that many replicas have it, else raises `SaveNotReplicatedError` (issue #18,
      `lousho.stores.redis_replication`); 0 (the default) does not wait. On a Redis Cluster, the replicas of
      the primary that serves the session's slot.

    A URL may name a Redis Sentinel master: `redis+sentinel://host:26379[,host:26379]/<master>[/<db>]`
    (`lousho.stores.redis_sentinel`), or a Redis Cluster: `redis+cluster://host:port[,host:port]`.
    """

    checkpoints: RedisCheckpointStore
    approvals: RedisApprovalStore

    def __init__(
        self,
        url_or_client: str | redis.Redis | RedisCluster,
        *,
        prefix: str = "lousho:",
        history_limit: int = 50,
        ttl_s: float | None = None,
        inflight_deadline_ms: int = 120_000,
        cache_size: int = 1024,
        codec: PayloadCodec = PLAIN,
        min_replicas_acked: int = 0,
        replica_ack_timeout_ms: int = 1000,
        **client_options: Any,
    ) -> None:
        if history_limit < 0:
            raise ConfigurationError(f"history_limit must be 0 or more, not {history_limit}")
        if ttl_s is not None and ttl_s <= 0:
            raise ConfigurationError(f"ttl_s must be positive (or None for no expiry), not {ttl_s}")
        if isinstance(url_or_client, str) and url_or_client.startswith(CLUSTER_SCHEME):
            self.client = connect_cluster(url_or_client, **client_options)  # issue #18
        elif isinstance(url_or_client, str) and is_sentinel_url(url_or_client):
            self.client = connect_sentinel(url_or_client, **client_options)  # issue #18
        elif isinstance(url_or_client, str):
            self.client = connect(url_or_client, **client_options)
        elif isinstance(url_or_client, (redis.Redis, RedisCluster)):
            if client_options:
                raise ConfigurationError("client options apply to a URL; configure the client you pass instead")
            self.client = cast(redis.Redis, url_or_client)  # a RedisCluster serves the same commands here
        else:
            raise ConfigurationError(
                f"RedisStore takes a Redis URL or a redis.Redis client, not {type(url_or_client).__name__}"
            )
        # On a Redis Cluster the fleet's indexes are sharded by slot (lousho.stores.redis_slots, issue #18)
        if codec.active and _decodes_responses(self.client):
            raise ConfigurationError(
                "a RedisStore with a payload codec needs a client that returns bytes: encoded values are binary; "
                "pass a redis.Redis made without decode_responses=True (issue #17)"
            )
        codec = codec.for_store(f"redis:{prefix}")  # issue #31: values are bound to the store's prefix
        self.keys = RedisKeys(prefix, per_slot=is_cluster(self.client))
        if self.keys.per_slot:
            keep_slot_map_sound(self.client)
        replica_ack = ReplicaAck(min_replicas=min_replicas_acked, timeout_ms=replica_ack_timeout_ms)
        self.prefix = prefix
        self.history_limit = history_limit
        self.ttl_s = ttl_s
        ttl_ms = 0 if ttl_s is None else max(1, round(ttl_s * 1000))
        self.checkpoints = RedisCheckpointStore(
            self.client,
            self.keys,
            history_limit=history_limit,
            ttl_ms=ttl_ms,
            inflight_deadline_ms=inflight_deadline_ms,
            cache_size=cache_size,
            codec=codec,
            replica_ack=replica_ack,
        )
        self.codec = codec
        self.approvals = RedisApprovalStore(self.client, self.keys, ttl_ms=ttl_ms, codec=codec, replica_ack=replica_ack)

    def with_inflight_deadline(self, deadline_ms: int) -> RedisStore:
        """This store (its client, keys, approvals and cache) whose saves give an 'in-progress' session
        `deadline_ms` in the in-flight index: how the fleet gives it its lease's time without setting
        anything on a store others hold (issue #14)."""
        if deadline_ms == self.checkpoints.inflight_deadline_ms:
            return self
        view = copy.copy(self)
        cps = self.checkpoints
        view.checkpoints = RedisCheckpointStore(
            self.client,
            self.keys,
            history_limit=cps.history_limit,
            ttl_ms=cps.ttl_ms,
            inflight_deadline_ms=deadline_ms,
            reader=cps.reader,
            codec=cps.codec,
            replica_ack=cps.replica_ack,
        )
        return view

    @property
    def replica_ack(self) -> ReplicaAck:
        """How many replicas confirm each save (`WAIT`; 0: none is waited for), issue #18."""
        return self.checkpoints.replica_ack

    def with_replica_ack(self, min_replicas: int, timeout_ms: int) -> RedisStore:
        """This store (its client, keys, approvals and cache) whose saves wait for `min_replicas` replicas
        (`FleetSettings.min_replicas_acked` gives a fleet's store its setting this way, issue #18)."""
        wanted = ReplicaAck(min_replicas=min_replicas, timeout_ms=timeout_ms)
        if wanted == self.replica_ack:
            return self
        view = copy.copy(self)
        view.checkpoints = copy.copy(self.checkpoints)
        view.checkpoints.replica_ack = wanted
        view.approvals = copy.copy(self.approvals)
        view.approvals.replica_ack = wanted
        return view

    def prune(self, older_than: datetime | timedelta) -> Pruned:
        """Remove finished checkpoints saved before the cutoff (and their fleet keys), history entries saved
        before it, and the messages of sessions left with neither (`lousho.stores.redis_prune`)."""
        return prune_sessions(self.client, self.keys, older_than)

    @classmethod
    def from_env(cls, variable: str = "REDIS_URL", **options: Any) -> RedisStore:
        """A store for the URL in `$REDIS_URL` (or `variable`); a missing variable is a clear error."""
        url = os.environ.get(variable)
        if not url:
            raise ConfigurationError(f"${variable} is not set; set it to a Redis URL such as redis://localhost:6379/0")
        return cls(url, **options)

    def close(self) -> None:
        """Close the client's connections (only needed for a store that made its own client)."""
        self.client.close()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisStore({describe(self.client)}, prefix={self.prefix!r}, history_limit={self.history_limit})"


def _decodes_responses(client: Any) -> bool:
    """Whether the client turns replies into str (it would fail on a binary value)."""
    kwargs = getattr(client, "get_connection_kwargs", None)
    return bool(callable(kwargs) and kwargs().get("decode_responses"))


def open_url(url: str, *, prefix: str = "lousho:", codec: PayloadCodec = PLAIN) -> RedisStore:
    """`redis://`, `rediss://`, `unix://`, `redis+cluster://` or `redis+sentinel://` (the store registry's opener)."""
    return RedisStore(url, prefix=prefix, codec=codec)
