"""Fast death detection (issue #20): a worker process that is gone is learned from Redis itself.

Each worker process names its Redis connections `lousho|<host>|<pid>` (`CLIENT SETNAME`, set by redis-py
on every connection it opens). A SIGKILLed process, one the OOM killer took, or one on a machine whose
connections were reset leaves no connection behind: the Redis server closes them at once. The reaper
(`DeathWatch.sweep`, every `FleetSettings.death_check_interval_s`) lists the named connections and, for
each tool call in the fleet's running index whose process was seen connected before and is not now,
frees that call's lease, and its session's lease if the process died holding it too (each only if that
process still holds it), and requeues its session at once, instead of after the lease's TTL plus a reaper pass.
A process that died in a model turn is not in the running index: once a process is gone, the in-flight
index is read and each session lease it held is freed too, and that session requeued (`dead_turns`).

A process that is alive keeps its connections, even when it is stopped (SIGSTOP), stalled in a long
garbage collection or blocked in a tool: it is never taken over this way; its lease and the epoch
fencing treat it as before (a TTL, then a takeover, and a zombie's save refused). A process is judged
only after it was seen connected, or (on one Redis) once its entry in the running index was written under
this server run: a worker SIGKILLed within a sweep interval of its start is caught too. What was seen is
forgotten when the Redis server restarts (its `run_id` changes), and what the index held then is left
alone, so a restart is never taken for a death: for those entries, the lease TTL stays the rule. The entry
rule counts on every process that writes the index naming its connections: a Celery worker as it starts,
any other process before its first task (`lousho.worker.running.name_connections`).

On a Redis Cluster each node lists only its own connections: a process is live while it has a connection
open on any primary, the run id is every primary's (a failover's new primary makes it new, so nothing seen
before counts), and the running index is read over its shards (issue #18).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from lousho.fleet.inflight import InflightIndex
from lousho.fleet.keys import FleetKeys
from lousho.stores.redis_common import load_script, redis_errors, text
from lousho.stores.redis_slots import is_cluster, on_shards

__all__ = ["HOST", "DeadCall", "DeathWatch", "connection_name", "lease_token_prefix", "live_processes", "this_process"]

NAME_PREFIX = "lousho|"

EVER_MS = 2**62
"""A deadline past every in-flight session's: `due` before it lists them all."""

HOST = socket.gethostname().replace("|", "_")


def this_process() -> str:
    """`<host>|<pid>`: how the running index, connection names and lease tokens name this process."""
    return f"{HOST}|{os.getpid()}"


def lease_token_prefix(process: str) -> str:
    """How every lease token `process` (`<host>|<pid>`) takes starts. The host is in it so that the sweep, which
    frees a dead process's leases by this prefix, never frees one that a live process with the same pid on
    another machine took since."""
    return f"{process}-"


def connection_name(host: str, pid: int) -> str:
    """The name a worker process gives its Redis connections (no spaces: CLIENT SETNAME refuses them)."""
    return f"{NAME_PREFIX}{host.replace(' ', '_')}|{pid}"


def live_processes(client: redis.Redis) -> tuple[str, set[str]]:
    """The Redis server's run id (on a Cluster, every primary's), and `<host>|<pid>` of every worker process
    with a connection open now (on a Cluster, to any primary)."""
    servers = [client]
    if is_cluster(client):
        cluster = cast(Any, client)
        servers = [cluster.get_redis_connection(node) for node in cluster.get_primaries()]
    run_ids, names = [], set()
    with redis_errors(client, "list the worker processes connected to Redis"):
        for server in servers:
            run_ids.append(str(cast(dict[str, Any], server.info("server"))["run_id"]))
            names |= {str(c.get("name") or "") for c in cast(list[dict[str, Any]], server.client_list(_type="normal"))}
    return ",".join(sorted(run_ids)), {name.removeprefix(NAME_PREFIX) for name in names if name.startswith(NAME_PREFIX)}


@dataclass(frozen=True)
class DeadCall:
    """A tool call whose process is gone: its entry in the running index, '<host>|<pid>|<session>|<field>'."""

    entry: str

    @property
    def process(self) -> str:
        return "|".join(self.entry.split("|", 2)[:2])

    @property
    def session_id(self) -> str:
        return self.entry.split("|", 3)[2]

    @property
    def call_id(self) -> str:
        return self.entry.split("|", 3)[3].split(":", 1)[1]


@dataclass
class DeathWatch:
    """What the reaper remembers between sweeps: the processes seen connected, under which server run."""

    keys: FleetKeys
    run_id: str | None = None
    seen: set[str] = field(default_factory=set)
    handled: set[str] = field(default_factory=set)
    """Entries already freed: a dead run's entry stays in the index a while (lua/call_begin.lua)."""
    mourned: set[str] = field(default_factory=set)
    """Processes whose session leases were already looked for (`dead_turns`), while they are still judged."""
    baseline: dict[str, float] = field(default_factory=dict)
    """On one Redis, the running index (entry: score) as the first sweep under this server run read it. An entry
    not in it as it was there was written (begun or beaten) under this run, by a process connected then: that
    process is judged though no sweep saw it, as a worker SIGKILLed within a sweep interval of its start is."""

    def dead_calls(self) -> list[DeadCall]:
        """The running calls whose process was seen connected and has no connection now."""
        return self._judge()[0]

    def _judge(self) -> tuple[list[DeadCall], set[str]]:
        """The dead calls, and the processes found gone that were not mourned yet."""
        client = self.keys.store.client
        # On one Redis the index is read before the processes are listed, so each entry read was written before
        # the listing: a process it names that is not listed had a connection and has none now. A Cluster's
        # 16,384 shards are read only when a process seen before is gone (issue #18).
        index = None if is_cluster(client) else self._running_index()
        run_id, live = live_processes(client)
        if run_id != self.run_id:  # a restarted server: every connection is new, nothing seen counts
            self.run_id, self.seen, self.handled, self.mourned = run_id, set(), set(), set()
            self.baseline, index = index or {}, None  # what the index held then is left to the leases
        gone = (self.seen - live) | self._unseen_writers(index or {}, live)
        if not gone:  # no process gone: on a Cluster the running index need not be read
            self.seen, self.mourned = live, set()
            return [], set()
        calls = [DeadCall(e) for e in (index if index is not None else self._running_index()) if e.count("|") >= 3]
        self.seen = live | {c.process for c in calls if c.process in gone}  # the dead, while they have entries
        self.handled &= {c.entry for c in calls}
        new, self.mourned = gone - self.mourned, self.mourned & self.seen
        return [c for c in calls if c.process in gone and c.entry not in self.handled], new

    def _running_index(self) -> dict[str, float]:
        """Every entry of the fleet's running index, over its shards, with its score (its last beat)."""
        client = self.keys.store.client
        with redis_errors(client, "read the fleet's running index"):
            shards = on_shards(
                client, self.keys.shards("running"), lambda pipe, shard: pipe.zrange(shard, 0, -1, withscores=True)
            )
        return {text(e): float(score) for shard in cast(list[list[tuple[bytes, float]]], shards) for e, score in shard}

    def _unseen_writers(self, index: dict[str, float], live: set[str]) -> set[str]:
        """The processes not connected now whose entry in `index` was written under this server run."""
        changed = (e for e, score in index.items() if e.count("|") >= 3 and self.baseline.get(e) != score)
        return {DeadCall(e).process for e in changed} - live

    def dead_turns(self, processes: set[str]) -> list[tuple[str, str]]:
        """(session, process) of each in-flight session whose session lease one of `processes` holds: it died in a
        model turn, or while it folded or committed a step (the in-flight index is read only when one is gone)."""
        if not processes:
            return []
        client = self.keys.store.client
        sessions = [s for s, _ in InflightIndex.of(self.keys.store, 0).due(due_before_ms=EVER_MS)]
        with redis_errors(client, "read the leases of the in-flight sessions"):
            holders = on_shards(client, [self.keys.lease(s) for s in sessions], lambda pipe, key: pipe.get(key))
        by_prefix = {lease_token_prefix(p): p for p in processes}
        held = [(s, text(h)) for s, h in zip(sessions, holders, strict=True) if h is not None]
        return [(s, p) for s, h in held for prefix, p in by_prefix.items() if h.startswith(prefix)]

    def sweep(self, requeue: Callable[[str], bool]) -> list[str]:
        """Free each dead call's lease and each dead model turn's session lease, and `requeue` their sessions
        now; the sessions requeued."""
        calls, gone = self._judge()
        requeued: list[str] = []
        for call in calls:
            # and the session's lease, if it died while it held that too (committing the call, folding it):
            # else the requeue below is refused until that lease's TTL
            leases = [self.keys.call_lease(call.session_id, call.call_id), self.keys.lease(call.session_id)]
            self._free(leases, call.process, f"call {call.call_id!r} of {call.session_id!r}")
            self.handled.add(call.entry)
            if call.session_id not in requeued and requeue(call.session_id):
                requeued.append(call.session_id)
        for session_id, process in self.dead_turns(gone):  # a model turn holds only its session's lease
            self._free([self.keys.lease(session_id)], process, f"session {session_id!r}")
            if session_id not in requeued and requeue(session_id):
                requeued.append(session_id)
        self.mourned |= gone
        return requeued

    def _free(self, leases: list[str], process: str, what: str) -> None:
        """Delete each of `leases` that `process` still holds (lua/free_dead_lease.lua)."""
        client = self.keys.store.client
        with redis_errors(client, f"free the leases of {what}"):
            free = load_script(client, "lousho.fleet:free_dead_lease")
            for lease in leases:
                free(keys=[lease], args=[lease_token_prefix(process)])
