"""Which agents the fleet serves, on which queues: the workers' presence, read by the `Client` and the reaper
(issue #15).

A job whose agent no live worker serves used to be taken by whatever worker consumed its queue, which
parked it (`LOUSHO_UNKNOWN_AGENT`) with the reason only in that worker's log; or it waited forever on a
queue nobody consumed. Now each worker publishes what it serves, with a heartbeat, in one Redis hash per
key prefix, `<prefix>workers`: field `<host>|<pid>` -> JSON `{"queues": [...], "agents": [...],
"expires_ms": <Redis server ms>, "version": "<lousho's>", "message_protocols": [<oldest>, <newest>],
"formats": {<format>: <version>}}` (the last three since 0.2, issue #35: `lousho.fleet.protocol.speaks`). On a Redis Cluster that hash is sharded by slot group, each worker's
entry in the shard of its id's group (`RedisKeys.fleet_wide_of`, issue #18): readers read the 16 shards. A worker writes it when it is ready, again every `heartbeat_s`, and
deletes it when it shuts down; an entry whose `expires_ms` passed (a SIGKILLed worker: `lease_ttl_s`
after its last beat) is not live. The publishing is the worker's (`lousho.worker.registry`); the layout,
the reading and the routing are here, where the `Client` and the reaper share them.

Routing (`ServedAgents.route`): a step goes to the configured queue when one is named (`FleetSettings.queue`);
with none named, to a queue on which a live worker serves the session's agent, else nowhere yet: the
session waits in the in-flight index, and the reaper sends it once a worker that serves its agent is live.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from lousho.errors import SDKError
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors, text
from lousho.stores.redis_slots import is_cluster, on_shards

__all__ = ["LiveWorker", "ServedAgents", "WorkerRegistry", "agent_of", "app_queue"]


def app_queue(prefix: str, agent_names: Iterable[str]) -> str:
    """The queue of an app that names none (`FleetSettings.queue=None`): `<prefix>queue:<agent>[+<agent>...]`
    (`lousho:queue:booker`), its agents' names sorted (a hash of them when that is long). Apps serving other
    agents, or under another prefix, get other queues, so two apps on one Redis never take each other's
    jobs; replicas of one app share theirs (issue #15)."""
    names = sorted(set(agent_names))
    joined = "+".join(names)
    if len(joined) > 100:
        joined = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    return f"{prefix}queue:{joined}"


def agent_of(store: RedisStore, session_id: str) -> str | None:
    """The agent a session's checkpoint names; None when there is none or it cannot be read (a worker that
    takes the session says why)."""
    try:
        checkpoint = store.checkpoints.load(session_id)
    except SDKError:
        return None
    return checkpoint.agent_name if checkpoint is not None else None


@dataclass(frozen=True)
class LiveWorker:
    """One worker process whose presence has not expired."""

    id: str
    """`<host>|<pid>`."""
    queues: tuple[str, ...]
    """The queues it consumes."""
    agents: tuple[str, ...]
    """The agents it serves (its sub-agents included)."""
    name: str | None = None
    """Its Celery node name (`lousho worker`'s default: `<queue or app>-<pid>@<host>`; issue #32)."""
    version: str | None = None
    """The lousho it runs; None for a worker of 0.1.0, which did not say (issue #35)."""
    message_protocols: tuple[int, int] = (1, 1)
    """The oldest and newest step-message protocol it runs (0.1.0's: 1 only)."""
    formats: tuple[tuple[str, int], ...] | None = None
    """The version of each format it writes, by name (`lousho.formats.written_formats`); None for 0.1.0's."""

    def speaks(self) -> str:
        """Its version and protocols in one line, for the dashboard and `lousho workers`."""
        oldest, newest = self.message_protocols
        protocols = str(newest) if oldest == newest else f"{oldest}-{newest}"
        return f"{self.version or '0.1.0 (unstated)'}; messages {protocols}" + (
            "; " + ", ".join(f"{name} {number}" for name, number in self.formats) if self.formats else ""
        )


@dataclass(frozen=True)
class ServedAgents:
    """What the live workers serve, as read at one moment."""

    workers: tuple[LiveWorker, ...]

    def by_queue(self) -> dict[str, list[str]]:
        """Queue -> the agents served on it, both sorted."""
        served: dict[str, set[str]] = {}
        for worker in self.workers:
            for queue in worker.queues:
                served.setdefault(queue, set()).update(worker.agents)
        return {queue: sorted(served[queue]) for queue in sorted(served)}

    def queues_serving(self, agent: str) -> list[str]:
        """The queues on which a live worker serves `agent`: the one with the most such workers first."""
        count: dict[str, int] = {}
        for worker in self.workers:
            if agent in worker.agents:
                for queue in worker.queues:
                    count[queue] = count.get(queue, 0) + 1
        return sorted(count, key=lambda queue: (-count[queue], queue))

    def serves(self, agent: str, queue: str | None = None) -> bool:
        """Whether a live worker serves `agent` (on `queue`, when given)."""
        queues = self.queues_serving(agent)
        return bool(queues) if queue is None else queue in queues

    def route(self, agent: str | None, queue: str | None) -> str | None:
        """Where a step of a session of `agent` goes: the configured `queue` when one is named (whoever
        serves what), else the queue on which the most live workers serve the agent; None: nowhere yet."""
        if queue is not None:
            return queue
        serving = self.queues_serving(agent) if agent else []
        return serving[0] if serving else None

    def describe(self) -> str:
        """What is served, for an error message: `'booker' on 'lousho.booker'; ...`, or that nothing is."""
        served = self.by_queue()
        if not served:
            return "none: no worker of this prefix is live"
        return "; ".join(f"{', '.join(map(repr, agents))} on {queue!r}" for queue, agents in served.items())


@dataclass(frozen=True)
class WorkerRegistry:
    """The workers' presence under one store's prefix (`<prefix>workers`; a shard per slot group on a Cluster)."""

    store: RedisStore

    def key_of(self, worker_id: str) -> str:
        """The hash that holds `worker_id`'s entry."""
        return self.store.keys.fleet_wide_of("workers", worker_id)

    @property
    def shards(self) -> list[str]:
        """Every hash of the registry: one on one Redis, one per slot group on a Cluster."""
        return self.store.keys.fleet_wide_shards("workers")

    def server_time_ms(self) -> int:
        with redis_errors(self.store.client, "read the Redis server's time"):
            seconds, micros = cast(tuple[int, int], self.store.client.time())
        return int(seconds) * 1000 + int(micros) // 1000

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every entry, live or expired (an unreadable one is left out)."""
        with redis_errors(self.store.client, "read the fleet's workers"):
            shards = on_shards(self.store.client, self.shards, lambda pipe, shard: pipe.hgetall(shard))
        return _entries(shards)

    def _time_and_entries(self) -> tuple[int, dict[str, dict[str, Any]]]:
        """`server_time_ms()` and `entries()`; on one Redis in one round trip (issue #30: `Client.enqueue` asks
        for both), on a Cluster as two (the shards are spread over its nodes)."""
        client = self.store.client
        if is_cluster(client):
            return self.server_time_ms(), self.entries()
        with redis_errors(client, "read the fleet's workers and the Redis server's time"):
            pipe = client.pipeline(transaction=False)
            pipe.time()
            for shard in self.shards:
                pipe.hgetall(shard)
            (seconds, micros), *shards = pipe.execute()
        return int(seconds) * 1000 + int(micros) // 1000, _entries(shards)

    def live(self) -> ServedAgents:
        """The workers whose presence has not expired (by Redis server time)."""
        now_ms, entries = self._time_and_entries()
        workers = []
        for worker_id, entry in sorted(entries.items()):
            expires, queues, agents = entry.get("expires_ms"), entry.get("queues"), entry.get("agents")
            if isinstance(expires, int) and expires > now_ms and isinstance(queues, list) and isinstance(agents, list):
                workers.append(_live_worker(worker_id, entry, queues, agents))
        return ServedAgents(tuple(workers))


def _entries(shards: list[Any]) -> dict[str, dict[str, Any]]:
    """The registry's entries in the HGETALL replies of its shards (an unreadable one left out)."""
    raw = {
        field: value for shard in cast(list[dict[bytes | str, bytes | str]], shards) for field, value in shard.items()
    }
    entries = {}
    for field, value in raw.items():
        try:
            entry = json.loads(value)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries[text(field)] = entry
    return entries


def _live_worker(worker_id: str, entry: dict[str, Any], queues: list[Any], agents: list[Any]) -> LiveWorker:
    """A live entry, what it says of its node name (issue #32), version and formats (issue #35) taken only where
    it has the right shape."""
    version, protocols, formats = entry.get("version"), entry.get("message_protocols"), entry.get("formats")
    name = entry.get("name")
    spoken = (
        (protocols[0], protocols[1])
        if isinstance(protocols, list) and len(protocols) == 2 and all(isinstance(p, int) for p in protocols)
        else (1, 1)
    )
    return LiveWorker(
        worker_id,
        tuple(map(str, queues)),
        tuple(map(str, agents)),
        name=name if isinstance(name, str) else None,
        version=version if isinstance(version, str) else None,
        message_protocols=spoken,
        formats=tuple((str(k), v) for k, v in formats.items() if isinstance(v, int))
        if isinstance(formats, dict)
        else None,
    )
