"""Rich tables for the `lousho` command and the demo: transcripts, sessions, history, approvals."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lousho.checkpoint import Checkpoint, HistoryEntry
from lousho.messages import Message
from lousho.operations.approvals import PendingApproval
from lousho.operations.sessions import SessionRow
from lousho.operations.text import age_text, short, time_text

__all__ = [
    "approvals_text",
    "console",
    "history_table",
    "message_text",
    "message_whole",
    "print_json",
    "print_table",
    "report_skipped",
    "session_cells",
    "sessions_table",
    "transcript_table",
    "transcript_text",
]


def console(stderr: bool = False) -> Console:
    """A console on the current stdout/stderr; wide enough for tables when not on a terminal (pipes, tests)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or "COLUMNS" in os.environ else max(140, shutil.get_terminal_size().columns)
    return Console(file=stream, width=width, highlight=False)


def print_json(value: Any) -> None:
    """`--json`: the value on stdout as JSON, whole (issue #15)."""
    print(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def message_text(message: Message, limit: int = 120, *, with_ids: bool = True) -> str:
    """One line for a message: its text, its tool calls, or (for a tool message) the call id and result. The
    text and the arguments are cut to fit `limit`; a call id never is (issue #32: a copied id is whole).
    `with_ids=False`: without the ids, which a table shows in a column of their own (`call_ids`)."""
    shown = [f"{c.name}({short(c.arguments, 60)})" + (f" #{c.id}" if with_ids else "") for c in message.tool_calls]
    calls = ", ".join(shown)
    head = f"#{message.tool_call_id}: " if message.role == "tool" and with_ids else ""
    room = max(20, limit - len(head) - len(calls) - (4 if calls else 0))
    text = short(message.content, room) if message.content else ""
    return head + " -> ".join(part for part in (text, calls) if part)


def call_ids(message: Message) -> str:
    """The call ids a message names, one a line: its calls', or the one a tool message answers."""
    if message.role == "tool":
        return message.tool_call_id or ""
    return "\n".join(call.id for call in message.tool_calls)


def transcript_table(checkpoint: Checkpoint, title: str | None = None) -> Table:
    table = Table(title=title or f"{checkpoint.session_id} ({checkpoint.status}, step {checkpoint.step_index})")
    table.add_column("#", justify="right")
    table.add_column("role")
    _id_column(table, "call", (line for m in checkpoint.messages for line in call_ids(m).splitlines()))
    table.add_column("content", overflow="fold")
    for index, message in enumerate(checkpoint.messages):
        text = escape(message_text(message, with_ids=False))
        table.add_row(str(index), message.role, escape(call_ids(message)), text)
    for message in checkpoint.pending_input:
        table.add_row("-", f"{message.role} (queued)", "", escape(message_text(message, with_ids=False)))
    return table


def transcript_text(checkpoint: Checkpoint, status: str | None = None) -> str:
    """`show --full`: every message whole, as plain lines that no table wraps (issue #15); `status` shown
    instead of the checkpoint's ('parked', on the fleet)."""
    lines = [f"{checkpoint.session_id} ({status or checkpoint.status}, step {checkpoint.step_index})"]
    lines += [message_whole(f"#{i} {m.role}", m) for i, m in enumerate(checkpoint.messages)]
    lines += [message_whole(f"- {m.role} (queued)", m) for m in checkpoint.pending_input]
    return "\n".join(lines)


def message_whole(label: str, message: Message) -> str:
    """A message whole: a head line (label, the call id a result answers, the calls it makes), then its text."""
    head = f"#{message.tool_call_id}" if message.role == "tool" else ""
    calls = ", ".join(f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)}) #{c.id}" for c in message.tool_calls)
    lines = [" ".join(part for part in (label, head, f"-> {calls}" if calls else "") if part)]
    lines += [f"    {line}" for line in (message.content or "").splitlines()]
    return "\n".join(lines)


def print_table(table: Table) -> None:
    """Print `table` on stdout at the terminal's width, or wider when the terminal is too narrow for its id
    columns: the other columns fold, an id is never wrapped nor cut, so a copied id is whole (issue #15)."""
    out = console()
    needed = sum(c.min_width if c.no_wrap and c.min_width else 8 for c in table.columns) + 3 * len(table.columns) + 1
    out.width = max(out.width, needed)
    out.print(table)


def _id_column(table: Table, header: str, ids: Iterable[str]) -> None:
    """A column of ids: never wrapped nor cut, however narrow the terminal, so a copied id is whole (issue #15)."""
    width = max([len(header), *(len(i) for i in ids)])
    table.add_column(header, no_wrap=True, overflow="ignore", min_width=width)


def session_cells(row: SessionRow) -> list[str]:
    """A session row as the table shows it: what its head holds, its age, why it is parked (the id whole).
    Nothing of its payload (issue #32: a listing never opens one)."""
    counts = ["-" if row.steps is None else str(row.steps), "-" if row.messages is None else str(row.messages)]
    saved = "-" if row.saved_at is None else f"{age_text(row.saved_at)} ago"
    note = f"parked: {row.parked_reason}" if row.parked_reason else ""  # issue #15
    if not note and row.parent_session_id:
        note = f"sub-agent of {row.parent_session_id}"
    return [row.session_id, row.status, row.agent or "-", *counts, saved, short(note, 80)]


def sessions_table(rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title="sessions")
    _id_column(table, "session", (row[0] for row in rows))
    for column in ("status", "agent", "steps", "messages", "saved", "note"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    return table


def history_table(session_id: str, entries: Sequence[HistoryEntry]) -> Table:
    """One row per save, newest first; a step may have several saves (the model's turn, then each tool result),
    so each save is addressed by its number (the checkpoint's version), which `fork --from-save` takes (issue #15)."""
    table = Table(title=f"history of {session_id} (newest first; fork with --from-save SAVE)")
    _id_column(table, "save", (str(entry.checkpoint.version) for entry in entries))
    for column in ("step", "saved at", "status", "messages"):
        table.add_column(column, overflow="fold")
    lasts = [entry.checkpoint.messages[-1] for entry in entries if entry.checkpoint.messages]
    _id_column(table, "call", (line for message in lasts for line in call_ids(message).splitlines()))
    table.add_column("last message", overflow="fold")
    for entry in entries:
        messages = entry.checkpoint.messages
        last = message_text(messages[-1], 90, with_ids=False) if messages else "(accepted, not started)"
        ids = call_ids(messages[-1]) if messages else ""
        saved_at = time_text(entry.saved_at)
        cells = [str(entry.checkpoint.version), str(entry.step), saved_at, entry.status, str(len(messages))]
        table.add_row(*cells, escape(ids), escape(last))
    return table


def approvals_text(pending: Sequence[PendingApproval], width: int = 80) -> str:
    """Pending approvals as lines that fit `width` columns: the id whole, then the call that waits (the innermost
    sub-agent's, in its session, naming the parent session paused on the same id: issue #14), its arguments cut to
    fit; under it, where it waits, for how long, and its kind (issue #32: a table of ids could not fit 80 columns)."""
    lines = ["pending approvals (lousho approve ID [--reject] [--note TEXT])"]
    for row in pending:
        head = f"{row.id}  {row.tool_call.name}"
        room = max(20, width - len(head) - 1)
        lines.append(f"{head} {short(row.tool_call.arguments, room)}")
        where = f"session {row.session_id or '-'}"
        if row.parent_session_id:
            where += f" (sub-agent of {row.parent_session_id})"
        # 'interrupted': the call may have run already (a worker died in it); `lousho approve ID --action` (issue #17)
        lines.append(f"  {where}, waiting {age_text(row.created_at)}, {row.kind}")
    if not pending:
        lines.append("(none)")
    return "\n".join(lines)


def report_skipped(skipped: Mapping[str, str], what: str) -> None:
    """On stderr, after a listing: how many records it skipped as unreadable, which, and why (issue #21).
    The listing still succeeded (exit 0): the records it could read are all printed."""
    if not skipped:
        return
    plural = what if len(skipped) == 1 else f"{what}s"
    lines = [f"warning: skipped {len(skipped)} unreadable {plural}: {', '.join(skipped)}"]
    lines += [f"  {record_id}: {why}" for record_id, why in skipped.items()]
    print("\n".join(lines), file=sys.stderr)


# The command says what a listing skipped (report_skipped); the stores' own warning, which Python
# prints on stderr when nothing configured logging, would say it a second time.
logging.getLogger("lousho.stores").addHandler(logging.NullHandler())
