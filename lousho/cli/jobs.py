"""`lousho enqueue`, `resume`, `abort`: steering jobs on the fleet, through `lousho.operations.jobs` (issue #32)."""

from __future__ import annotations

import typer

from lousho.cli.context import fleet_target_of
from lousho.cli.exits import FAILED
from lousho.cli.render import print_json
from lousho.operations import abort_session, enqueue, resume_session, short, wait_until_settled

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command(name="enqueue")
    def enqueue_command(
        ctx: typer.Context,
        agent: str = typer.Argument(..., help="The agent's name (as the fleet serves it)."),
        input: str = typer.Argument(..., help="The user's message."),
        session: str | None = typer.Option(None, "--session", "-s", help="Session id; default a new job-... id."),
        wait: bool = typer.Option(False, "--wait", help="Wait until the run finishes, pauses for approval, or parks."),
        timeout: float = typer.Option(
            60.0, "--timeout", metavar="SECONDS", min=0, help="Seconds --wait waits (then exit 4); default 60."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the session id (with --wait, its status) as JSON."),
        require_worker: bool = typer.Option(
            True,
            "--require-worker/--no-require-worker",
            help="Refuse an agent no live worker serves (default); --no-require-worker enqueues ahead of the workers.",
        ),
    ) -> None:
        """Enqueue a job: prints its session id (with --wait, then its status when it settles; a parked run exits 1).

        An agent that no live worker serves is refused, naming what is served (issue #15)."""
        target = fleet_target_of(ctx)
        session_id = enqueue(target, agent, input, session_id=session, require_worker=require_worker)
        if as_json and not wait:
            print_json({"session_id": session_id})
        if not as_json:
            typer.echo(session_id)
        if not wait:
            return
        status = wait_until_settled(target, session_id, timeout_s=timeout)
        if as_json:
            print_json(status.model_dump(mode="json"))
        else:
            detail = f" approval={status.approval_id}" if status.approval_id else ""
            typer.echo(f"{status.status}{detail} {short(status.text or '', 200)}".rstrip())
        if status.status == "parked":  # no silent parking: the reason, and a failing exit (issue #15)
            typer.echo(
                f"error: {session_id} is parked: {status.parked_reason} (fix that, then `lousho resume {session_id}`)",
                err=True,
            )
            raise typer.Exit(FAILED)

    @app.command()
    def resume(ctx: typer.Context, session: str = typer.Argument(..., help="Session id.")) -> None:
        """Wake the fleet on a parked, aborted or forked session (poison counters start over); says when nothing
        is pending (a finished session, one awaiting approval) and changes nothing then."""
        typer.echo(resume_session(fleet_target_of(ctx), session).message)

    @app.command()
    def abort(ctx: typer.Context, session: str = typer.Argument(..., help="Session id.")) -> None:
        """Abort a run on the fleet: the running tool sees its signal, unfinished calls get 'cancelled'."""
        typer.echo(abort_session(fleet_target_of(ctx), session).message)
