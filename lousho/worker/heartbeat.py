"""Heartbeats: while work runs, extend its lease, push the session's in-flight deadline, and
watch the session's abort flag (so a running tool's `ctx.signal` fires on `Client.abort`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from lousho.abort import AbortSignal
from lousho.errors import StoreUnavailableError
from lousho.stores.redis_common import redis_errors
from lousho.worker.leases import Lease
from lousho.worker.limits import touch_slot
from lousho.worker.runtime import FleetRuntime

__all__ = ["heartbeat"]

log = logging.getLogger("lousho.worker")


def _beat(runtime: FleetRuntime, session_id: str, lease: Lease, signal: AbortSignal, entry: str | None) -> None:
    if not lease.held:  # released already (a save that ended the step): the work is over
        return
    try:
        if not lease.extend():
            # Another worker took over (this one was stopped past its lease): the session's deadline is
            # theirs to push; a touch from here could put a session they finished back in flight.
            log.warning("lost the lease %s; a save by this worker will be refused", lease.key)
            return
        runtime.inflight.touch(session_id)
        touch_slot(runtime, session_id)  # the session's slot among its agent's in flight (issue #29)
        if entry is not None:  # a tool call's run: still alive (worker/running.py)
            with redis_errors(runtime.store.client, "update the fleet's running index"):
                now_ms = runtime.inflight.server_time_ms()
                runtime.store.client.zadd(runtime.keys.running_of(session_id), {entry: now_ms}, xx=True)
        with redis_errors(runtime.store.client, f"read the abort flag of {session_id!r}"):
            aborted = runtime.store.client.exists(runtime.keys.abort(session_id))
        if aborted:
            signal.abort("aborted by Client.abort()")
    except StoreUnavailableError as exc:  # keep beating: Redis may come back before the lease expires
        log.warning("heartbeat for %s failed: %s", session_id, exc)


@contextlib.asynccontextmanager
async def heartbeat(
    runtime: FleetRuntime, session_id: str, lease: Lease, signal: AbortSignal, entry: str | None = None
) -> AsyncIterator[None]:
    """Beat every `heartbeat_s` for as long as the body runs (`entry`: a tool call's run, whose score in
    the running index each beat pushes to now).

    A timer on the event loop, not a task: most steps end long before the first beat, and a
    timer costs nothing to cancel, where a task costs loop iterations to start and cancel on
    every step (issue #9). The beat's Redis calls are blocking either way."""
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None

    def beat() -> None:
        nonlocal timer
        try:
            _beat(runtime, session_id, lease, signal, entry)
        finally:  # whatever a beat raised, the next one still comes
            timer = loop.call_later(runtime.settings.heartbeat_s, beat)

    timer = loop.call_later(runtime.settings.heartbeat_s, beat)
    try:
        yield
    finally:
        timer.cancel()
