"""The `lousho` console script: the CLI's commands (lousho.cli) and `lousho dashboard`, which starts the dashboard's
server. This is the one module that sees both front ends, so that neither imports the other (issue #32); the
dashboard's packages (its extra) load only when its command runs."""

from __future__ import annotations

import typer

from lousho.cli import app, settings_of

__all__ = ["app", "main"]


@app.command()
def dashboard(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; default 127.0.0.1."),
    port: int = typer.Option(8300, "--port", min=0, max=65535, help="Port to listen on; default 8300."),
    read_only: bool = typer.Option(False, "--read-only", help="Show only: every POST (approve, fork, run) is refused."),
) -> None:
    """Serve the sessions dashboard (needs the dashboard extra of lousho): sessions, approvals, history, fleet."""
    from lousho.dashboard.serve import serve_dashboard

    serve_dashboard(settings_of(ctx), host=host, port=port, read_only=read_only)  # issue #19


def main() -> None:
    """The `lousho` console script."""
    app()
