"""Where the fleet is measured and traced: Celery's signals around each task, and the reaper's requeue (issue #19).

Off unless asked, and then nothing is connected (zero cost). A worker process turns them on from its
environment when `create_app` runs (`instrument_fleet`):

- `LOUSHO_METRICS=1`: each task's time into `lousho_step_seconds` (`lousho.telemetry.metrics`), and a
  step that finds its lease taken over counted fleet-wide (`lousho.telemetry.counters`);
  `PROMETHEUS_MULTIPROC_DIR` for prefork workers; `LOUSHO_METRICS_PORT=<port>`: the worker's main
  process serves `/metrics` there (the folder's metrics and the store's);
- `LOUSHO_TRACES=otlp|console|global`: a span per task (`lousho.telemetry.traces`).

Any process (a web app's, a test's, the reaper's) can call `enable(...)` itself. The receivers run in
the task's own thread and context, so the hop's span is current in the task's coroutine (the
runtime's loop runs it there) and in the outbox's `before_task_publish`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from celery import signals

from lousho.fleet.settings import TASK_ADVANCE, TASK_MODEL_TURN, TASK_TOOL_CALL
from lousho.stores.redis import RedisStore
from lousho.telemetry.counters import FleetCounters

__all__ = ["disable", "enable", "instrument_fleet", "requeueing"]

log = logging.getLogger("lousho.telemetry")

STEP_KINDS = {TASK_MODEL_TURN: "model_turn", TASK_TOOL_CALL: "tool_call", TASK_ADVANCE: "advance"}
TAKEN_OVER = ("lease-lost", "error: LOUSHO_LEASE_LOST", "error: LOUSHO_CHECKPOINT_CONFLICT")
"""Outcomes of a step whose lease another worker took over: it stood down, or its save was refused."""
_ON = ("1", "true", "yes", "on")


@dataclass
class _State:
    metrics: Any = None
    """`lousho.telemetry.metrics` while metrics are on."""
    traces: Any = None
    """`lousho.telemetry.traces` while traces are on."""


_state = _State()


@dataclass
class _Running:
    started: float
    kind: str
    store: RedisStore | None
    hop: Any = None


_running: ContextVar[_Running | None] = ContextVar("lousho_running_task", default=None)


def instrument_fleet() -> None:
    """Turn metrics and traces on as this process's environment says (`create_app` calls it)."""
    metrics = os.environ.get("LOUSHO_METRICS", "").strip().lower() in _ON
    traces = os.environ.get("LOUSHO_TRACES", "").strip()
    port = os.environ.get("LOUSHO_METRICS_PORT", "").strip()
    if not (metrics or traces or port):
        return
    provider = None
    if traces and _state.traces is None:
        from lousho.telemetry.traces import provider_from_env

        provider = provider_from_env(traces)
    enable(metrics=metrics or bool(port), traces=provider)
    if port:
        signals.worker_ready.connect(_serve_on(int(port)), weak=False, dispatch_uid="lousho-metrics-port")


def enable(*, metrics: bool = False, traces: Any = None) -> None:
    """Measure lousho's tasks in this process (`metrics`), trace them with the OpenTelemetry
    `traces` provider, or both."""
    if metrics:
        from lousho.telemetry import metrics as metrics_module

        _state.metrics = metrics_module
    if traces is not None:
        from lousho.telemetry import traces as traces_module

        traces_module.set_provider(traces)
        _state.traces = traces_module
    if _state.metrics is None and _state.traces is None:
        return
    signals.task_prerun.connect(_task_started, weak=False, dispatch_uid="lousho-telemetry-prerun")
    signals.task_postrun.connect(_task_ended, weak=False, dispatch_uid="lousho-telemetry-postrun")
    signals.worker_process_shutdown.connect(_flush, weak=False, dispatch_uid="lousho-telemetry-flush")
    if _state.traces is not None:
        signals.before_task_publish.connect(_publishing, weak=False, dispatch_uid="lousho-telemetry-publish")


def disable() -> None:
    """Stop measuring and tracing in this process (what `enable` connected is disconnected)."""
    if _state.traces is not None:
        _state.traces.set_provider(None)
    _state.metrics = _state.traces = None
    signals.task_prerun.disconnect(dispatch_uid="lousho-telemetry-prerun")
    signals.task_postrun.disconnect(dispatch_uid="lousho-telemetry-postrun")
    signals.worker_process_shutdown.disconnect(dispatch_uid="lousho-telemetry-flush")
    signals.before_task_publish.disconnect(dispatch_uid="lousho-telemetry-publish")


@contextmanager
def requeueing(store: RedisStore, session_id: str) -> Iterator[None]:
    """Around the reaper's send of a session's advance: counted fleet-wide once sent (one HINCRBY,
    always: the dashboard shows it), and traced as a span event when traces are on."""
    if _state.traces is None:
        yield
    else:
        with _state.traces.requeue_span(store, session_id):
            yield
    FleetCounters.of(store).add("reaper_requeues")


def _store_of(task: Any) -> RedisStore | None:
    runtime = getattr(task.app, "lousho_runtime", None)
    return runtime.store if runtime is not None else None


def _task_started(sender: Any = None, task_id: str = "", task: Any = None, args: Any = (), **_: Any) -> None:
    kind = STEP_KINDS.get(getattr(task, "name", ""))
    if kind is None:
        return
    running = _Running(time.perf_counter(), kind, _store_of(task))
    _running.set(running)
    if _state.traces is not None and running.store is not None and args:
        try:
            running.hop = _state.traces.start_hop(running.store, task.name, task_id, args, task.request)
        except Exception as exc:  # a trace must never cost a step: the task runs untraced
            log.warning("lousho: task %s runs untraced: %s", task_id, exc)


def _task_ended(sender: Any = None, task_id: str = "", retval: Any = None, state: str = "", **_: Any) -> None:
    running = _running.get()
    if running is None:
        return
    _running.set(None)
    failed = state != "SUCCESS"
    outcome = "raised" if failed else str(retval)
    try:
        if running.hop is not None:
            _state.traces.end_hop(running.hop, outcome, failed)
        if _state.metrics is not None:
            _state.metrics.observe_step(running.kind, outcome, time.perf_counter() - running.started)
            if outcome in TAKEN_OVER and running.store is not None:
                FleetCounters.of(running.store).add("lease_takeovers")
    except Exception as exc:
        log.warning("lousho: task %s was not measured: %s", task_id, exc)


def _publishing(headers: Any = None, **_: Any) -> None:
    if _state.traces is not None and isinstance(headers, dict):
        _state.traces.inject_next_parent(headers)


def _flush(**_: Any) -> None:
    """A prefork child ends: send the spans it still holds (its exit skips `atexit`)."""
    if _state.traces is not None:
        flush = getattr(_state.traces.current_provider(), "force_flush", None)
        if flush is not None:
            flush()


def _serve_on(port: int) -> Any:
    def serve(sender: Any = None, **_: Any) -> None:
        from prometheus_client import start_http_server

        from lousho.telemetry.metrics import metrics_registry

        app = getattr(sender, "app", None)
        store = getattr(getattr(app, "lousho_runtime", None), "store", None)
        start_http_server(port, registry=metrics_registry(store))
        log.info("lousho: metrics served on port %d", port)

    return serve
