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
from lousho.worker.runtime import FleetRuntime

__all__ = ["heartbeat"]

log = logging.getLogger("lousho.worker")


async def _beat(runtime: FleetRuntime, session_id: str, lease: Lease, signal: AbortSignal) -> None:
    keys = runtime.keys
    while True:
        await asyncio.sleep(runtime.settings.heartbeat_s)
        try:
            if not lease.extend():
                log.warning("lost the lease %s; a save by this worker will be refused", lease.key)
            runtime.store.checkpoints.touch_inflight(session_id)
            with redis_errors(runtime.store.client, f"read the abort flag of {session_id!r}"):
                aborted = runtime.store.client.exists(keys.abort(session_id))
            if aborted:
                signal.abort("aborted by Client.abort()")
        except StoreUnavailableError as exc:  # keep beating: Redis may come back before the lease expires
            log.warning("heartbeat for %s failed: %s", session_id, exc)


@contextlib.asynccontextmanager
async def heartbeat(runtime: FleetRuntime, session_id: str, lease: Lease, signal: AbortSignal) -> AsyncIterator[None]:
    """Beat for as long as the body runs."""
    task = asyncio.ensure_future(_beat(runtime, session_id, lease, signal))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
