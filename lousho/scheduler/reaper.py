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
import time
from typing import Any

from kombu.exceptions import OperationalError

from lousho.errors import StoreUnavailableError
from lousho.fleet.dispatch import send_advance
from lousho.fleet.inflight import InflightIndex
from lousho.fleet.keys import FleetKeys
from lousho.fleet.registry import ServedAgents, WorkerRegistry, agent_of
from lousho.fleet.settings import FleetSettings
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors
from lousho.telemetry.hooks import requeueing

__all__ = ["reap_once", "run_reaper"]

log = logging.getLogger("lousho.reaper")


def reap_once(
    store: RedisStore, app: Any, settings: FleetSettings, now_ms: int | None = None, limit: int = 1000
) -> list[str]:
    """One pass: the sessions requeued (an `advance` task each), each to a queue where a live worker serves its
    agent when `settings.queue` names none; then, a session no live worker serves stays due (issue #15)."""
    keys, inflight = FleetKeys(store), InflightIndex.of(store, settings.lease_ttl_ms)
    client = store.client
    lock_ms = max(100, round(settings.reaper_interval_s * 1000 * 0.8))
    if not client.set(keys.reaper_lock, "1", nx=True, px=lock_ms):
        return []
    now_ms = inflight.server_time_ms() if now_ms is None else now_ms
    requeued = []
    served: ServedAgents | None = None
    for session_id, _deadline in inflight.due(due_before_ms=now_ms, limit=limit):
        if client.exists(keys.lease(session_id)):
            continue  # a live worker holds it; its heartbeat will push the deadline
        if client.hexists(keys.parked, session_id) or client.exists(keys.abort(session_id)):
            inflight.drop(session_id)
            continue
        queue = settings.queue
        if queue is None:  # to a queue where a live worker serves the session's agent (issue #15)
            served = served or WorkerRegistry(store).live()
            queue = served.route(agent_of(store, session_id), None)
            if queue is None:
                continue  # no live worker serves its agent: it stays due, and is looked at again next pass
        inflight.touch(session_id, now_ms + round(settings.requeue_backoff_s * 1000))
        if not _mark_requeue(client, keys.requeued(session_id), now_ms, settings.requeue_wait_ms):
            continue  # our last requeue still waits on a busy queue: another would only pile up (issue #21)
        with requeueing(store, session_id):  # counted, and traced when traces are on (issue #19)
            send_advance(app, session_id, "reaper", queue)
        requeued.append(session_id)
    if requeued:
        log.warning("reaper requeued %d session(s): %s", len(requeued), ", ".join(requeued[:20]))
    return requeued


def _mark_requeue(client: Any, mark: str, now_ms: int, wait_ms: int) -> bool:
    """Mark a requeue about to be sent, unless the last one is still waiting to be taken (the mark
    holds until when it may wait: a worker that takes it deletes it, `SessionSteps.advance`)."""
    waiting = client.get(mark)
    if waiting is not None and int(waiting) > now_ms:
        return False
    client.set(mark, now_ms + wait_ms, px=wait_ms)
    return True


def run_reaper(store: RedisStore, app: Any, settings: FleetSettings, passes: int | None = None) -> None:
    """`lousho reaper`: a pass every `reaper_interval_s`, forever (or `passes` times)."""
    done = 0
    while passes is None or done < passes:
        try:
            with redis_errors(store.client, "run a reaper pass"):
                reap_once(store, app, settings)
        except (StoreUnavailableError, OperationalError) as exc:  # Redis or the broker is down: try again next pass
            log.warning("reaper pass failed, retrying in %ss: %s", settings.reaper_interval_s, exc)
        done += 1
        time.sleep(settings.reaper_interval_s)
