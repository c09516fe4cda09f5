"""The reaper: requeue in-flight sessions whose worker went quiet.

It works from the in-flight index (session -> deadline, pushed forward by every save
and heartbeat) and the session leases, never from broker messages: a worker killed
by the OOM killer, a lost message, an ack Celery sent for a dead child all look the
same here, a deadline that passed with nobody holding the lease. Several reapers at
once are harmless: a pass takes a short lock, and a requeue is idempotent.
`now_ms` is a parameter so tests drive time instead of sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from kombu.exceptions import OperationalError

from lousho.backoff import jittered_s
from lousho.errors import StoreUnavailableError
from lousho.fleet.dispatch import queue_is_empty, send_advance
from lousho.fleet.inflight import InflightIndex
from lousho.fleet.keys import FleetKeys
from lousho.fleet.liveness import DeathWatch
from lousho.fleet.registry import ServedAgents, WorkerRegistry, agent_of
from lousho.fleet.settings import FleetSettings
from lousho.scheduler.approval_repair import repair_on_pass
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors
from lousho.stores.redis_slots import on_shards
from lousho.telemetry.hooks import instrument_fleet, requeueing

__all__ = ["REQUEUE_LOST_AFTER_MS", "Requeue", "reap_once", "run_reaper", "sweep_dead_workers"]

log = logging.getLogger("lousho.reaper")

REQUEUE_LOST_AFTER_MS = 3_600_000
"""A re-send nobody took in this long is sent again even while its queue holds messages: the broker's
`visibility_timeout`, after which even a message a dead worker held is back on the queue (issue #31)."""


def reap_once(
    store: RedisStore, app: Any, settings: FleetSettings, now_ms: int | None = None, limit: int = 1000
) -> list[str]:
    """One pass: the sessions requeued (an `advance` task each), each to a queue where a live worker serves its
    agent when `settings.queue` names none; then, a session no live worker serves stays due (issue #15)."""
    keys, inflight = FleetKeys(store), InflightIndex.of(store, settings.lease_ttl_ms)
    client = store.client
    lock_ms = max(100, round(settings.reaper_interval_s * 1000 * 0.8))
    # One lock on one Redis; on a Cluster one per slot group, and a pass reaps the groups it locked (issue #18)
    taken = on_shards(client, keys.reaper_locks, lambda pipe, lock: pipe.set(lock, "1", nx=True, px=lock_ms))
    held = [group for group, ok in enumerate(taken) if ok]
    if not held:
        return []
    now_ms = inflight.server_time_ms() if now_ms is None else now_ms
    requeue = Requeue(store, app, settings, inflight, now_ms)
    due = inflight.due(due_before_ms=now_ms, limit=limit, shards=store.keys.shards_in_groups("inflight", held))
    requeued = [session_id for session_id, _ in due if requeue(session_id)]
    if requeued:
        log.warning("reaper requeued %d session(s): %s", len(requeued), ", ".join(requeued[:20]))
    return requeued


class Requeue:
    """Requeue one session now (an `advance` task), unless a live worker holds it, it is parked or aborted,
    no live worker serves its agent, or the last requeue may still wait on the queue; True when sent.

    At most one re-send per session waits on a queue, whatever `requeue_backoff_s` (issue #31): the session's
    mark (`FleetKeys.requeued`: when the last was sent) holds until a worker takes that re-send; one sent more
    than `requeue_wait_ms` ago counts as lost only once its queue is empty (a queue is first in, first out:
    had it been queued, a worker would have taken it), or after `REQUEUE_LOST_AFTER_MS`."""

    def __init__(self, store: RedisStore, app: Any, settings: FleetSettings, inflight: InflightIndex, now_ms: int):
        self.store, self.app, self.settings, self.inflight, self.now_ms = store, app, settings, inflight, now_ms
        self.keys = FleetKeys(store)
        self.served: ServedAgents | None = None
        self.empty: dict[str, bool] = {}
        """Per queue, whether it was empty when this pass first asked."""

    def _may_still_wait(self, session_id: str, queue: str) -> bool:
        """Whether the session's last re-send may still be queued (a worker that takes it deletes the mark,
        `SessionSteps.advance`)."""
        with redis_errors(self.store.client, f"read the requeue mark of session {session_id!r}"):
            sent_at = cast(bytes | None, self.store.client.get(self.keys.requeued(session_id)))
        if sent_at is None:
            return False
        age_ms = self.now_ms - int(sent_at)
        if age_ms < self.settings.requeue_wait_ms:
            return True
        if queue not in self.empty:
            self.empty[queue] = queue_is_empty(self.app, queue)
        return not self.empty[queue] and age_ms < REQUEUE_LOST_AFTER_MS

    def __call__(self, session_id: str) -> bool:
        client, keys, settings = self.store.client, self.keys, self.settings
        if client.exists(keys.lease(session_id)):
            return False  # a live worker holds it; its heartbeat will push the deadline
        if client.hexists(keys.parked_of(session_id), session_id) or client.exists(keys.abort(session_id)):
            self.inflight.drop(session_id)
            return False
        queue = settings.queue
        if queue is None:  # to a queue where a live worker serves the session's agent (issue #15)
            self.served = self.served or WorkerRegistry(self.store).live()
            queue = self.served.route(agent_of(self.store, session_id), None)
            if queue is None:
                return False  # no live worker serves its agent: it stays due, and is looked at again next pass
        # The next look at it: `requeue_backoff_s` and up to half that again, so the sessions one pass sends do not
        # all come due on one later pass.
        self.inflight.touch(session_id, self.now_ms + round(jittered_s(floor_s=settings.requeue_backoff_s) * 1000))
        if self._may_still_wait(session_id, queue):
            return False  # our last requeue may still wait on a busy queue: another would only pile up (issue #31)
        with redis_errors(client, f"mark the requeue of session {session_id!r}"):
            client.set(keys.requeued(session_id), self.now_ms, px=REQUEUE_LOST_AFTER_MS)
        with requeueing(self.store, session_id):  # counted, and traced when traces are on (issue #19)
            send_advance(self.app, session_id, "reaper", queue)
        return True


def sweep_dead_workers(store: RedisStore, app: Any, settings: FleetSettings, watch: DeathWatch) -> list[str]:
    """Requeue now the sessions of tool calls whose worker process is gone (issue #20, fleet/liveness.py)."""
    inflight = InflightIndex.of(store, settings.lease_ttl_ms)
    requeued = watch.sweep(Requeue(store, app, settings, inflight, inflight.server_time_ms()))
    if requeued:
        log.warning(
            "a worker process is gone: requeued %d session(s) at once: %s", len(requeued), ", ".join(requeued[:20])
        )
    return requeued


def _retried_later(
    store: RedisStore, what: str, tick_s: float, step: Callable[..., list[Any]], *args: Any
) -> list[Any]:
    """`step(store, *args)`, or [] when Redis or the broker is down (logged): it is tried again next tick."""
    try:
        with redis_errors(store.client, what):
            return step(store, *args)
    except (StoreUnavailableError, OperationalError) as exc:
        log.warning("reaper: %s failed, retrying in %ss: %s", what, tick_s, exc)
        return []


def run_reaper(
    store: RedisStore,
    app: Any,
    settings: FleetSettings,
    passes: int | None = None,
    stop: threading.Event | None = None,
    on_requeued: Callable[[list[str]], None] | None = None,
    on_swept: Callable[[list[str]], None] | None = None,
) -> None:
    """`lousho reaper`: a pass every `reaper_interval_s` until `stop` is set (or `passes` passes); in between, a
    sweep for dead worker processes every `death_check_interval_s` (0: none; issue #20). `on_requeued` sees
    the sessions each pass or sweep requeued; `on_swept` those the death sweep requeued (the demo tells which
    way a session came back: issue #32)."""
    stop = stop or threading.Event()
    instrument_fleet()  # LOUSHO_TRACES in the reaper's environment: its requeues are traced (issue #19)
    watch, done, next_pass = DeathWatch(FleetKeys(store)), 0, time.monotonic()
    tick = min(settings.reaper_interval_s, settings.death_check_interval_s or settings.reaper_interval_s)
    while (passes is None or done < passes) and not stop.is_set():
        requeued: list[str] = []
        # Each in its own guard: a sweep that cannot reach a Cluster primary a failover took away must not stop
        # the pass that makes the client learn the new one (issue #18)
        if settings.death_check_interval_s:
            swept = _retried_later(store, "sweep for dead workers", tick, sweep_dead_workers, app, settings, watch)
            if swept and on_swept is not None:
                on_swept(swept)
            requeued += swept
        if time.monotonic() >= next_pass:
            done, next_pass = done + 1, time.monotonic() + settings.reaper_interval_s
            _retried_later(store, "repair approval records", tick, repair_on_pass, settings, done)  # issue #18
            requeued += _retried_later(store, "run a reaper pass", tick, reap_once, app, settings)
        if requeued and on_requeued is not None:
            on_requeued(requeued)
        stop.wait(tick)
