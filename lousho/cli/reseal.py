"""`lousho reseal`: a session's stored values (or every session's) written again under the current payload key,
each bound to its place (issue #31), through `lousho.operations.reseal` (issue #32; docs/stores.md)."""

from __future__ import annotations

import typer

from lousho.cli.context import target_of
from lousho.operations import reseal_sessions

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command()
    def reseal(
        ctx: typer.Context,
        session: str | None = typer.Argument(None, help="Session id (or --all)."),
        every: bool = typer.Option(False, "--all", help="Every session of the store."),
    ) -> None:
        """Write a session's stored values (or every session's) again under the first payload key, each bound
        to its place: after setting keys on old data (with LOUSHO_PAYLOAD_READ_UNSEALED=1), or before
        retiring an old key."""
        if (session is None) == (not every):
            raise typer.BadParameter("name a session, or pass --all (not both)")
        done = reseal_sessions(target_of(ctx), None if every else [str(session)])
        for session_id, count in done.values.items():
            typer.echo(f"re-sealed {count} values of session {session_id} under key {done.key_id}")
        typer.echo(f"{len(done.values)} session(s) re-sealed under key {done.key_id}")
        typer.echo(f"{done.approvals} approval(s) re-sealed under key {done.key_id}")
