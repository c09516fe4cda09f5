"""Redis Cluster for the store (issue #18): connecting to a cluster, and the slot tags of the index shards.

In a cluster a Lua script or a MULTI may only touch keys of one slot. A session's keys share its id as
their hash tag (`<prefix>{<session>}:cp`), so they share a slot; the fleet's indexes (in-flight
deadlines, running tool calls, parked sessions, pending approvals) are written by the same scripts as
the session's keys, atomically. So in the cluster layout (`RedisKeys(per_slot=True)`) each index is
sharded by slot: the shard that holds a session's entry is `<prefix>{<tag>}:<index>` where `<tag>` is a
short string that hashes to the session's own slot (`slot_tag`). Every script keeps touching one slot
and stays as atomic as on one Redis; a reader of a whole index (the reaper, listings, metrics) reads
every shard (`shard_tags`: 16,384 at most, only those that exist hold anything).

The fleet-wide keys no script touches with a session's keys (the workers' presence, the event counters,
the reaper's pass lock) are sharded too, coarser: by slot group (`GROUPS` groups of consecutive slots,
`group_tag`), so that no single key, and no single node, carries the whole fleet (issue #18: "nothing
global"), while a reader of one (`Client.enqueue` reading the presence) reads 16 keys, not 16,384.

Why not N fixed shards written outside the scripts: the reaper relies on a save of an 'in-progress'
checkpoint and its deadline being one write (a session is never saved without a deadline), and the
poison count and parked mark on the scripts' reads; splitting them would need new recovery rules.
"""

from __future__ import annotations

import binascii
import contextlib
from collections.abc import Callable
from functools import cache
from typing import Any, cast

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import AskError

from lousho.errors import ConfigurationError
from lousho.redaction import redact_url

__all__ = [
    "CLUSTER_SCHEME",
    "GROUPS",
    "SLOTS",
    "RedisCluster",
    "connect_cluster",
    "group_slots",
    "group_tag",
    "group_tags",
    "is_cluster",
    "keep_slot_map_sound",
    "on_shards",
    "key_slot",
    "shard_tags",
    "slot_group",
    "slot_tag",
]

SLOTS = 16384
CLUSTER_SCHEME = "redis+cluster://"


def key_slot(key: str) -> int:
    """The cluster slot of a key (its hash tag's, when it has one), as Redis computes it."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key.encode(), 0) % SLOTS


@cache
def _tags() -> tuple[str, ...]:
    """For each slot, the first of 'ix0', 'ix1', ... that hashes to it (computed once per process)."""
    tags: list[str | None] = [None] * SLOTS
    missing, n = SLOTS, 0
    while missing:
        tag = f"ix{n}"
        slot = binascii.crc_hqx(tag.encode(), 0) % SLOTS
        if tags[slot] is None:
            tags[slot], missing = tag, missing - 1
        n += 1
    return tuple(cast(list[str], tags))


def slot_tag(slot: int) -> str:
    """The index shards' hash tag for `slot` ('ix<n>')."""
    return _tags()[slot]


def shard_tags() -> tuple[str, ...]:
    """Every index shard tag, one per slot."""
    return _tags()


GROUPS = 16
"""Slot groups of the fleet-wide keys on a Cluster: group g holds slots [g * 1024, (g + 1) * 1024)."""


def slot_group(slot: int) -> int:
    """The group of a slot."""
    return slot * GROUPS // SLOTS


def group_slots(group: int) -> range:
    """The slots of a group."""
    return range(group * SLOTS // GROUPS, (group + 1) * SLOTS // GROUPS)


def group_tag(group: int) -> str:
    """A group's hash tag: the shard tag of its first slot, so a group's key lives in one of its own slots."""
    return slot_tag(group_slots(group)[0])


def group_tags() -> tuple[str, ...]:
    """Every group's tag, in group order."""
    return tuple(group_tag(group) for group in range(GROUPS))


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def on_shards(client: Any, shards: list[str], queue: Callable[[Any, str], object]) -> list[Any]:
    """`queue(pipe, shard)` for each shard, pipelined; the replies in the order of `shards`. On a Cluster one plain
    pipeline per primary, for the shards of its slots: redis-py's cluster pipeline costs about five times as much
    per command, which a reaper pass reading 16,384 shards would feel (issue #18). A slot that moved meanwhile (a
    failover, a reshard) fails that pipeline: then the cluster pipeline, which follows the redirections, reads all."""
    if is_cluster(client):
        with contextlib.suppress(redis.RedisError):
            return _on_shards_per_node(client, shards, queue)
    pipe = client.pipeline(transaction=False)
    for shard in shards:
        queue(pipe, shard)
    return cast(list[Any], pipe.execute())


def _on_shards_per_node(client: Any, shards: list[str], queue: Callable[[Any, str], object]) -> list[Any]:
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for index, shard in enumerate(shards):
        node = client.nodes_manager.get_node_from_slot(key_slot(shard))
        by_node.setdefault(node.name, (node, []))[1].append(index)
    replies: list[Any] = [None] * len(shards)
    for node, indexes in by_node.values():
        pipe = client.get_redis_connection(node).pipeline(transaction=False)
        for index in indexes:
            queue(pipe, shards[index])
        for index, reply in zip(indexes, pipe.execute(), strict=True):
            replies[index] = reply
    return replies


def keep_slot_map_sound(client: Any) -> None:
    """Work around redis-py 6.4's issue #3815: a MULTI (`pipeline(transaction=True)`) that meets a connection
    error during a failover hands that error to the client's slot map as if it were a MOVED reply, and every
    later command of the process then fails with `AttributeError: 'ConnectionError' object has no attribute
    'host'`. Only a redirection (MOVED, ASK) may move a slot; any other error leaves the map as it is, and the
    next command that meets the dead node refreshes the map as usual."""
    manager = client.nodes_manager
    if getattr(manager.update_moved_exception, "__name__", "") == "update_on_redirection_only":
        return  # guarded already (a client shared by two stores)
    update = manager.update_moved_exception

    def update_on_redirection_only(exception: BaseException) -> None:
        if isinstance(exception, AskError):  # MovedError is an AskError: both carry the new host and port
            update(exception)

    manager.update_moved_exception = update_on_redirection_only


def connect_cluster(url: str, **options: Any) -> redis.Redis:
    """A cluster client for `redis+cluster://host:port[,host:port...]`: any reachable node is enough to find
    the rest. Typed as `redis.Redis`: the store uses only commands both serve alike."""
    rest = url[len(CLUSTER_SCHEME) :]
    auth, _, hosts = rest.rpartition("@")
    nodes = []
    for address in hosts.split("/")[0].split(","):
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(
                f"not a Redis Cluster URL: {redact_url(url)!r} (expected redis+cluster://host:port[,host:port...])"
            )
        nodes.append(ClusterNode(host, int(port)))  # type: ignore[no-untyped-call]
    if auth:
        user, _, password = auth.rpartition(":")
        options.setdefault("password", password)
        if user:
            options.setdefault("username", user)
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 30.0)
    return cast(redis.Redis, RedisCluster(startup_nodes=nodes, **options))
