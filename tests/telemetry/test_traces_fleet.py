"""Spans exported by real worker processes to a local OTLP/HTTP receiver form one trace per run, parent-child
across the hops, through the outbox and through a requeue after a SIGKILL (issue #19)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Tracer

from lousho import Message
from lousho.telemetry import hooks
from lousho.telemetry.counters import FleetCounters
from lousho.telemetry.traces import trace_key
from lousho.testing.workers import start_worker
from tests.fleet.conftest import ROOT, Fleet, tool_turn
from tests.telemetry.conftest import OtlpReceiver, ReceivedSpan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.workers]

LOUSHO = str(Path(sys.executable).with_name("lousho"))
NOT_RUN = ("recorded", "running-elsewhere", "unknown-session", "waiting-for-approval")


@contextmanager
def lousho_reaper(fleet: Fleet, redis_url: str, env: dict[str, str], log: Path) -> Iterator[None]:
    """`lousho reaper` on the test's store and queue, with `env` (LOUSHO_TRACES ...); ended by pid."""
    settings = {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": fleet.prefix, "LOUSHO_QUEUE": fleet.queue,
                "LOUSHO_REAPER_INTERVAL_S": "0.3", "LOUSHO_REQUEUE_BACKOFF_S": "3", "LOUSHO_LEASE_TTL_S": "2",
                "OTEL_SERVICE_NAME": "test-reaper"}  # fmt: skip
    with open(log, "wb") as output:
        process = subprocess.Popen([LOUSHO, "reaper"], env={**os.environ, **settings, **env}, stdout=output,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield
    finally:
        process.terminate()
        process.wait(timeout=15)


@contextmanager
def traced_web_app(receiver: OtlpReceiver) -> Iterator[Tracer]:
    """This process traces as a web app would (its own provider, lousho's hooks on), to the receiver."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test-web"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.base_url}/v1/traces")))
    hooks.enable(traces=provider)
    try:
        yield provider.get_tracer("test-web")
    finally:
        hooks.disable()
        provider.shutdown()


def wait_for_spans(
    receiver: OtlpReceiver, session_id: str, done: str, timeout_s: float = 30.0, at_least: int = 0
) -> list[ReceivedSpan]:
    """The session's spans, once the span of its finishing hop (named `done`) and `at_least` spans in all have
    come in (each process exports on its own schedule: another's may come after the finishing one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spans = receiver.of_session(session_id)
        finished = any(s.name == done and s.attributes.get("lousho.outcome") == "finished" for s in spans)
        if finished and len(spans) >= at_least:
            return spans
        time.sleep(0.1)
    raise AssertionError(f"no finishing span of {session_id}: {receiver.of_session(session_id)}")


def test_a_run_is_one_trace_across_workers_the_outbox_and_a_requeue_after_a_sigkill(
    fleet: Fleet, otlp_receiver: OtlpReceiver, redis_url: str, tmp_path: Path
) -> None:
    fleet.script("t1", [tool_turn(("t1-a", "work", {"n": 1, "sleep_s": 3.0})),
                        tool_turn(("t1-b", "work", {"n": 2})), Message.assistant("t1 done")])  # fmt: skip
    fleet.script("t2", [tool_turn(("t2-a", "work", {"n": 1})), Message.assistant("t2 done")])
    # As docs/observability.md shows it: LOUSHO_TRACES=otlp OTEL_EXPORTER_OTLP_ENDPOINT=<collector> celery ... worker
    env = {"LOUSHO_TRACES": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.base_url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    for _ in range(2):
        fleet.start_worker(**env)
    with lousho_reaper(fleet, redis_url, env, tmp_path / "reaper.log"):  # the reaper traces too, from its env
        fleet.client.enqueue("jobs", "job t1", session_id="t1")
        with traced_web_app(otlp_receiver) as web, web.start_as_current_span("POST /jobs") as request_span:
            fleet.client.enqueue("jobs", "job t2", session_id="t2")  # in a traced web request; t1 was not
        victim = fleet.worker_with_pid(fleet.pid_running("t1-a"))
        time.sleep(0.5)  # what it finished before (its model turn, maybe) is exported: it dies in t1-a only
        victim.kill(signal.SIGKILL)
        fleet.wait_for(["t1", "t2"])
        wait_for_spans(otlp_receiver, "t1", "lousho.model_turn")
        others = wait_for_spans(otlp_receiver, "t2", "lousho.model_turn")
    spans = otlp_receiver.of_session("t1")  # the reaper has ended: its spans are sent
    requeued = FleetCounters.of(fleet.store).read()["reaper_requeues"]

    # One trace: every span of t1's run shares its id, under one root; t2's run is a trace of its own.
    assert len({s.trace_id for s in spans}) == 1
    assert {s.trace_id for s in others} != {s.trace_id for s in spans} and len({s.trace_id for s in others}) == 1
    (root,) = [s for s in spans if s.name == "lousho.run"]
    assert root.parent_id == "" and root.links == []
    # t2's run is a trace of its own, its root linked to the web request that enqueued it.
    (other_root,) = [s for s in others if s.name == "lousho.run"]
    request = request_span.get_span_context()
    assert other_root.links == [(f"{request.trace_id:032x}", f"{request.span_id:016x}")]
    assert other_root.trace_id != f"{request.trace_id:032x}" and other_root.parent_id == ""
    by_name: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    # A span per model turn, each the root's child (the turns after the first sent through the outbox).
    turns = sorted(by_name["lousho.model_turn"], key=lambda s: s.attributes["lousho.turn"])
    assert [s.attributes["lousho.turn"] for s in turns] == [1, 2, 3]
    assert all(s.parent_id == root.span_id and s.service == "lousho" for s in turns)
    assert [s.attributes["lousho.parent"] for s in turns] == ["run", "header", "header"]
    # The reaper's requeue: a child of the root with its event; the advance it sent is its child (by the header).
    requeues = by_name["lousho.requeue"]
    assert requeued >= 1 and len(requeues) == requeued  # each requeue (all of t1: t2 has none) has its span
    assert not [s for s in others if s.name in ("lousho.requeue", "lousho.advance")]
    assert all(r.parent_id == root.span_id and r.events == ["lousho.reaper.requeued"] for r in requeues)
    assert all(r.service == "test-reaper" for r in requeues)
    advances = by_name["lousho.advance"]
    assert sorted(a.parent_id for a in advances) == sorted(r.span_id for r in requeues)
    assert all(a.attributes["lousho.reason"] == "reaper" for a in advances)
    # The tool calls: the killed start of t1-a never ended (its span died with its worker); its run again is
    # the root's child, with its attempt counted from that first start.
    calls = by_name["lousho.tool_call"]
    assert all(c.parent_id == root.span_id and c.attributes["lousho.parent"] == "header" for c in calls)
    again = sorted((c for c in calls if c.attributes["lousho.tool_call_id"] == "t1-a"),
                   key=lambda c: c.attributes["lousho.attempt"])  # fmt: skip
    assert [c.attributes["lousho.attempt"] for c in again] == list(range(2, 2 + len(again)))
    assert again[-1].attributes["lousho.outcome"] not in NOT_RUN
    assert all(c.attributes["lousho.outcome"] == "running-elsewhere" for c in again[:-1])
    (second,) = [c for c in calls if c.attributes["lousho.tool_call_id"] == "t1-b"]
    assert second.attributes | {"lousho.outcome": ""} == {
        "lousho.session_id": "t1", "lousho.tool_call_id": "t1-b", "lousho.tool": "work", "lousho.turn": 2,
        "lousho.attempt": 1, "lousho.parent": "header", "lousho.outcome": "",
    }  # fmt: skip
    assert fleet.counts("runs")["t1-a"] == 2
    # The run is over: its trace hash is gone, so the session's next run starts a trace of its own.
    assert not fleet.redis.exists(trace_key(fleet.store, "t1"))


def test_prefork_children_export_their_hops_spans_into_the_runs_trace(
    fleet: Fleet, otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    fleet.script("f1", [tool_turn(("f1-a", "work", {"n": 1}), ("f1-b", "work", {"n": 2})), Message.assistant("f1 done")])
    env = {**fleet.env, "LOUSHO_TRACES": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.base_url,
           "OTEL_BSP_SCHEDULE_DELAY": "50"}  # fmt: skip
    worker = start_worker("tests.fleet.fleet_app", queue=fleet.queue, name="prefork", env=env, cwd=ROOT,
                          pool="prefork", concurrency=2, log_dir=str(tmp_path))  # fmt: skip
    try:
        fleet.client.enqueue("jobs", "job f1", session_id="f1")
        fleet.wait_for(["f1"])
    finally:
        worker.stop()  # a warm shutdown: each child flushes what it has not exported yet
    spans = wait_for_spans(otlp_receiver, "f1", "lousho.model_turn", at_least=5)  # the run and its 4 hops

    (root,) = [s for s in spans if s.name == "lousho.run"]
    hops = [s for s in spans if s is not root]
    assert sorted(s.name for s in hops) == ["lousho.model_turn", "lousho.model_turn", "lousho.tool_call", "lousho.tool_call"]
    assert all(s.trace_id == root.trace_id and s.parent_id == root.span_id for s in hops)
    children = {int(p) for p in fleet.redis.hvals(fleet.key("ran-on"))}
    assert children and worker.pid not in children  # the tool calls (and their spans) were the children's
