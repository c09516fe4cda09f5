"""A worker's presence in the fleet's registry (`lousho.fleet.registry`): which agents it serves on which
queues, with a heartbeat (issue #15).

A Celery worker of a lousho app publishes when it is ready (`worker_ready`, in its main process), beats
from a thread of its own every `heartbeat_s`, and takes its entry back when it shuts down
(`worker_shutdown`); a SIGKILLed worker's entry expires `lease_ttl_s` after its last beat. The beat is a
thread, not a task, so a long tool call does not make its worker look gone. `lousho.testing.FleetDriver`
publishes its in-process workers the same way.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

from celery import signals

from lousho.errors import NewerLayoutError, StoreUnavailableError
from lousho.fleet.layout import claim_layout
from lousho.fleet.liveness import this_process
from lousho.fleet.protocol import speaks
from lousho.fleet.registry import WorkerRegistry
from lousho.stores.redis_common import redis_errors
from lousho.worker.runtime import FleetRuntime

__all__ = ["Presence", "watch_presence"]

log = logging.getLogger("lousho.worker")


class Presence:
    """One worker's entry in the registry, kept alive by a beat thread while it is started."""

    def __init__(
        self, runtime: FleetRuntime, queues: Sequence[str], worker_id: str | None = None, name: str | None = None
    ) -> None:
        self.registry = WorkerRegistry(runtime.store)
        self.queues = sorted(set(queues))
        self.agents = sorted(runtime.agents)
        self.limits = runtime.limits.describe()
        self.worker_id = worker_id or this_process()
        self.name = name
        """The Celery node name, shown by the dashboard's fleet page (issue #32)."""
        self.interval_s = runtime.settings.heartbeat_s
        self.ttl_ms = runtime.settings.lease_ttl_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self) -> None:
        """Write the entry, live for `lease_ttl_s` from now (Redis server time); drop expired entries."""
        registry = self.registry
        now_ms = registry.server_time_ms()
        entry = {"queues": self.queues, "agents": self.agents, "expires_ms": now_ms + self.ttl_ms}
        entry.update(speaks())  # its lousho version and the formats it speaks (issue #35)
        if self.name:
            entry["name"] = self.name
        if self.limits["rate"] or self.limits["sessions"]:  # what the dashboard shows of the limits (issue #29)
            entry["limits"] = self.limits
        expired = [w for w, e in registry.entries().items() if w != self.worker_id and not _live(e, now_ms)]
        with redis_errors(registry.store.client, "publish this worker's agents"):
            registry.store.client.hset(registry.key_of(self.worker_id), self.worker_id, json.dumps(entry))
            for worker_id in expired:  # each in its own shard on a Cluster (issue #18); rare: a worker that died
                registry.store.client.hdel(registry.key_of(worker_id), worker_id)

    def start(self) -> Presence:
        """Publish now, then beat from a daemon thread until `stop()`."""
        self.publish()
        self._thread = threading.Thread(target=self._beat, name="lousho-presence", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.publish()
            except StoreUnavailableError as exc:  # keep beating: Redis may come back before the entry expires
                log.warning("could not publish this worker's agents: %s", exc)

    def stop(self) -> None:
        """Stop beating and take the entry back: the agents are no longer served here."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            with redis_errors(self.registry.store.client, "take back this worker's agents"):
                self.registry.store.client.hdel(self.registry.key_of(self.worker_id), self.worker_id)
        except StoreUnavailableError as exc:  # the entry expires by itself
            log.warning("could not take back this worker's agents: %s", exc)


def _live(entry: dict[str, Any], now_ms: int) -> bool:
    expires = entry.get("expires_ms")
    return isinstance(expires, int) and expires > now_ms


_presences: dict[int, Presence] = {}
"""This process's presence per app (by id): a worker process serves one app."""


def _on_ready(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    runtime = getattr(app, "lousho_runtime", None)
    if app is None or not isinstance(runtime, FleetRuntime):
        return
    queues = list(app.amqp.queues.consume_from)
    if runtime.settings.queue not in queues:  # its steps after the first would go where nobody takes them
        log.warning("this worker consumes %s but its app sends the next steps to %r: add it (-Q)", queues,
                    runtime.settings.queue)  # fmt: skip
    name = getattr(sender, "hostname", None)
    _presences[id(app)] = Presence(runtime, queues, name=name if isinstance(name, str) else None).start()
    log.info("lousho: serving %s on %s", ", ".join(sorted(runtime.agents)), ", ".join(queues))


def _on_init(sender: Any = None, **_: Any) -> None:
    """Before the worker connects to its broker: refuse to start on a Redis whose stored layout is newer than this
    lousho's (issue #35, `lousho.fleet.layout`), else record ours. SystemExit, not an exception: Celery's signals
    log an exception and go on; a worker must not."""
    runtime = getattr(getattr(sender, "app", None), "lousho_runtime", None)
    if not isinstance(runtime, FleetRuntime):
        return
    try:
        claim_layout(runtime.store.client, runtime.store.keys.prefix)
    except NewerLayoutError as exc:
        log.critical("lousho: this worker does not start: %s", exc)
        raise SystemExit(f"lousho: this worker does not start: {exc}") from None
    except StoreUnavailableError as exc:  # Redis down at start: each step reads it anyway; the next start checks
        log.warning("could not check the fleet's stored layout: %s", exc)


def _on_shutdown(sender: Any = None, **_: Any) -> None:
    presence = _presences.pop(id(getattr(sender, "app", None)), None)
    if presence is not None:
        presence.stop()


def watch_presence() -> None:
    """Connect to Celery's worker signals: check the stored layout first, publish when ready, take back at
    shutdown."""
    signals.worker_init.connect(_on_init, weak=False, dispatch_uid="lousho-layout-check")
    signals.worker_ready.connect(_on_ready, weak=False, dispatch_uid="lousho-presence-ready")
    signals.worker_shutdown.connect(_on_shutdown, weak=False, dispatch_uid="lousho-presence-shutdown")
