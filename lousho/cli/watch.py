"""`lousho sessions --watch` and `lousho show --follow`: the same views, live, as `kubectl get -w` and
`docker logs -f` (issue #15). Both poll the store every `interval` seconds (any store: none of them
pushes changes) and end on Ctrl-C with status 0; `--follow` also ends when the session finishes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import typer
from rich.live import Live
from rich.table import Table

from lousho.checkpoint import Checkpoint
from lousho.cli.render import console, message_whole, print_table

__all__ = ["follow_session", "watch_sessions"]


def watch_sessions(
    read: Callable[[], Sequence[dict[str, Any]]],
    table: Callable[[Sequence[dict[str, Any]]], Table],
    *,
    interval: float,
    as_json: bool,
) -> None:
    """Print the sessions, then again each time they change: the table redrawn in place on a terminal, a new
    table (or with `as_json`, one JSON line) per change elsewhere, so a pipe or a log reads every state."""
    out = console()
    try:
        if out.is_terminal and not as_json:
            with Live(table(read()), console=out, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(table(read()), refresh=True)
        last: list[dict[str, Any]] | None = None
        while True:
            records = list(read())
            if records != last:
                if as_json:
                    typer.echo(json.dumps(records, ensure_ascii=False, default=str))
                else:
                    print_table(table(records))
                last = records
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def follow_session(load: Callable[[], Checkpoint], *, interval: float) -> None:
    """Print the session's messages whole, then each new one as it is saved, and each change of status; end
    when the session is finished (or on Ctrl-C)."""
    shown, status = 0, ""
    try:
        while True:
            checkpoint = load()
            if len(checkpoint.messages) < shown:  # deleted and started again (or forked over): from the top
                typer.echo(f"-- {checkpoint.session_id} started again")
                shown = 0
            for index in range(shown, len(checkpoint.messages)):
                message = checkpoint.messages[index]
                typer.echo(message_whole(f"#{index} {message.role}", message))
            shown = len(checkpoint.messages)
            if checkpoint.status != status:
                status = checkpoint.status
                typer.echo(f"-- {_status_line(checkpoint)}")
            if status == "finished":
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def _status_line(checkpoint: Checkpoint) -> str:
    if checkpoint.status == "awaiting-approval" and checkpoint.approval_id:
        approval = checkpoint.approval_id
        return f"awaiting approval {approval}: lousho approve {approval} (following on)"
    return f"{checkpoint.status}, step {checkpoint.step_index}"
