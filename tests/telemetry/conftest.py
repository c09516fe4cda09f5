"""Fixtures of the telemetry tests (issue #19): a local OTLP/HTTP receiver, a reaper that records what it
requeued, and the fleet fixture (real worker processes) of tests/fleet."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from google.protobuf.json_format import Parse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from lousho.scheduler.reaper import run_reaper
from lousho.worker import FleetSettings
from tests.fleet.conftest import Fleet, fleet  # noqa: F401  (the fixture, for the tests here)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as an OTLP receiver got it."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: list[str]
    service: str
    links: list[tuple[str, str]]
    """(trace id, span id) of each span it links to."""


@dataclass
class OtlpReceiver:
    """A local OTLP/HTTP collector: `POST /v1/traces`, protobuf or JSON, as the exporters send it."""

    base_url: str = ""
    """What `OTEL_EXPORTER_OTLP_ENDPOINT` names: the exporter posts to its `/v1/traces`."""
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            events=[event.name for event in span.events],
                            service=resource.get("service.name", ""),
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        )
                    )
        with self.lock:
            self.spans.extend(found)

    def of_session(self, session_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.attributes.get("lousho.session_id") == session_id]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = ExportTraceServiceRequest()
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            if "json" in self.headers.get("Content-Type", ""):
                Parse(json.dumps(json.loads(body)), request)
            else:
                request.ParseFromString(body)
            receiver.take(request)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="otlp-receiver")
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def start_recording_reaper(fleet: Fleet, requeued: list[str], interval_s: float = 0.3) -> None:  # noqa: F811
    """The real reaper (`run_reaper`, as `lousho reaper` runs it: passes and dead-worker sweeps) in a thread of
    this process, noting each session it requeued: the witness the metrics and spans are checked against."""
    settings = FleetSettings(queue=fleet.queue, reaper_interval_s=interval_s, requeue_backoff_s=3.0)
    thread = threading.Thread(
        target=run_reaper,
        args=(fleet.store, fleet.client.app, settings),
        kwargs={"stop": fleet._stop, "on_requeued": requeued.extend},
        daemon=True,
        name="recording-reaper",
    )
    thread.start()
    fleet._threads.append(thread)
