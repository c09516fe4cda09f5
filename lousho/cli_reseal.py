"""`lousho reseal`: write a session's stored values again under the current payload key, each bound to its
place (issue #31), so data from before the keys were set, from lousho 0.1 or under a key being retired stops
depending on `LOUSHO_PAYLOAD_READ_UNSEALED` or on the old key (docs/stores.md)."""

from __future__ import annotations

from typing import Any

import typer

from lousho.errors import ConfigurationError

__all__ = ["register"]


def reseal_sessions(store: Any, session_ids: list[str]) -> tuple[str, dict[str, int]]:
    """Re-seal each session's checkpoint, history and messages (`checkpoints.reseal`): the key written with,
    and the values per session."""
    codec, checkpoints = getattr(store, "codec", None), store.checkpoints
    if codec is None or not codec.encrypts:
        raise ConfigurationError(
            "re-sealing needs the payload key to write with: set LOUSHO_PAYLOAD_KEYS (the new key first), and "
            "LOUSHO_PAYLOAD_READ_UNSEALED=1 to read data stored before the keys or by lousho 0.1"
        )
    if not callable(getattr(checkpoints, "reseal", None)):
        raise ConfigurationError(f"{type(checkpoints).__name__} cannot re-seal its values (it has no reseal())")
    return next(iter(codec.keys)), {session_id: checkpoints.reseal(session_id) for session_id in session_ids}


def register(app: typer.Typer) -> None:
    from lousho.cli import settings_of

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
        store = settings_of(ctx).store()
        session_ids = list(store.sessions()) if every else [str(session)]
        key, done = reseal_sessions(store, session_ids)
        for session_id, count in done.items():
            typer.echo(f"re-sealed {count} values of session {session_id} under key {key}")
        typer.echo(f"{len(done)} session(s) re-sealed under key {key}")
