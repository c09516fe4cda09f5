"""`lousho eval --drift A B [--fail-on-drift]`: how runs drift apart (`lousho.operations.drift`, issue #16);
with `--fail-on-drift` any drift exits 1, so a CI job fails on it (issue #32)."""

from __future__ import annotations

from typing import Annotated

import typer

from lousho.cli.context import target_of
from lousho.cli.conventions import USAGE_ERROR
from lousho.cli.exits import FAILED
from lousho.cli.render import print_json
from lousho.operations.drift import drift_report, report_lines

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command(name="eval")
    def eval_(
        ctx: typer.Context,
        a: str = typer.Argument(..., help="A session id, or a group of sessions with * and ? ('trip.fork-*')."),
        b: str = typer.Argument(..., help="Another session id or group."),
        drift: Annotated[
            bool, typer.Option("--drift", help="Report the drift: tool order, arguments, step count, finish reason.")
        ] = False,
        fail_on_drift: bool = typer.Option(
            False, "--fail-on-drift", help="Exit 1 when any pair drifts (for CI); default exit 0 either way."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    ) -> None:
        """How runs drift apart: A against B, or a session against each fork of a group, pair by pair."""
        if not drift:
            raise USAGE_ERROR("eval takes --drift (what to evaluate): lousho eval --drift A B")
        report = drift_report(target_of(ctx, read_only=True), a, b)
        if as_json:
            print_json(report.model_dump(mode="json"))
        else:
            for line in report_lines(report):
                typer.echo(line)
        if fail_on_drift and report.drifted:
            typer.echo(f"error: {report.drifted} of {len(report.pairs)} pair(s) drift (--fail-on-drift)", err=True)
            raise typer.Exit(FAILED)
