"""`lousho sessions`, `show`, `history`, `fork`, `compare`: looking at runs in any store."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from lousho.checkpoint import Checkpoint, HistoryEntry, get_checkpoint_history, validate_session_id
from lousho.cli_render import (
    console,
    history_table,
    print_json,
    print_table,
    report_skipped,
    sessions_table,
    short,
    sync,
    transcript_table,
    transcript_text,
)
from lousho.cli_status import parked_line, shown_status
from lousho.cli_watch import follow_session, watch_sessions
from lousho.errors import ConfigurationError, SessionNotFoundError
from lousho.settings import LoushoSettings
from lousho.stores.listing import Listing, read_each
from lousho.trajectory import compare_trajectories
from lousho.trajectory import fork as fork_session

__all__ = ["SessionStatusChoice", "register", "session_records", "session_rows"]

SessionStatusChoice = Literal["in-progress", "awaiting-approval", "finished", "parked"]
"""What `sessions --status` takes: anything else is a usage error that lists these (issue #15)."""
JSON_HELP = "Print JSON (whole values, nothing cut) instead of a table."


def _load(store: Any, session_id: str) -> Checkpoint:
    checkpoint: Checkpoint | None = sync(store.checkpoints.load(validate_session_id(session_id)))
    if checkpoint is None:
        raise SessionNotFoundError(session_id, repr(store))
    return checkpoint


def _last_answer(checkpoint: Checkpoint) -> str:
    return next((m.content or "" for m in reversed(checkpoint.messages) if m.role == "assistant" and m.content), "")


def session_rows(settings: LoushoSettings, status: str | None) -> Listing[list[str]]:
    """The rows of the sessions table: one per session; the unreadable ones are named in `skipped` (issue #21)."""
    records = session_records(settings, status)
    return Listing([_cells(record) for record in records], skipped=records.skipped)


def session_records(settings: LoushoSettings, status: str | None) -> Listing[dict[str, Any]]:
    """One record per session (`sessions --json` prints them as they are); a session whose record cannot be
    read is named in `skipped` (issue #21)."""
    from lousho.stores.redis import RedisStore

    store = settings.store()
    if isinstance(store, RedisStore):  # the fleet's view: 'parked' is a status too
        client = settings.client()

        def fleet_row(session_id: str, _: object) -> dict[str, Any]:
            s = client.status(session_id)
            return _row(session_id, s.status, s.agent_name, s.steps, s.messages, s.text or "", s.approval_id) | {
                "parked_reason": s.parked_reason,
                "aborted": s.aborted,
            }

        return _rows(Listing.of(client.sessions(status)), fleet_row)

    def row(session_id: str, _: object) -> dict[str, Any] | None:
        cp: Checkpoint | None = sync(store.checkpoints.load(session_id))
        if cp is None:
            return None
        return _row(
            session_id, cp.status, cp.agent_name, cp.step_index, len(cp.messages), _last_answer(cp), cp.approval_id
        )

    return _rows(Listing.of(sync(store.checkpoints.sessions(status))), row)


def _row(
    session_id: str, status: str, agent: str | None, steps: int, messages: int, answer: str, approval_id: str | None
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "status": status,
        "agent": agent,
        "steps": steps,
        "messages": messages,
        "last_answer": answer,
        "approval_id": approval_id,
        "parked_reason": None,
        "aborted": False,
    }


def _cells(row: dict[str, Any]) -> list[str]:
    """A row as the table shows it (the last answer cut to one line)."""
    counts = [str(row["steps"]), str(row["messages"])]
    last = f"parked: {row['parked_reason']}" if row.get("parked_reason") else row["last_answer"]  # issue #15
    return [row["session_id"], row["status"], row["agent"] or "-", *counts, short(last, 80)]


def _table(records: Sequence[dict[str, Any]]) -> Table:
    return sessions_table([_cells(record) for record in records])


def _rows(sessions: Listing[str], row: Callable[[str, object], dict[str, Any] | None]) -> Listing[dict[str, Any]]:
    """The rows of the listed sessions, skipping those the listing or `row` could not read."""
    rows = read_each(((session_id, None) for session_id in sessions), row, what="session")
    return Listing(rows, skipped={**sessions.skipped, **rows.skipped})


def _tool_results(values: list[str]) -> list[dict[str, Any]]:
    patches = []
    for value in values:
        call_id, sep, raw = value.partition("=")
        if not sep or not call_id:
            raise ConfigurationError(f"--tool-result takes CALL_ID=JSON, not {value!r}")
        try:
            result = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"--tool-result {call_id}: the result is not JSON ({exc.msg}): {raw!r}") from None
        patches.append({"tool_call_id": call_id, "result": result})
    return patches


def register(app: typer.Typer) -> None:
    from lousho.cli import settings_of

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
        interval: float = typer.Option(1.0, "--interval", metavar="SECONDS", help="How often --watch looks."),
    ) -> None:
        """List sessions, with their status and last answer (and, on stderr, those that cannot be read)."""
        if watch:
            settings = settings_of(ctx)
            watch_sessions(lambda: session_records(settings, status), _table, interval=interval, as_json=as_json)
            return
        records = session_records(settings_of(ctx), status)
        if as_json:
            print_json(list(records))
        else:
            print_table(sessions_table([_cells(record) for record in records]))
        report_skipped(records.skipped, "session")

    @app.command()
    def show(
        ctx: typer.Context,
        session: str = typer.Argument(..., help="Session id."),
        full: bool = typer.Option(False, "--full", help="Every message whole, not cut to a line."),
        as_json: bool = typer.Option(False, "--json", help="Print the checkpoint as JSON."),
        follow: bool = typer.Option(
            False, "--follow", "-f", help="Keep printing new messages, whole, until the session finishes (or Ctrl-C)."
        ),
        interval: float = typer.Option(0.5, "--interval", metavar="SECONDS", help="How often --follow looks."),
    ) -> None:
        """A session's transcript (and, on the fleet, why it is parked)."""
        settings = settings_of(ctx)
        store = settings.store()
        checkpoint = _load(store, session)
        if follow:
            follow_session(lambda: _load(store, session), interval=interval)
            return
        if as_json:
            print_json(checkpoint.model_dump(mode="json"))
            return
        status, parked = shown_status(settings, store, checkpoint)  # the status `sessions` shows (issue #15)
        if full:
            typer.echo(transcript_text(checkpoint, status))
        else:
            console().print(transcript_table(checkpoint, f"{session} ({status}, step {checkpoint.step_index})"))
        if parked is not None:
            typer.echo(parked_line(session, parked))
        if checkpoint.approval_id:  # echoed, not printed by rich: a long id is never wrapped (issue #15)
            typer.echo(f"waiting on approval {checkpoint.approval_id}: lousho approve {checkpoint.approval_id}")
        if checkpoint.parent_session_id:  # a sub-agent's session (issue #14)
            typer.echo(
                f"a sub-agent of session {checkpoint.parent_session_id}: lousho show {checkpoint.parent_session_id}"
            )

    @app.command()
    def history(
        ctx: typer.Context,
        session: str = typer.Argument(..., help="Session id."),
        limit: int | None = typer.Option(None, "--limit", help="Newest N saves only."),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    ) -> None:
        """A session's saves, newest first, each with its number: fork from one with `fork --from-save SAVE`."""
        store = settings_of(ctx).store()
        _load(store, session)
        entries = asyncio_run_history(store, session, limit)
        if as_json:
            print_json([_save_of(entry) for entry in entries])
        else:
            print_table(history_table(session, entries))

    @app.command()
    def fork(
        ctx: typer.Context,
        session: str = typer.Argument(..., help="The session to fork."),
        from_save: int | None = typer.Option(
            None, "--from-save", metavar="SAVE", help="The save (see `lousho history`) to start from."
        ),
        from_step: int | None = typer.Option(
            None, "--from-step", metavar="STEP", help="Or a step: its newest save (the command says which)."
        ),
        tool_result: Annotated[
            list[str] | None,
            typer.Option("--tool-result", metavar="CALL_ID=JSON", help="Replace (or record) that call's result."),
        ] = None,
        append_input: Annotated[
            list[str] | None,
            typer.Option("--append-input", metavar="TEXT", help="User input queued after the pending calls."),
        ] = None,
        new_session_id: str | None = typer.Option(
            None, "--new-session-id", metavar="SESSION", help="Default: SESSION.fork-N."
        ),
        run: bool = typer.Option(False, "--run", help="On the fleet: start the fork at once."),
        as_json: bool = typer.Option(False, "--json", help="Print the new session, its source and save as JSON."),
    ) -> None:
        """Start a new session from a save of a session's history, optionally patched. The source is untouched."""
        settings = settings_of(ctx)
        store = settings.store()
        if (from_step is None) == (from_save is None):
            raise ConfigurationError("fork takes --from-step or --from-save (one of them; see `lousho history`)")
        patch = _patch(tool_result, append_input)
        saves = [] if from_save is not None else _saves_of_step(store, session, from_step)
        forked = sync(
            fork_session(
                session_id=session,
                from_step=None if saves else from_step,
                from_save=saves[-1] if saves else from_save,
                checkpoint_store=store.checkpoints,
                patch=patch,
                new_session_id=new_session_id,
            )
        )
        if len(saves) > 1:  # said, not chosen silently (issue #15)
            typer.echo(
                f"note: step {from_step} has saves {', '.join(map(str, saves))}; forked the newest, save {saves[-1]} "
                "(take another with --from-save SAVE; see `lousho history`)",
                err=True,
            )
        then = _start_fork(settings, store, forked.session_id, run)
        if as_json:
            print_json(
                {"session_id": forked.session_id, "forked_from": session, "save": forked.save, "step": forked.step}
            )
            return
        typer.echo(forked.session_id)
        typer.echo(f"forked {session} at step {forked.step} (save {forked.save}); {then}")

    @app.command()
    def compare(
        ctx: typer.Context,
        a: str = typer.Argument(..., help="A session id."),
        b: str = typer.Argument(..., help="Another session id."),
        as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    ) -> None:
        """Where two runs diverged, step by step (tool order, arguments, results, step count)."""
        store = settings_of(ctx).store()
        comparison = compare_trajectories(_load(store, a), _load(store, b))
        if as_json:
            print_json(comparison.model_dump(mode="json"))
            return
        typer.echo(f"a = {a}\nb = {b}")
        typer.echo(comparison.describe())


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


def _saves_of_step(store: Any, session_id: str, step: int | None) -> list[int]:
    """The saves of a step, oldest first: `--from-step` takes the newest; when a step has several (the model's
    turn, then each tool result), the command says which one it took (issue #15)."""
    entries = sync(get_checkpoint_history(store.checkpoints, validate_session_id(session_id))) or []
    return sorted(entry.checkpoint.version for entry in entries if entry.step == step)


def _patch(tool_result: list[str] | None, append_input: list[str] | None) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    results = _tool_results(tool_result or [])
    if results:
        patch["tool_result"] = results
    if append_input:
        patch["append_input"] = list(append_input)
    return patch


def _start_fork(settings: LoushoSettings, store: Any, session_id: str, run: bool) -> str:
    """On the fleet, start the fork now (`--run`) or keep the reaper off it; say what runs it next."""
    from lousho.stores.redis import RedisStore

    if not isinstance(store, RedisStore):
        return f"resume it with agent.resume({session_id!r})"
    if run:
        settings.client().resume(session_id)
        return "the fleet runs it now"
    from lousho.fleet.inflight import InflightIndex

    InflightIndex.of(store, settings.fleet.lease_ttl_ms).drop(session_id)  # not running: the reaper leaves it alone
    return f"start it with `lousho resume {session_id}`"


def asyncio_run_history(store: Any, session_id: str, limit: int | None) -> list[Any]:
    entries = sync(get_checkpoint_history(store.checkpoints, session_id, limit))
    if entries is None:
        raise ConfigurationError(f"{store!r} keeps no history")
    return list(entries)
