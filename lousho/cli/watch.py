"""`lousho sessions --watch` and `lousho show --follow`: the same views, live, as `kubectl get -w` and
`docker logs -f` (issue #15). Both poll the store every `interval` seconds, and end on Ctrl-C with status 0;
`--follow` also ends when the session finishes. On a fleet `--follow` reads the session's event stream instead
of polling: the model's text appears as it is written (issue #34)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import typer
from rich.live import Live
from rich.table import Table

from lousho.checkpoint import Checkpoint
from lousho.cli.render import console, message_whole, print_table
from lousho.operations import describe_event

if TYPE_CHECKING:
    from lousho.fleet.events import SessionEvent

__all__ = ["SavedPrinter", "follow_session", "follow_stream", "watch_sessions"]


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


class SavedPrinter:
    """Prints a session's saved messages whole, each once, and each change of its status."""

    def __init__(self, load: Callable[[], Checkpoint]) -> None:
        self.load = load
        self.shown = 0
        self.status = ""
        self.streamed = ""
        """The text of the model turn streamed so far (`follow_stream`): not printed again once saved."""

    def print_new(self) -> str:
        """Print what was saved since the last look; the session's status."""
        checkpoint = self.load()
        if len(checkpoint.messages) < self.shown:  # deleted and started again (or forked over): from the top
            typer.echo(f"-- {checkpoint.session_id} started again")
            self.shown = 0
        for index in range(self.shown, len(checkpoint.messages)):
            message = checkpoint.messages[index]
            if self.streamed and message.role == "assistant" and message.content == self.streamed:
                typer.echo(f"-- #{index} assistant saved: the text above")  # the checkpoint says the same
                self.streamed = ""
            else:
                typer.echo(message_whole(f"#{index} {message.role}", message))
        self.shown = len(checkpoint.messages)
        if checkpoint.status != self.status:
            self.status = checkpoint.status
            typer.echo(f"-- {_status_line(checkpoint)}")
        return self.status


def follow_session(load: Callable[[], Checkpoint], *, interval: float) -> None:
    """Print the session's messages whole, then each new one as it is saved, and each change of status; end
    when the session is finished (or on Ctrl-C)."""
    saved = SavedPrinter(load)
    try:
        while saved.print_new() != "finished":
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def follow_stream(
    load: Callable[[], Checkpoint], events: Callable[[str], Iterable[SessionEvent]], after: str, *, interval: float
) -> None:
    """`follow_session` from a fleet's event stream (issue #34): the model's text as it streams, the tool calls
    as they start and finish, and each save's messages whole (a streamed answer once saved is not printed
    again). `after`: the newest event id before the first look, so nothing written since is missed. Ends when
    the session is finished (or on Ctrl-C); a pause (an approval) is followed on."""
    saved = SavedPrinter(load)
    try:
        while saved.print_new() != "finished":
            for event in events(after):
                after = event.id
                if event.kind == "text-delta":
                    if not saved.streamed:
                        typer.echo(f"#{saved.shown} assistant (streaming, turn {event.turn}): ", nl=False)
                    saved.streamed += event.text or ""
                    typer.echo(event.text or "", nl=False)
                    continue
                if saved.streamed:
                    typer.echo("")
                if event.kind == "turn-started":
                    saved.streamed = ""
                line = describe_event(event)
                if line is not None:
                    typer.echo(f"-- {line}")
                if event.kind == "checkpoint-saved":
                    saved.print_new()
            time.sleep(interval)  # the feed ended: the run waits (an approval), or it finished
    except KeyboardInterrupt:
        return


def _status_line(checkpoint: Checkpoint) -> str:
    if checkpoint.status == "awaiting-approval" and checkpoint.approval_id:
        approval = checkpoint.approval_id
        return f"awaiting approval {approval}: lousho approve {approval} (following on)"
    return f"{checkpoint.status}, step {checkpoint.step_index}"
