"""`lousho sessions`, `show`, `history`, `fork`, `compare`, `delete`, `prune`: looking at runs in any store,
forking them and cleaning up; each renders an operation of `lousho.operations` (issue #32)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.table import Table

from lousho.checkpoint import HistoryEntry
from lousho.cli.context import target_of
from lousho.cli.conventions import USAGE_ERROR
from lousho.cli.render import (
    history_table,
    print_json,
    print_table,
    report_skipped,
    session_cells,
    sessions_table,
    transcript_table,
    transcript_text,
)
from lousho.cli.watch import follow_session, follow_stream, watch_sessions
from lousho.errors import ConfigurationError
from lousho.operations import (
    Deleted,
    ForkRequest,
    SessionRow,
    compare_sessions,
    delete_sessions,
    fork,
    latest_event_id,
    list_sessions,
    load_session,
    prune_sessions,
    session_events,
    session_history,
    show_session,
)
from lousho.operations.forking import parse_tool_result
from lousho.operations.sessions import SessionStatusChoice
from lousho.operations.text import parse_age as parse_age_text

__all__ = ["parse_age", "register", "session_record"]

JSON_HELP = "Print JSON (whole values, nothing cut) instead of a table."


def session_record(row: SessionRow) -> dict[str, Any]:
    """A session as `sessions --json` prints it."""
    return {
        "session_id": row.session_id,
        "status": row.status,
        "agent": row.agent,
        "steps": row.steps,
        "messages": row.messages,
        "approval_id": row.approval_id,
        "parked_reason": row.parked_reason,
        "aborted": row.aborted,
        "parent_session_id": row.parent_session_id,
        "saved_at": row.saved_at,
    }


def parse_age(value: str) -> timedelta:
    """`lousho.operations.text.parse_age`, a usage error when it is not an age."""
    try:
        return parse_age_text(value)
    except ConfigurationError as exc:
        raise USAGE_ERROR(str(exc.args[0])) from None


def _tool_results(ctx: typer.Context, param: Any, values: list[str] | None) -> list[dict[str, Any]]:
    """`--tool-result CALL_ID=JSON`, read as the command line is parsed: a bad one is a usage error (exit 2)."""
    try:
        return [parse_tool_result(value) for value in values or []]
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc.args[0])) from None


def register(app: typer.Typer) -> None:
    @app.command()
    def sessions(
        ctx: typer.Context,
        status: Annotated[
            SessionStatusChoice | None, typer.Option("--status", help="Only the sessions of this status.")
        ] = None,
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
        watch: bool = typer.Option(
            False, "--watch", "-w", help="Keep watching: print again on each change (Ctrl-C ends)."
        ),
        interval: float = typer.Option(
            1.0, "--interval", metavar="SECONDS", min=0.05, help="How often --watch looks; default 1."
        ),
    ) -> None:
        """List sessions, newest save first, with their status and age (and, on stderr, those that cannot be read)."""
        target = target_of(ctx, read_only=True)

        def records() -> list[dict[str, Any]]:
            return [session_record(row) for row in list_sessions(target, status).rows]

        if watch:
            watch_sessions(records, _table, interval=interval, as_json=as_json)
            return
        rows = list_sessions(target, status).rows
        if as_json:
            print_json([session_record(row) for row in rows])
        else:
            print_table(sessions_table([session_cells(row) for row in rows]))
        report_skipped(rows.skipped, "session")

    @app.command()
    def show(
        ctx: typer.Context,
        session: str = typer.Argument(..., help="Session id."),
        full: bool = typer.Option(False, "--full", help="Every message whole, not cut to a line."),
        as_json: bool = typer.Option(False, "--json", help="Print the checkpoint as JSON."),
        follow: bool = typer.Option(
            False,
            "--follow",
            "-f",
            help="Keep printing new messages, whole, until the session finishes (or Ctrl-C); on a fleet, the model's text as it streams.",
        ),
        interval: float = typer.Option(
            0.5, "--interval", metavar="SECONDS", min=0.05, help="How often --follow looks; default 0.5."
        ),
    ) -> None:
        """A session's transcript (and, on the fleet, why it is parked)."""
        target = target_of(ctx, read_only=True)
        view = show_session(target, session)
        checkpoint = view.checkpoint
        if follow:
            after = latest_event_id(target, session)  # before the first look: nothing after it is missed
            if after is None:  # no fleet: no event stream, the saves are looked at every `interval`
                follow_session(lambda: load_session(target, session), interval=interval)
            else:
                follow_stream(
                    lambda: load_session(target, session),
                    lambda since: session_events(target, session, since) or [],
                    after,
                    interval=interval,
                )
            return
        if as_json:
            print_json(checkpoint.model_dump(mode="json"))
            return
        if full:
            typer.echo(transcript_text(checkpoint, view.status))
        else:
            title = f"{session} ({view.status}, step {checkpoint.step_index})"
            print_table(transcript_table(checkpoint, title))
        if view.parked_reason is not None:
            typer.echo(f"parked: {view.parked_reason} (fix that, then `lousho resume {session}`)")
        if checkpoint.approval_id:  # echoed, not printed by rich: a long id is never wrapped (issue #15)
            typer.echo(f"waiting on approval {checkpoint.approval_id}: lousho approve {checkpoint.approval_id}")
        if checkpoint.parent_session_id:  # a sub-agent's session (issue #14)
            parent = checkpoint.parent_session_id
            typer.echo(f"a sub-agent of session {parent}: lousho show {parent}")
        if view.forked_from is not None:  # issue #32
            origin = view.forked_from
            typer.echo(f"forked from {origin.session_id} at step {origin.step} (save {origin.save})")

    @app.command()
    def history(
        ctx: typer.Context,
        session: str = typer.Argument(..., help="Session id."),
        limit: int | None = typer.Option(None, "--limit", min=1, help="Newest N saves only; default all kept."),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    ) -> None:
        """A session's saves, newest first, each with its number: fork from one with `fork --from-save SAVE`."""
        entries = session_history(target_of(ctx, read_only=True), session, limit)
        if as_json:
            print_json([_save_of(entry) for entry in entries])
        else:
            print_table(history_table(session, entries))

    @app.command(name="fork")
    def fork_command(
        ctx: typer.Context,
        session: str = typer.Argument(..., help="The session to fork."),
        from_save: int | None = typer.Option(
            None, "--from-save", metavar="SAVE", min=0, help="The save (see `lousho history`) to start from."
        ),
        from_step: int | None = typer.Option(
            None, "--from-step", metavar="STEP", min=0, help="Or a step: its newest save (the command says which)."
        ),
        tool_result: Annotated[
            list[str] | None,
            typer.Option(
                "--tool-result",
                metavar="CALL_ID=JSON",
                callback=_tool_results,
                help="Replace (or record) that call's result.",
            ),
        ] = None,
        append_input: Annotated[
            list[str] | None,
            typer.Option("--append-input", metavar="TEXT", help="User input queued after the pending calls."),
        ] = None,
        new_session_id: str | None = typer.Option(
            None, "--new-session-id", metavar="SESSION", help="The fork's id; default SESSION.fork-N."
        ),
        run: bool = typer.Option(False, "--run", help="On the fleet: start the fork at once."),
        as_json: bool = typer.Option(False, "--json", help="Print the new session, its source and save as JSON."),
    ) -> None:
        """Start a new session from a save of a session's history, optionally patched. The source is untouched;
        the fork records where it came from (`lousho show` says)."""
        if (from_step is None) == (from_save is None):
            raise USAGE_ERROR("fork takes --from-step or --from-save (one of them; see `lousho history`)")
        request = ForkRequest(
            session_id=session,
            from_save=from_save,
            from_step=from_step,
            tool_results=tool_result or [],  # type: ignore[arg-type]  # the callback made them patch entries
            append_input=append_input or [],
            new_session_id=new_session_id,
            run=run,
        )
        forked = fork(target_of(ctx), request)
        if forked.other_saves:  # said, not chosen silently (issue #15)
            saves = ", ".join(map(str, forked.other_saves))
            typer.echo(
                f"note: step {from_step} has saves {saves}; forked the newest, save {forked.save} "
                "(take another with --from-save SAVE; see `lousho history`)",
                err=True,
            )
        if as_json:
            record = {"session_id": forked.session_id, "forked_from": session, "save": forked.save}
            print_json({**record, "step": forked.step})
            return
        typer.echo(forked.session_id)
        typer.echo(f"forked {session} at step {forked.step} (save {forked.save}); {forked.then}")

    @app.command()
    def compare(
        ctx: typer.Context,
        a: str = typer.Argument(..., help="A session id."),
        b: str = typer.Argument(..., help="Another session id."),
        as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    ) -> None:
        """Where two runs diverged, step by step (tool order, arguments, results, step count)."""
        comparison = compare_sessions(target_of(ctx, read_only=True), a, b)
        if as_json:
            print_json(comparison.model_dump(mode="json"))
            return
        typer.echo(f"a = {a}\nb = {b}")
        typer.echo(comparison.describe())

    @app.command()
    def delete(
        ctx: typer.Context,
        session: Annotated[list[str], typer.Argument(..., help="The sessions to delete (one or more ids).")],
        dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be deleted; delete nothing."),
        force: bool = typer.Option(
            False, "--force", help="Delete a session a worker is running too: abort its run first, then delete it."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print what was deleted as JSON."),
    ) -> None:
        """Delete sessions: checkpoint, history, the approvals they paused on and, on the fleet, every key the
        fleet keeps for them. Every id is checked first: an unknown one deletes nothing (exit 3), nor does a
        session a worker is running (exit 1) unless --force, which aborts its run first."""
        _report(delete_sessions(target_of(ctx), list(session), dry_run=dry_run, force=force), as_json)

    @app.command()
    def prune(
        ctx: typer.Context,
        status: Annotated[
            SessionStatusChoice, typer.Option("--status", help="The sessions of this status (required).")
        ],
        older_than: str = typer.Option(
            ..., "--older-than", metavar="AGE", help="Last saved longer ago than this: 30s, 15m, 12h, 7d, 2w."
        ),
        dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be deleted; delete nothing."),
        as_json: bool = typer.Option(False, "--json", help="Print what was deleted and kept as JSON."),
    ) -> None:
        """Delete the sessions of a status last saved longer ago than an age: a Ctrl-C'd run left in-progress,
        a job no worker serves, finished runs past their keep. A session a worker is running is kept (and said)."""
        age = parse_age(older_than)
        _report(prune_sessions(target_of(ctx), status, age, dry_run=dry_run), as_json)


def deleted_record(deleted: Deleted) -> dict[str, Any]:
    """What `delete --json` and `prune --json` print."""
    return {
        "dry_run": deleted.dry_run,
        "deleted": deleted.sessions,
        "aborted": deleted.aborted,
        "kept": [
            {"session_id": session_id, "reason": why.code, "why": why.explanation}
            for session_id, why in deleted.kept.items()
        ],
    }


def _report(deleted: Deleted, as_json: bool = False) -> None:
    if as_json:
        print_json(deleted_record(deleted))
        return
    dry = deleted.dry_run
    for session_id, why in deleted.kept.items():
        typer.echo(f"kept {session_id}: it is live, {why.explanation} ({why.code})")
    for session_id in deleted.aborted:
        typer.echo(f"would abort the run of {session_id} first" if dry else f"aborted the run of {session_id}")
    verb = "would delete" if dry else "deleted"
    for session_id in deleted.sessions:
        typer.echo(f"{verb} {session_id}")
    kept = f", kept {len(deleted.kept)} live" if deleted.kept else ""
    typer.echo(f"{verb} {len(deleted.sessions)} session(s){kept}{' (dry run: nothing changed)' if dry else ''}")


def _table(records: Sequence[dict[str, Any]]) -> Table:
    return sessions_table([session_cells(SessionRow(**record)) for record in records])


def _save_of(entry: HistoryEntry) -> dict[str, Any]:
    """A history entry as `history --json` prints it: its address (`save`) first."""
    messages = entry.checkpoint.messages
    return {
        "save": entry.checkpoint.version,
        "step": entry.step,
        "saved_at": entry.saved_at,
        "status": entry.status,
        "messages": len(messages),
        "last_message": messages[-1].model_dump(mode="json") if messages else None,
    }
