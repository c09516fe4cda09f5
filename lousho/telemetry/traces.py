"""OpenTelemetry traces of fleet runs: one trace per run, a span per hop (issue #19; `pip install 'lousho[otel]'`).

A run's hops are tasks on many workers. Each hop's span (`lousho.model_turn`, `lousho.tool_call`,
`lousho.advance`) is the child of the context in its task's `traceparent` header (W3C trace
context), which the hop that sent it put there: the run's root span (`lousho.run`), or, for a hop
the reaper requeued, the reaper's `lousho.requeue` span (itself a child of the root, with a
`lousho.reaper.requeued` event). The header goes on every task a hop sends, through Celery's
publish and through the outbox (both send `before_task_publish`, whose receiver is `inject_next_parent`).

The root's context is also kept in the session's `trace` hash in Redis (`<prefix>{<session>}:trace`,
field `root`), with how many times each task id was started (the span's `lousho.attempt`): a hop
that comes without the header (the first of a run, a `Client.approve`'s or `resume`'s advance) and the
reaper (which has no message to read it from) find the run there. The first hop of a run with neither
starts the root. The hash is read once per hop (one round trip, only while tracing is on), and
dropped when the run finishes, so the session's next run is a trace of its own.

Attributes: `lousho.session_id`, `lousho.turn`, `lousho.tool`, `lousho.tool_call_id`,
`lousho.attempt`, `lousho.reason` (an advance's), `lousho.outcome` (what the task returned), `lousho.parent`
(`header`: the parent came in the task's headers; `run`: from the session's trace hash). A task sent
from a traced web request (`Client.enqueue` in a request's span) carries that span in `lousho_caller`: the
run's root links to it (a run is a trace of its own), as does the hop of a run under way (an approval's).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, cast

from lousho.errors import ConfigurationError
from lousho.fleet.settings import TASK_ADVANCE, TASK_MODEL_TURN, TASK_TOOL_CALL
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors, text
from lousho.telemetry.extras import missing_extra

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # an optional extra: say how to get it where it is first needed
    raise missing_extra("otel", "traces", exc) from exc

__all__ = [
    "CALLER_HEADER",
    "Hop",
    "current_provider",
    "end_hop",
    "inject_next_parent",
    "provider_from_env",
    "requeue_span",
    "set_provider",
    "start_hop",
    "trace_key",
]

TRACE_KEPT_S = 7 * 24 * 3600
"""How long a run's trace hash outlives its last hop (unless the store's `ttl_s` is shorter)."""
SPAN_NAMES = {TASK_MODEL_TURN: "lousho.model_turn", TASK_TOOL_CALL: "lousho.tool_call", TASK_ADVANCE: "lousho.advance"}
CALLER_HEADER = "lousho_caller"
"""The traceparent of the span current where a task was sent from outside the fleet (a web request's)."""
_RUN_OVER = ("finished", "unknown-session")
"""Outcomes after which the session's next hop belongs to a new run (a new trace)."""

_W3C = TraceContextTextMapPropagator()
_provider: trace.TracerProvider | None = None
_next_parent: ContextVar[Context | None] = ContextVar("lousho_next_parent", default=None)
"""What the tasks sent now are children of: the run's root on a worker, the requeue span in the reaper."""


def set_provider(provider: trace.TracerProvider | None) -> None:
    """Trace with `provider` in this process (None: stop tracing)."""
    global _provider
    _provider = provider


def provider_from_env(mode: str) -> trace.TracerProvider:
    """The provider `LOUSHO_TRACES=<mode>` asks for: `otlp` (or `1`) exports over OTLP/HTTP to
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` (default http://localhost:4318);
    `console` prints each span; `global` uses the process's global provider (set up by the app itself,
    or `opentelemetry-instrument`)."""
    mode = mode.strip().lower()
    if mode == "global":
        return trace.get_tracer_provider()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if mode in ("1", "true", "on", "otlp"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    elif mode == "console":
        exporter = ConsoleSpanExporter()
    else:
        raise ConfigurationError(f"LOUSHO_TRACES={mode!r}: say otlp (or 1), console or global")
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "lousho"}
    provider = TracerProvider(resource=Resource.create(named))
    provider.add_span_processor(BatchSpanProcessor(exporter))  # re-made in a forked child by the SDK itself
    return provider


def current_provider() -> trace.TracerProvider:
    """The provider lousho traces with in this process."""
    return _provider or trace.get_tracer_provider()


def _tracer() -> trace.Tracer:
    return current_provider().get_tracer("lousho")


def trace_key(store: RedisStore, session_id: str) -> str:
    """The session's trace hash: `root` (the run's traceparent) and each task id's starts."""
    return store.keys.session_key(session_id, "trace")


@dataclass
class Hop:
    """One task's span, current while the task runs."""

    span: trace.Span
    store: RedisStore
    session_id: str
    attached: object
    next_parent: Token[Context | None]


def hop_attributes(task_name: str, args: tuple[Any, ...] | list[Any]) -> dict[str, str | int]:
    """The span attributes of a lousho task's arguments (`lousho.fleet.dispatch`: ids only)."""
    attributes: dict[str, str | int] = {"lousho.session_id": str(args[0])}
    if task_name == TASK_MODEL_TURN and len(args) > 1:
        attributes["lousho.turn"] = int(args[1])
    elif task_name == TASK_TOOL_CALL and len(args) > 3:
        attributes.update(
            {"lousho.tool_call_id": str(args[1]), "lousho.tool": str(args[2]), "lousho.turn": int(args[3])}
        )
    elif task_name == TASK_ADVANCE and len(args) > 1:
        attributes["lousho.reason"] = str(args[1])
    return attributes


def start_hop(store: RedisStore, task_name: str, task_id: str, args: Any, request: Any) -> Hop:
    """Start the span of a task about to run (Celery's `task_prerun`), the child of its `traceparent`
    header, else of its run's root (started here when the run has none)."""
    attributes = hop_attributes(task_name, args)
    session_id = str(attributes["lousho.session_id"])
    key = trace_key(store, session_id)
    kept_s = min(TRACE_KEPT_S, int(store.ttl_s)) if store.ttl_s else TRACE_KEPT_S
    with redis_errors(store.client, f"read the trace of session {session_id!r}"):
        pipe = store.client.pipeline(transaction=False)
        pipe.hincrby(key, task_id, 1)
        pipe.hget(key, "root")
        pipe.expire(key, kept_s)
        attempt, root, _ = pipe.execute()
    header = getattr(request, "traceparent", None)
    carried = {"traceparent": str(header), "tracestate": str(getattr(request, "tracestate", None) or "")}
    parent = _W3C.extract(carried) if header else None
    caller = _caller_links(request)
    if root is not None:
        root_context = _W3C.extract({"traceparent": text(root)})
    else:
        root_context = parent if parent is not None else _start_run(session_id, caller)
        _keep_root(store, key, root_context)
        caller = []  # linked from the run's root
    span = _tracer().start_span(
        SPAN_NAMES.get(task_name, task_name),
        context=parent if parent is not None else root_context,
        kind=SpanKind.CONSUMER,
        # lousho.parent: whether the hop's parent came in its task's headers, or from its run (issue #19)
        attributes={**attributes, "lousho.attempt": int(attempt), "lousho.parent": "header" if header else "run"},
        links=caller,
    )
    attached = otel_context.attach(trace.set_span_in_context(span))
    return Hop(span, store, session_id, attached, _next_parent.set(root_context))


def _caller_links(request: Any) -> list[trace.Link]:
    """A link to the span that sent the task from outside the fleet (`CALLER_HEADER`), if any."""
    caller = getattr(request, CALLER_HEADER, None)
    if not caller:
        return []
    context = trace.get_current_span(_W3C.extract({"traceparent": str(caller)})).get_span_context()
    return [trace.Link(context)] if context.is_valid else []


def _start_run(session_id: str, caller: list[trace.Link]) -> Context:
    """The run's root span, in a trace of its own (linked to the span that enqueued it, if traced); it ends
    at once (a run outlives any process)."""
    attributes = {"lousho.session_id": session_id}
    root = _tracer().start_span("lousho.run", context=Context(), attributes=attributes, links=caller)
    root.end()
    return trace.set_span_in_context(root)


def _keep_root(store: RedisStore, key: str, root_context: Context) -> None:
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=root_context)
    if "traceparent" in carrier:
        with redis_errors(store.client, "keep the run's trace context"):
            store.client.hsetnx(key, "root", carrier["traceparent"])


def end_hop(hop: Hop, outcome: str, failed: bool = False) -> None:
    """End the hop's span with the task's outcome; the run's trace hash goes when the run is over."""
    try:
        hop.span.set_attribute("lousho.outcome", outcome)
        if failed or outcome.startswith("error"):
            hop.span.set_status(Status(StatusCode.ERROR, outcome))
        hop.span.end()
        if outcome in _RUN_OVER:
            with redis_errors(hop.store.client, f"drop the trace of session {hop.session_id!r}"):
                hop.store.client.delete(trace_key(hop.store, hop.session_id))
    finally:
        _next_parent.reset(hop.next_parent)
        otel_context.detach(hop.attached)  # type: ignore[arg-type]  # attach's token, typed as object here


def inject_next_parent(headers: dict[str, Any]) -> None:
    """Put the context the task being sent is a child of into its headers (`before_task_publish`). Sent from
    outside a hop (a web app's `Client.enqueue`, `resolve_approval`) while a span is current, that span goes
    in `CALLER_HEADER`: the run's root (or, for a run under way, the hop) links to it."""
    parent = _next_parent.get()
    if headers is None or headers.get("task") not in SPAN_NAMES:
        return
    if parent is not None:
        _W3C.inject(headers, context=parent)
    elif trace.get_current_span().get_span_context().is_valid:
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        if "traceparent" in carrier:
            headers[CALLER_HEADER] = carrier["traceparent"]


@contextmanager
def requeue_span(store: RedisStore, session_id: str) -> Iterator[None]:
    """The reaper's `lousho.requeue` span around sending a session's advance: a child of the run's
    root, with a `lousho.reaper.requeued` event; the advance it sends is its child."""
    with redis_errors(store.client, f"read the trace of session {session_id!r}"):
        root = cast(bytes | str | None, store.client.hget(trace_key(store, session_id), "root"))
    parent = _W3C.extract({"traceparent": text(root)}) if root is not None else Context()
    attributes = {"lousho.session_id": session_id}
    span = _tracer().start_span("lousho.requeue", context=parent, kind=SpanKind.PRODUCER, attributes=attributes)
    span.add_event("lousho.reaper.requeued", attributes)
    token = _next_parent.set(trace.set_span_in_context(span))
    try:
        yield
    finally:
        _next_parent.reset(token)
        span.end()
