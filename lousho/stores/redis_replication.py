"""Replica acknowledgement: a write returns only once `WAIT` says enough replicas have it (issue #18).

Redis replicates asynchronously: a primary acknowledges a save before its replicas have it, and a
failover in between loses that save although the caller was told it stood. With `min_replicas_acked=N`
each save script (and each fleet script that commits a tool result) is followed by `WAIT N timeout` on
the same connection, in one pipeline (one round trip; `WAIT` cannot run inside Lua). When fewer than N
replicas confirm within the timeout, `SaveNotReplicatedError` is raised: the primary has the write, it
may not survive a failover, and the caller must not count it as done (a fleet step then ends as if the
store were down: the reaper sends the session again, and the step finds whichever save survived).

On a Redis Cluster the pipeline goes to the primary that serves the keys' slot (every key of a script is in
one), so `WAIT` counts that primary's replicas; a slot that moved meanwhile fails the call (MOVED), which
the caller treats as an outage, as it does any failover's error.

`WAIT` makes a write durable across a failover only if the promoted replica is one that confirmed it:
Sentinel promotes the replica with the most replicated data, so with one replica (or N = all replicas)
it is. It does not make Redis strongly consistent (a partitioned primary may still accept writes that
are then dropped); docs/topologies.md says what it costs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.commands.core import Script

from lousho.errors import ConfigurationError, SaveNotReplicatedError
from lousho.stores.redis_common import describe
from lousho.stores.redis_slots import is_cluster, key_slot

__all__ = ["NO_REPLICA_ACK", "ReplicaAck"]


@dataclass(frozen=True, kw_only=True)
class ReplicaAck:
    """How many replicas must confirm each write, and how long to wait for them (0 replicas: off)."""

    min_replicas: int = 0
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ConfigurationError(f"min_replicas_acked must be 0 (off) or more, not {self.min_replicas}")
        if self.timeout_ms <= 0:
            raise ConfigurationError(
                f"replica_ack_timeout_ms must be positive, not {self.timeout_ms} (WAIT 0 would block forever)"
            )

    @property
    def on(self) -> bool:
        return self.min_replicas > 0

    def run(
        self,
        client: redis.Redis,
        script: Script,
        keys: Sequence[Any],
        args: Sequence[Any],
        before: Callable[[Any], int] | None = None,
    ) -> tuple[Any, int]:
        """Run `script`, then (when on) `WAIT` on the same connection: its reply and the replicas that
        confirmed (-1 when off). The caller decides with `check` whether its reply wrote anything.
        `before`: queues commands of the caller's ahead of the script, in its round trip (returns how many; their
        replies and errors are dropped: issue #34's events riding with a save)."""
        if not self.on and before is None:
            return script(keys=keys, args=args), -1
        if is_cluster(client):  # the pipeline on the connection of the keys' primary: WAIT asks that node's replicas
            cluster = cast(Any, client)
            client = cluster.get_redis_connection(cluster.nodes_manager.get_node_from_slot(key_slot(str(keys[0]))))
        pipe = client.pipeline(transaction=False)
        first = before(pipe) if before is not None else 0
        # EVALSHA queued as a plain command: a Script on a pipeline costs a SCRIPT EXISTS round trip per execute
        cast(Any, pipe).execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        if self.on:
            pipe.wait(self.min_replicas, self.timeout_ms)
        replies = pipe.execute(raise_on_error=False)[first:]
        if isinstance(replies[0], redis.exceptions.NoScriptError):  # Redis restarted or flushed its scripts: load
            client.script_load(script.script)  # it and run it again (what `before` queued is done already)
            return self.run(client, script, keys, args)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies[0], (int(replies[1]) if self.on else -1)

    def check(self, client: redis.Redis, acked: int, what: str) -> None:
        """Raise `SaveNotReplicatedError` when `acked` (from `run`) is short of `min_replicas`."""
        if self.on and acked < self.min_replicas:
            raise SaveNotReplicatedError(
                f"{what} was applied on the primary ({describe(client)}) but {acked} of the {self.min_replicas} "
                f"replicas required confirmed it within {self.timeout_ms} ms: a failover now may lose it, so it "
                "does not count as done. Load the session to see whether it stands; check the replicas "
                "(INFO replication) or lower min_replicas_acked"
            )


NO_REPLICA_ACK = ReplicaAck()
