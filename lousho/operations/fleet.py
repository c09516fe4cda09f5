"""The fleet's status (`fleet_status`: the dashboard's fleet page; moved here from the dashboard, issue #32): live
workers (`live_workers`, also `lousho workers`, with the lousho each runs: issue #35), queue depths, in-flight
sessions and their leases, running calls, parked sessions and the reaper's pending requeues, read from the fleet's Redis (issue #19); the fleet-wide limits
the live workers keep, with what each uses now and how many sessions wait on it (issue #29).

The reaper's requeues, lease takeovers and poison results are the fleet-wide counts of the metrics' counters
(`lousho.telemetry.counters`, when present); each session's pending-requeue mark (`FleetKeys.requeued`) is
shown per in-flight session.

Running calls are those of a live process in a session still in flight: an entry of a process that is gone
(a SIGKILLed worker: its connections closed), or of a session that has moved on (finished, paused, deleted:
out of the in-flight index), is what a crash left in the running index, not a running call (issue #32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from lousho.errors import ConfigurationError
from lousho.fleet.inflight import InflightIndex
from lousho.fleet.keys import FleetKeys
from lousho.fleet.limits import LimitUsage, SlotUsage, live_limits_usage
from lousho.fleet.liveness import live_processes
from lousho.fleet.registry import LiveWorker, WorkerRegistry
from lousho.operations.target import Target
from lousho.stores.redis_common import redis_errors, text

__all__ = ["FleetView", "InflightRow", "RunningCallRow", "fleet_status", "live_workers"]

_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")
"""Celery's Redis transport keeps a queue's messages in one list per priority step: `<queue>`, `<queue>\\x06\\x163`..."""


@dataclass(frozen=True)
class InflightRow:
    session_id: str
    due_in_s: float
    """Seconds until the reaper may requeue it (negative: overdue)."""
    lease_holder: str | None
    lease_left_s: float | None
    requeue_pending: bool


@dataclass(frozen=True)
class RunningCallRow:
    worker: str
    session_id: str
    call: str
    beat_age_s: float
    """Seconds since the call's last heartbeat (each beat also extends its lease)."""
    lease_left_s: float | None
    """Time left on the call's lease (None: no lease held, the call is ending or its worker died)."""


@dataclass(frozen=True)
class FleetView:
    workers: tuple[LiveWorker, ...]
    queues: dict[str, int]
    """Queue -> messages waiting (the live workers' queues)."""
    inflight: list[InflightRow]
    running: list[RunningCallRow]
    parked: dict[str, str]
    events: dict[str, int] | None
    """Fleet-wide counts (reaper requeues, lease takeovers, poison results); None where none are kept."""
    rate_limits: list[LimitUsage]
    """Each model's rate limit the live workers keep, with its current window's use (issue #29)."""
    session_limits: list[SlotUsage]
    """Each agent's maximum of sessions in flight the live workers keep, with the slots held (issue #29)."""


def live_workers(ctx: Target) -> tuple[LiveWorker, ...]:
    """The live workers, each with its node name, agents, queues, and the lousho and protocols it speaks
    (issue #35: a fleet in a rolling upgrade shows two releases): `lousho workers` and the fleet page."""
    store = ctx.fleet_store
    if store is None:
        raise ConfigurationError(f"the workers are a fleet's (a Redis store and its workers); {ctx.bundle!r} is not")
    return WorkerRegistry(store).live().workers


def fleet_status(ctx: Target) -> FleetView | None:
    """The fleet's status; None when the target is not a fleet's RedisStore."""
    store = ctx.fleet_store
    if store is None:
        return None
    registry = WorkerRegistry(store)
    workers = live_workers(ctx)
    now_ms = registry.server_time_ms()
    rate_limits, session_limits = live_limits_usage(store)
    queues = sorted({queue for worker in workers for queue in worker.queues})
    if ctx.client is not None and ctx.client.settings.queue:
        queues = sorted({*queues, ctx.client.settings.queue})
    inflight = _inflight(store, now_ms)
    return FleetView(
        workers=workers,
        queues={queue: _depth(store.client, queue) for queue in queues},
        inflight=inflight,
        running=_running(store, now_ms),
        parked=ctx.parked_reasons(),
        events=_event_counts(store),
        rate_limits=rate_limits,
        session_limits=session_limits,
    )


def _event_counts(store: Any) -> dict[str, int] | None:
    try:
        from lousho.telemetry.counters import FleetCounters
    except ImportError:  # the telemetry package is optional here: the page shows what Redis holds
        return None
    return {name.replace("_", " "): count for name, count in FleetCounters.of(store).read().items()}


def _depth(client: Any, queue: str) -> int:
    with redis_errors(client, f"read the depth of queue {queue!r}"):
        return sum(int(client.llen(f"{queue}{suffix}")) for suffix in _PRIORITY_SUFFIXES)


def _inflight(store: Any, now_ms: int) -> list[InflightRow]:
    keys = FleetKeys(store)
    index = InflightIndex.of(store, 0)
    rows = []
    for session_id, deadline_ms in index.due(due_before_ms=2**62, limit=200):
        with redis_errors(store.client, f"read the lease of {session_id!r}"):
            holder = store.client.get(keys.lease(session_id))
            left_ms = int(store.client.pttl(keys.lease(session_id)))
            requeued = bool(store.client.exists(keys.requeued(session_id)))
        rows.append(
            InflightRow(
                session_id=session_id,
                due_in_s=(deadline_ms - now_ms) / 1000,
                lease_holder=_holder(text(holder)) if holder is not None else None,
                lease_left_s=left_ms / 1000 if left_ms >= 0 else None,
                requeue_pending=requeued,
            )
        )
    return rows


def _in_flight(store: Any, session_id: str) -> bool:
    with redis_errors(store.client, f"read whether {session_id!r} is in flight"):
        return store.client.zscore(store.keys.inflight_of(session_id), session_id) is not None


def _holder(token: str) -> str:
    """A lease token is '<host>|<pid>-<random>' (`lousho.worker.leases.Lease`): its holder is what an operator needs."""
    host, bar, rest = token.rpartition("|")
    pid, dash, _ = rest.partition("-")
    return f"pid {pid} on {host}" if bar and dash and pid.isdigit() else token


def _running(store: Any, now_ms: int) -> list[RunningCallRow]:
    """The calls running now: of a live process (connected to Redis), in a session still in flight."""
    keys = FleetKeys(store)
    with redis_errors(store.client, "read the running calls"):
        entries = cast(list[tuple[Any, float]], store.client.zrange(keys.running, 0, 199, withscores=True))
    _, live = live_processes(store.client)
    rows = []
    for entry, beat_ms in entries:
        host, pid, session_id, field = [*text(entry).split("|", 3), "", "", "", ""][:4]
        if f"{host}|{pid}" not in live or not _in_flight(store, session_id):
            continue  # left by a crash (the death sweep requeued its session) or a session that moved on
        call_id = field.split(":", 1)[-1]  # a `result_field` is '<turn>:<call id>'
        with redis_errors(store.client, f"read the lease of call {call_id!r}"):
            left_ms = int(store.client.pttl(keys.call_lease(session_id, call_id)))
        left_s = left_ms / 1000 if left_ms >= 0 else None
        rows.append(RunningCallRow(f"{host}|{pid}", session_id, field, (now_ms - beat_ms) / 1000, left_s))
    return rows
