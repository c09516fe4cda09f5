"""`/metrics` on the dashboard and any ASGI app, the switches that turn telemetry on, the optional extras, and
docs/observability.md's examples (issue #19)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from lousho import ToolContext, create_agent, define_tool, memory_store
from lousho.dashboard import create_dashboard
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.redis import RedisStore
from lousho.telemetry import hooks
from lousho.telemetry.extras import MissingExtraError
from lousho.telemetry.metrics import metrics_registry
from lousho.worker import broker_url, create_app
from tests.docs.walkthrough import python_blocks

ROOT_PATH = Path(__file__).resolve().parents[2]


class Amount(BaseModel):
    amount: int


async def charge(args: Amount, ctx: ToolContext) -> dict[str, int]:
    return {"charged": args.amount}


def scraped(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_the_dashboards_metrics_show_a_stores_sessions_by_status_and_its_approvals_waiting() -> None:
    store = memory_store()
    tool = define_tool(name="charge", description="Charge", input=Amount, execute=charge, needs_approval=True)
    provider = ScriptedProvider(["Hello.", tool_calls(("c1", "charge", {"amount": 5}))])
    agent = create_agent(provider=provider, store=store, name="shop", model="m", instructions="Sell.", tools=[tool])
    await agent.send("hi", session_id="greeted")
    await agent.send("charge me", session_id="paying")
    assert store.sessions(status="awaiting-approval") == ["paying"]

    reply = TestClient(create_dashboard(store, read_only=True)).get("/metrics/")

    assert reply.status_code == 200
    metrics = scraped(reply.text)
    assert metrics[("lousho_sessions", (("status", "finished"),))] == 1
    assert metrics[("lousho_sessions", (("status", "awaiting-approval"),))] == 1
    assert metrics[("lousho_sessions", (("status", "in-progress"),))] == 0
    assert metrics[("lousho_approvals_waiting", ())] == 1
    assert metrics[("lousho_approval_oldest_age_seconds", ())] >= 0
    assert not any(name.startswith("lousho_sessions_in_flight") for name, _ in metrics)  # a fleet's only


def _connected(signal: Any) -> set[str]:
    return {str(key[0]) for key, _ in signal.receivers}


def test_metrics_and_traces_are_off_unless_the_environment_turns_them_on(
    redis_url: str, redis_client: redis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery import signals

    for name in ("LOUSHO_METRICS", "LOUSHO_TRACES", "LOUSHO_METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    hooks.disable()
    agent = create_agent(provider=ScriptedProvider(["ok"]), name="quiet", model="m", instructions="i")
    apps = []
    try:
        apps.append(create_app(agents=[agent], store=RedisStore(redis_client, prefix=redis_prefix), broker=broker_url(redis_url)))
        assert not {"lousho-telemetry-prerun", "lousho-telemetry-postrun"} & _connected(signals.task_prerun)
        assert "lousho-telemetry-publish" not in _connected(signals.before_task_publish)

        monkeypatch.setenv("LOUSHO_METRICS", "1")
        apps.append(create_app(agents=[agent], store=RedisStore(redis_client, prefix=redis_prefix), broker=broker_url(redis_url)))
        assert "lousho-telemetry-prerun" in _connected(signals.task_prerun)
        assert "lousho-telemetry-postrun" in _connected(signals.task_postrun)
        assert "lousho-telemetry-publish" not in _connected(signals.before_task_publish)  # traces are still off
    finally:
        hooks.disable()
        for app in apps:
            app.lousho_runtime.close()
            app.close()
    assert "lousho-telemetry-prerun" not in _connected(signals.task_prerun)


@pytest.mark.parametrize(
    ("module", "package", "extra"),
    [("lousho.telemetry.metrics", "prometheus_client", "metrics"), ("lousho.telemetry.traces", "opentelemetry", "otel")],
)
def test_without_its_extra_a_telemetry_module_says_which_to_install(
    module: str, package: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # as if it were not installed: importing it fails
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(MissingExtraError, match=rf"pip install 'lousho\[{extra}\]'") as raised:
        importlib.import_module(module)
    assert isinstance(raised.value, ModuleNotFoundError) and raised.value.name == package


def test_without_prometheus_client_the_dashboard_serves_its_pages_and_no_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "lousho.telemetry.metrics", raising=False)
    client = TestClient(create_dashboard(memory_store(), read_only=True))
    assert client.get("/metrics/").status_code == 404
    assert client.get("/").status_code == 200


def test_the_observability_pages_python_examples_run_as_shown() -> None:
    page = ROOT_PATH / "docs" / "observability.md"
    mount, tracing = [block for block in python_blocks(page) if "lousho.telemetry" in block]
    namespace: dict[str, Any] = {}
    exec(compile(mount, "observability.md (metrics)", "exec"), namespace)
    reply = TestClient(namespace["app"]).get("/metrics/")
    assert reply.status_code == 200 and "lousho_sessions" in reply.text
    exec(compile(tracing, "observability.md (traces)", "exec"), {})
    from celery import signals

    assert "lousho-telemetry-publish" not in _connected(signals.before_task_publish)  # it ends with disable()


def test_lousho_metrics_once_prints_the_stores_metrics(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lousho.cli import app
    from lousho.stores.sql import SqliteStore
    from lousho.testing.store_contract import sample_checkpoint

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SqliteStore(str(tmp_path / "runs.db"))
    store.checkpoints.save("one", sample_checkpoint("one", status="finished"))
    store.close()
    env = {"LOUSHO_REDIS_URL": None, "REDIS_URL": None, "LOUSHO_PREFIX": None, "PROMETHEUS_MULTIPROC_DIR": None}
    result = CliRunner().invoke(app, ["--store-url", url, "metrics", "--once"], env=env)
    assert result.exit_code == 0, (result.output, result.exception)
    metrics = scraped(result.output)
    assert metrics[("lousho_sessions", (("status", "finished"),))] == 1
    assert metrics[("lousho_approvals_waiting", ())] == 0


def test_a_client_in_a_process_with_lousho_traces_sends_its_callers_span(
    redis_url: str, redis_client: redis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery import signals

    from lousho.scheduler import Client

    hooks.disable()
    monkeypatch.setenv("LOUSHO_TRACES", "console")
    client = Client(broker=broker_url(redis_url), store=RedisStore(redis_client, prefix=redis_prefix))
    try:
        assert "lousho-telemetry-publish" in _connected(signals.before_task_publish)
    finally:
        from lousho.telemetry.traces import current_provider

        provider = current_provider()  # the one LOUSHO_TRACES=console made
        hooks.disable()
        shutdown = getattr(provider, "shutdown", None)
        if shutdown is not None:
            shutdown()
        client.app.close()


def test_a_scrape_skips_a_workers_metrics_file_that_is_still_empty(tmp_path: Path) -> None:
    """A worker creates its metrics file, then sizes it: a scrape in between, or for ever after a worker killed in
    that moment, found a 0-byte file and failed whole (prometheus/client_python#1199; a loaded CI run, issue #33).
    The empty file is skipped, and the other workers' figures are served."""
    record = "from lousho.telemetry.metrics import observe_step; observe_step('model_turn', 'finished', 0.2)"
    subprocess.run([sys.executable, "-c", record], env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
                   check=True, timeout=60)  # fmt: skip
    (tmp_path / "histogram_4194305.db").touch()  # a worker killed between creating its file and sizing it

    scraped = generate_latest(metrics_registry(multiprocess_dir=str(tmp_path))).decode()

    families = {f.name: f for f in text_string_to_metric_families(scraped)}
    counts = [s.value for s in families["lousho_step_seconds"].samples if s.name == "lousho_step_seconds_count"]
    assert counts == [1.0]
