"""The tool calls a worker process runs: their entries in the fleet's running index, and a
worker's own shutdown, which is not its tool call's fault (issue #21).

Every run of a tool call is listed in the fleet's running index (`FleetKeys.running`, scored by its
last beat) until its result is committed: a call started again after its run died finds there whether
other sessions' runs on the same host died with it (lua/call_begin.lua), and such a start is not counted
against the call.

A tool call's starts are counted so that a call that kills its worker every time becomes poison
(an error result) after `max_attempts` starts. A worker that is shut down from outside (a deploy's
SIGTERM, Ctrl-C, `celery control shutdown`) while it runs a call says so as it goes: the start of
each call it is running is taken back, so a call cut short by deploys is never made poison; except the
start of a call whose tool is not `on_interrupted="rerun"`: it may have had its effect, so its start stays
counted and its next start meets the tool's policy (issue #17). A SIGKILL gives no warning: a worker that dies without one while it runs a call is counted against
that call (docs/reliability.md: 'Poison').
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any, cast

import redis
from celery import signals

from lousho.errors import SDKError
from lousho.fleet.keys import FleetKeys
from lousho.fleet.liveness import HOST, connection_name, this_process
from lousho.stores.redis_common import load_script, redis_errors
from lousho.stores.redis_slots import is_cluster

__all__ = ["HOST", "RunningCall", "name_connections", "running_calls", "watch_processes", "watch_shutdown"]

log = logging.getLogger("lousho.worker")


@dataclass(eq=False)
class RunningCall:
    """A tool call this process runs (its start is counted in the session's attempts once it began)."""

    keys: FleetKeys
    session_id: str
    field: str
    """The call's `result_field`."""
    epoch: str = ""
    """The session's incarnation, once the call began (lua/lib/epoch.lua)."""
    keeps_start: bool = False
    """A shutdown leaves its start counted: its tool's `on_interrupted` is 'ask' or 'fail' (issue #17)."""

    @property
    def entry(self) -> str:
        """Its entry in the running index: '<host>|<pid>|<session>|<field>' (lua/call_begin.lua)."""
        return f"{this_process()}|{self.session_id}|{self.field}"


running_calls: set[RunningCall] = set()
"""The calls this process runs right now (a worker process runs one task at a time)."""


def take_back_starts(reason: str) -> int:
    """Uncount the start of every call this process is running; how many were taken back.

    Runs in a signal handler: on a connection of its own, never the store's pool, whose lock the
    interrupted code may hold."""
    taken = 0
    for call in list(running_calls):
        if call.keeps_start:  # cut short, it may have had its effect: its next start meets its policy (issue #17)
            log.warning("%s: call %s of session %s may have run: its start stays counted", reason, call.field,
                        call.session_id)  # fmt: skip
            continue
        pool = call.keys.store.client.connection_pool
        client = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class,
                                                                  **pool.connection_kwargs))  # fmt: skip
        try:
            with redis_errors(client, f"take back the start of call {call.field!r} of {call.session_id!r}"):
                guarded = load_script(client, "lousho.worker:guarded")
                keys = [call.keys.epoch(call.session_id), call.keys.attempts(call.session_id)]
                guarded(keys=keys, args=[call.epoch, "count", f"call:{call.field}", -1])
            taken += 1
            log.warning("%s: the start of call %s of session %s is not counted against it", reason, call.field,
                        call.session_id)  # fmt: skip
        except SDKError as exc:  # Redis is down: the start stays counted, as after a SIGKILL
            log.warning("%s: could not take back the start of call %s: %s", reason, call.field, exc)
        finally:
            client.close()
    return taken


def _on_shutdown(sig: Any = None, how: Any = None, **_: Any) -> None:
    take_back_starts(f"worker shutting down ({how or 'shutdown'}, {sig or 'no signal'})")


def watch_shutdown() -> None:
    """Connect to Celery's shutdown signals (in the main process, and in each pool child)."""
    signals.worker_shutting_down.connect(_on_shutdown, weak=False, dispatch_uid="lousho-shutdown")
    signals.worker_process_shutdown.connect(_on_shutdown, weak=False, dispatch_uid="lousho-process-shutdown")


def name_connections(client: redis.Redis) -> None:
    """Name every Redis connection this process opens from now on `lousho|<host>|<pid>`, and close its idle
    ones: the reaper learns from the names that a process is gone (issue #20, fleet/liveness.py). Celery's
    start of a worker and of a pool child calls it (`watch_processes`), and so does a process's first task
    (`FleetRuntime.run`: a `FleetDriver`, Celery's eager mode), before it writes the running index; once
    named, a process is left as it is."""
    name = connection_name(HOST, os.getpid())
    if is_cluster(client):  # every node's pool, and the nodes found later (a failover's new primary; issue #18)
        cluster = cast(Any, client)
        pools = [node.redis_connection.connection_pool for node in cluster.get_nodes() if node.redis_connection]
        options = [cluster.nodes_manager.connection_kwargs, *(pool.connection_kwargs for pool in pools)]
    else:
        pools = [client.connection_pool]
        options = [client.connection_pool.connection_kwargs]
    if all(option.get("client_name") == name for option in options):
        return  # named already, at Celery's start of this process
    for option in options:
        option["client_name"] = name
    for pool in pools:
        # redis-py names a connection from the kwargs it was made with, also when it reconnects: the pool's
        # existing ones are renamed here too, else a closed idle one opens again unnamed, and a process whose
        # pool made no new one after this was taken for dead (a CI run under load: test_death_detection)
        for connection in connections_of(pool):
            if hasattr(connection, "client_name"):
                connection.client_name = name
    for pool in pools:  # a connection another thread is using stays open, unnamed: one named one is enough
        if isinstance(pool, redis.BlockingConnectionPool):
            cast(Any, pool).disconnect()  # it cannot spare the ones in use (and its method is untyped)
        else:
            pool.disconnect(inuse_connections=False)
    # One named connection from the start: a process is judged only once the reaper saw it connected. If Redis
    # is not up yet, the process is seen from its first command on.
    with contextlib.suppress(redis.RedisError):
        client.ping()


def connections_of(pool: Any) -> list[Any]:
    """Every connection a redis-py pool made, idle or in use (redis-py has no public way to list them)."""
    made = [*getattr(pool, "_available_connections", []), *getattr(pool, "_in_use_connections", [])]
    return made or list(getattr(pool, "_connections", []))  # a BlockingConnectionPool keeps one list


def watch_processes(client: redis.Redis) -> None:
    """Connect `name_connections` to Celery's start of a pool child and of the worker itself."""

    def name(**_: Any) -> None:
        name_connections(client)

    signals.worker_process_init.connect(name, weak=False, dispatch_uid=f"lousho-names-{id(client)}")
    signals.worker_init.connect(name, weak=False, dispatch_uid=f"lousho-names-main-{id(client)}")
