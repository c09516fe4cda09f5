"""`lousho sessions`, `show`, `history`, `fork`, `compare`: looking at runs in any store."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

from lousho.checkpoint import Checkpoint, get_checkpoint_history, validate_session_id
from lousho.cli_render import console, history_table, report_skipped, sessions_table, short, sync, transcript_table
from lousho.errors import ConfigurationError
from lousho.settings import LoushoSettings
from lousho.stores.listing import Listing, read_each
from lousho.trajectory import compare_trajectories
from lousho.trajectory import fork as fork_session

__all__ = ["register"]


def _load(store: Any, session_id: str) -> Checkpoint:
    checkpoint: Checkpoint | None = sync(store.checkpoints.load(validate_session_id(session_id)))
    if checkpoint is None:
        raise ConfigurationError(f"no session {session_id!r} in {store!r}; list them with `lousho sessions`")
    return checkpoint


def _last_answer(checkpoint: Checkpoint) -> str:
    return next((m.content or "" for m in reversed(checkpoint.messages) if m.role == "assistant" and m.content), "")


def session_rows(settings: LoushoSettings, status: str | None) -> Listing[list[str]]:
    """One row per session; a session whose record cannot be read is named in `skipped` (issue #21)."""
    from lousho.stores.redis import RedisStore

    store = settings.store()
    if isinstance(store, RedisStore):  # the fleet's view: 'parked' is a status too
        client = settings.client()

        def fleet_row(session_id: str, _: object) -> list[str]:
            s = client.status(session_id)
            return [session_id, s.status, s.agent_name or "-", str(s.steps), str(s.messages), short(s.text or "", 80)]

        return _rows(Listing.of(client.sessions(status)), fleet_row)

    def row(session_id: str, _: object) -> list[str] | None:
        checkpoint: Checkpoint | None = sync(store.checkpoints.load(session_id))
        if checkpoint is None:
            return None
        steps, messages = str(checkpoint.step_index), str(len(checkpoint.messages))
        answer = short(_last_answer(checkpoint), 80)
        return [session_id, checkpoint.status, checkpoint.agent_name or "-", steps, messages, answer]

    return _rows(Listing.of(sync(store.checkpoints.sessions(status))), row)


def _rows(sessions: Listing[str], row: Callable[[str, object], list[str] | None]) -> Listing[list[str]]:
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
        status: str | None = typer.Option(None, "--status", help="in-progress, awaiting-approval, finished or parked."),
    ) -> None:
        """List sessions, with their status and last answer (and, on stderr, those that cannot be read)."""
        rows = session_rows(settings_of(ctx), status)
        console().print(sessions_table(rows))
        report_skipped(rows.skipped, "session")

    @app.command()
    def show(ctx: typer.Context, session: str = typer.Argument(..., help="Session id.")) -> None:
        """A session's transcript."""
        checkpoint = _load(settings_of(ctx).store(), session)
        out = console()
        out.print(transcript_table(checkpoint))
        if checkpoint.approval_id:
            out.print(f"waiting on approval {checkpoint.approval_id}: lousho approve {checkpoint.approval_id}")

    @app.command()
    def history(
        ctx: typer.Context,
        session: str = typer.Argument(..., help="Session id."),
        limit: int | None = typer.Option(None, "--limit", help="Newest N saves only."),
    ) -> None:
        """A session's saves, newest first (each one a step you can fork from)."""
        store = settings_of(ctx).store()
        _load(store, session)
        entries = asyncio_run_history(store, session, limit)
        console().print(history_table(session, entries))

    @app.command()
    def fork(
        ctx: typer.Context,
        session: str = typer.Argument(..., help="The session to fork."),
        from_step: int = typer.Option(..., "--from-step", help="The step (see `lousho history`) to start from."),
        tool_result: Annotated[
            list[str] | None,
            typer.Option("--tool-result", help="CALL_ID=JSON: replace (or record) that call's result."),
        ] = None,
        append_input: Annotated[
            list[str] | None, typer.Option("--append-input", help="User input queued after the pending calls.")
        ] = None,
        new_session_id: str | None = typer.Option(None, "--new-session-id", help="Default: <session>.fork-<n>."),
        run: bool = typer.Option(False, "--run", help="On the fleet: start the fork at once."),
    ) -> None:
        """Start a new session from a step of a session's history, optionally patched. The source is untouched."""
        from lousho.stores.redis import RedisStore

        settings = settings_of(ctx)
        store = settings.store()
        patch: dict[str, Any] = {}
        results = _tool_results(tool_result or [])
        if results:
            patch["tool_result"] = results
        if append_input:
            patch["append_input"] = list(append_input)
        forked = sync(
            fork_session(
                session_id=session,
                from_step=from_step,
                checkpoint_store=store.checkpoints,
                patch=patch,
                new_session_id=new_session_id,
            )
        )
        typer.echo(forked.session_id)
        if isinstance(store, RedisStore):
            if run:
                settings.client().resume(forked.session_id)
                typer.echo(f"forked {session} at step {forked.step}; the fleet runs it now")
                return
            from lousho.fleet.inflight import InflightIndex

            inflight = InflightIndex.of(store, settings.fleet.lease_ttl_ms)
            inflight.drop(forked.session_id)  # not running: the reaper leaves it alone
            typer.echo(f"forked {session} at step {forked.step}; start it with `lousho resume {forked.session_id}`")
        else:
            typer.echo(f"forked {session} at step {forked.step}; resume it with agent.resume({forked.session_id!r})")

    @app.command()
    def compare(
        ctx: typer.Context,
        a: str = typer.Argument(..., help="A session id."),
        b: str = typer.Argument(..., help="Another session id."),
    ) -> None:
        """Where two runs diverged, step by step (tool order, arguments, results, step count)."""
        store = settings_of(ctx).store()
        comparison = compare_trajectories(_load(store, a), _load(store, b))
        typer.echo(f"a = {a}\nb = {b}")
        typer.echo(comparison.describe())


def asyncio_run_history(store: Any, session_id: str, limit: int | None) -> list[Any]:
    entries = sync(get_checkpoint_history(store.checkpoints, session_id, limit))
    if entries is None:
        raise ConfigurationError(f"{store!r} keeps no history")
    return list(entries)
