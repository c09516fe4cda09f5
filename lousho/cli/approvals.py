"""`lousho approvals` and `lousho approve`: pending approvals by the call that waits, and deciding them, through
`lousho.operations.approvals` as the dashboard's page does (issue #32)."""

from __future__ import annotations

import typer

from lousho.cli.context import target_of
from lousho.cli.render import approvals_text, print_json, report_skipped
from lousho.operations import decide_approval, pending_approvals

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command()
    def approvals(
        ctx: typer.Context,
        session: str | None = typer.Option(None, "--session", "-s", metavar="SESSION", help="Only this session's."),
        as_json: bool = typer.Option(False, "--json", help="Print the approval snapshots as JSON."),
    ) -> None:
        """Pending approvals: runs paused on a tool call that needs a human's decision (on stderr: those
        that cannot be read)."""
        pending = pending_approvals(target_of(ctx, read_only=True), session)
        if as_json:
            print_json([row.snapshot.model_dump(mode="json") for row in pending])
        else:
            typer.echo(approvals_text(pending))
        report_skipped(pending.skipped, "approval")

    @app.command()
    def approve(
        ctx: typer.Context,
        approval_id: str = typer.Argument(..., help="The approval id (see `lousho approvals`)."),
        reject: bool = typer.Option(False, "--reject", help="Reject the call instead: the model reads the rejection."),
        note: str | None = typer.Option(None, "--note", help="A note the model reads with the decision."),
        action: str | None = typer.Option(
            None, "--action", help="An interrupted call's answer: rerun, record (with --result) or fail."
        ),
        result: str | None = typer.Option(None, "--result", help="With --action record: the call's result, as JSON."),
    ) -> None:
        """Approve (or --reject) a paused tool call; on the fleet the run goes on at once. An interrupted
        call (kind 'interrupted' in `lousho approvals`) takes --action: run it again, record --result, or fail."""
        decided = decide_approval(
            target_of(ctx), approval_id, approved=not reject, note=note, action=action, result=result
        )
        typer.echo(decided.summary)
