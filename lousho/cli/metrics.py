"""`lousho metrics`: serve (or print) the fleet's Prometheus metrics on a host (issue #19).

Prefork Celery workers cannot each serve a port of their own: with `PROMETHEUS_MULTIPROC_DIR` set (the
same folder for every worker process on the host, emptied before they start) each process writes its
metrics there, and one `lousho metrics` per host serves the folder's sum, with the store's gauges
and the fleet's counters (docs/observability.md).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import typer

from lousho.cli.context import settings_of

__all__ = ["register"]


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    @app.command()
    def metrics(
        ctx: typer.Context,
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        port: int = typer.Option(9808, "--port", help="Port to serve /metrics on."),
        multiprocess_dir: str | None = typer.Option(
            None,
            "--multiprocess-dir",
            envvar="PROMETHEUS_MULTIPROC_DIR",
            help="The workers' metrics folder (env: PROMETHEUS_MULTIPROC_DIR).",
        ),
        once: bool = typer.Option(False, "--once", help="Print the metrics once, then exit."),
    ) -> None:
        """Serve /metrics: the workers' (from --multiprocess-dir) and the store's (sessions, approvals, requeues)."""
        from prometheus_client import generate_latest, start_http_server

        from lousho.telemetry.metrics import metrics_registry

        registry = metrics_registry(settings_of(ctx).store(), multiprocess_dir=multiprocess_dir)
        if once:
            typer.echo(generate_latest(registry).decode(), nl=False)
            return
        server, _thread = start_http_server(port, addr=host, registry=registry)
        typer.echo(f"lousho metrics: serving http://{host}:{server.server_port}/metrics", err=True)
        signal.signal(signal.SIGTERM, _stop)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            server.shutdown()
            typer.echo("lousho metrics: stopped", err=True)
