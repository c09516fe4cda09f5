"""`lousho enqueue`, `resume`, `approvals`, `approve`, `abort`: steering jobs on the fleet through `Client`;
`lousho workers`: the live workers, with the lousho and the protocols each speaks (issue #35)."""

from __future__ import annotations

import dataclasses
import json
import time

import typer
from rich.table import Table

from lousho.approvals import ApprovalDecision, decide, parse_decision
from lousho.cli_render import approvals_table, print_json, print_table, report_skipped, short, sync
from lousho.errors import InvalidDecisionError, SessionNotFoundError
from lousho.pausing import check_stored_calls_unchanged
from lousho.stores.listing import Listing

__all__ = ["register"]

_SETTLED = ("finished", "awaiting-approval", "parked")


def register(app: typer.Typer) -> None:
    from lousho.cli import settings_of

    @app.command()
    def enqueue(
        ctx: typer.Context,
        agent: str = typer.Argument(..., help="The agent's name (as the fleet serves it)."),
        input: str = typer.Argument(..., help="The user's message."),
        session: str | None = typer.Option(None, "--session", "-s", help="Session id (default: a new job-... id)."),
        wait: bool = typer.Option(False, "--wait", help="Wait until the run finishes, pauses for approval, or parks."),
        timeout: float = typer.Option(60.0, "--timeout", metavar="SECONDS", help="Seconds --wait waits."),
        as_json: bool = typer.Option(False, "--json", help="Print the session id (with --wait, its status) as JSON."),
        require_worker: bool = typer.Option(
            True,
            "--require-worker/--no-require-worker",
            help="Refuse an agent no live worker serves (default); --no-require-worker enqueues ahead of the workers.",
        ),
    ) -> None:
        """Enqueue a job: prints its session id (with --wait, then its status when it settles; a parked run exits 1).

        An agent that no live worker serves is refused, naming what is served (issue #15)."""
        client = settings_of(ctx).client()
        session_id = client.enqueue(agent, input, session_id=session, require_worker=require_worker)
        if as_json and not wait:
            print_json({"session_id": session_id})
        if not as_json:
            typer.echo(session_id)
        if not wait:
            return
        deadline = time.monotonic() + timeout
        while True:
            status = client.status(session_id)
            if status.status in _SETTLED:
                break
            if time.monotonic() > deadline:
                typer.echo(f"error: [LOUSHO_TIMEOUT] {session_id} is still {status.status} after {timeout}s", err=True)
                raise typer.Exit(2)
            time.sleep(0.1)
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
            raise typer.Exit(1)

    @app.command()
    def resume(ctx: typer.Context, session: str = typer.Argument(..., help="Session id.")) -> None:
        """Wake the fleet on a parked, aborted or forked session (poison counters start over)."""
        client = settings_of(ctx).client()
        if client.checkpoint(session) is None:
            raise SessionNotFoundError(session, repr(client.store))
        client.resume(session)
        typer.echo(f"resumed {session}")

    @app.command()
    def approvals(
        ctx: typer.Context,
        session: str | None = typer.Option(None, "--session", "-s", metavar="SESSION", help="Only this session's."),
        as_json: bool = typer.Option(False, "--json", help="Print the approval snapshots as JSON."),
    ) -> None:
        """Pending approvals: runs paused on a tool call that needs a human's decision (on stderr: those
        that cannot be read)."""
        store = settings_of(ctx).store()
        pending = Listing.of(sync(store.approvals.pending(session)))
        if as_json:
            print_json([snapshot.model_dump(mode="json") for snapshot in pending])
        else:
            print_table(approvals_table(pending))
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
        settings = settings_of(ctx)
        store = settings.store()
        from lousho.stores.redis import RedisStore

        decision = interrupted_decision(approval_id, not reject and action != "fail", note, action, result)
        if isinstance(store, RedisStore):
            snapshot = settings.client().resolve_approval(
                approval_id, approved=decision.approved, note=note, action=decision.action, result=decision.result
            )
            then = "the fleet continues the run"
        else:
            sync(check_stored_calls_unchanged(store.approvals, store.checkpoints, approval_id))  # issue #17
            snapshot = sync(decide(store.approvals, decision))
            then = "the next resume of the session applies it"
        answer = f" ({snapshot.action})" if snapshot.action else ""
        typer.echo(
            f"{snapshot.status}{answer} {snapshot.id} ({snapshot.tool_call.name} of {snapshot.session_id}): {then}"
        )

    @app.command()
    def abort(ctx: typer.Context, session: str = typer.Argument(..., help="Session id.")) -> None:
        """Abort a run on the fleet: the running tool sees its signal, unfinished calls get 'cancelled'."""
        client = settings_of(ctx).client()
        checkpoint = client.checkpoint(session)
        if checkpoint is None:
            raise SessionNotFoundError(session, repr(client.store))
        if checkpoint.status == "awaiting-approval":  # no run to stop: it waits on a human, and goes on waiting
            approval = checkpoint.approval_id
            typer.echo(
                f"{session} is awaiting approval {approval}: no run to abort, nothing changed; it stays awaiting "
                f"approval until `lousho approve {approval}` (or `lousho approve {approval} --reject`)"
            )
            return
        if not client.abort(session):
            typer.echo(f"{session} has no run to abort (it is finished, or unknown): nothing changed")
            return
        typer.echo(f"aborted {session}: it stays in-progress and idle until new input or `lousho resume {session}`")


def interrupted_decision(
    approval_id: str, approved: bool, note: str | None, action: str | None, result: str | None
) -> ApprovalDecision:
    """`lousho approve`'s decision, checked before anything is written: --result is JSON (issue #17)."""
    try:
        parsed = None if result is None else json.loads(result)
    except ValueError as exc:
        raise InvalidDecisionError(
            f"--result must be JSON (a string in quotes: '\"sent\"'); got {result!r:.200}"
        ) from exc
    return parse_decision({"id": approval_id, "approved": approved, "note": note, "action": action, "result": parsed})


def register_workers(app: typer.Typer) -> None:
    from lousho.cli import settings_of

    @app.command()
    def workers(
        ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print the workers as JSON.")
    ) -> None:
        """The live workers: the agents each serves, its queues, its lousho and the protocols it speaks (a fleet
        in a rolling upgrade shows two releases; docs/upgrading.md). The dashboard's fleet page shows the same."""
        live = settings_of(ctx).client().registry.live().workers
        if as_json:
            print_json([dataclasses.asdict(worker) | {"formats": dict(worker.formats or ())} for worker in live])
            return
        table = Table(title=f"{len(live)} live worker(s)")
        for column in ("worker", "agents", "queues", "lousho and protocols"):
            table.add_column(column, overflow="fold")
        for worker in live:
            table.add_row(worker.id, ", ".join(worker.agents), ", ".join(worker.queues), worker.speaks())
        print_table(table)
