"""What the fleet demo shows: the live table while it runs, and the report at the end (issue #15: the closing
commands work when pasted). Read from a `FleetDemo`; split from lousho/demo/fleet.py to keep each module short."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from lousho.cli.render import transcript_table
from lousho.demo.tracking import asked_key, runs_key
from lousho.operations.text import short
from lousho.redaction import redact_url
from lousho.scheduler import SessionStatus

if TYPE_CHECKING:
    from lousho.demo.fleet import DemoOutcome, FleetDemo

__all__ = ["how_to_look", "render", "report", "text_of"]


def render(demo: FleetDemo) -> Group:
    """The live table: each session, what runs now, and the workers."""
    table = Table(
        title=f"lousho fleet demo: {len(demo.sessions)} trip planners, queue {demo.queue}",
        expand=False,
    )
    for column in ("session", "status", "step", "messages", "now", "last answer"):
        table.add_column(column)
    running_by_session = {e["session"]: (c, e) for c, e in demo.running.items()}
    for session in demo.sessions:
        status = demo.statuses.get(session)
        if status is None:
            table.add_row(session, "-", "-", "-", "-", "")
            continue
        table.add_row(
            session,
            _styled(status.status),
            str(status.steps),
            str(status.messages),
            _now_of(demo, session, status, running_by_session),
            escape(short(status.text or "", 60)),
        )
    fleet = Text("workers: ")
    for worker in demo.workers_now():
        state = (
            "killed"
            if demo.kill is not None and worker.pid == demo.kill.pid
            else ("up" if worker.alive() else "stopped")
        )
        fleet.append(f"{worker.name} pid {worker.pid} ", style="bold")
        fleet.append(f"{state}   ", style="red" if state == "killed" else "green")
    return Group(table, fleet)


def _now_of(
    demo: FleetDemo, session: str, status: SessionStatus, running: dict[str, tuple[str, dict[str, Any]]]
) -> str:
    if status.status == "finished":
        return "done"
    if status.status == "awaiting-approval":
        return "waiting for a human"
    if session in running:
        _, entry = running[session]
        worker = demo.worker_named(int(entry["pid"]))
        where = worker.name if worker is not None else f"pid {entry['pid']}"
        if worker is not None and not worker.alive():
            return f"{entry['tool']} on {where} (dead; the reaper will requeue)"
        return f"{entry['tool']} on {where}"
    return "queued / model turn"


def report(demo: FleetDemo, outcome: DemoOutcome) -> None:
    """What happened, told from the store and the demo's ledger, then how to look at it."""
    console = demo.console
    for session in demo.sessions:
        checkpoint = demo.client.checkpoint(session)
        if checkpoint is not None:
            console.print(transcript_table(checkpoint, f"{session}: {checkpoint.status}"))
    raw_runs = cast(dict[bytes, bytes], demo.redis.hgetall(runs_key(demo.settings.prefix)))
    runs = {text_of(k): int(v) for k, v in raw_runs.items()}
    console.print("[bold]What happened[/]")
    if outcome.ok:
        console.print(
            f"- All {len(demo.sessions)} sessions finished in {outcome.elapsed_s:.1f}s, "
            f"each after a human approved its booking."
        )
    else:
        stuck = {s: st.status for s, st in demo.statuses.items() if st.status != "finished"}
        console.print(f"- [red]Not every session finished[/] within the time limit: {stuck}")
        for worker in demo.workers:
            console.print(f"--- {worker.name} log ---\n{escape(worker.log()[-2000:])}")
    kill = outcome.kill
    if kill is not None:
        again = runs.get(kill.call_id, 0)
        console.print(
            f"- Worker {kill.worker} (pid {kill.pid}) was killed with SIGKILL while running {kill.tool} "
            f"(call {kill.call_id}) of {kill.session}."
        )
        if kill.requeued_after_s is not None or kill.recovered_after_s is not None:
            how = (
                f"{kill.requeued_by} requeued it {kill.requeued_after_s:.2f}s after the kill"
                if kill.requeued_after_s is not None
                else "another reaper requeued it"
            )
            ran = f", ran again {kill.recovered_after_s:.2f}s after it" if kill.recovered_after_s is not None else ""
            console.print(
                f"- Recovered: {kill.session}: {how}{ran} (lease TTL {demo.client.settings.lease_ttl_s}s); "
                f"{kill.call_id} ran {again} times in all, with the same tool_call_id, and its result was recorded once."
            )
        others = {c: n for c, n in runs.items() if c != kill.call_id and n != 1}
        console.print(f"- Every other tool call ran exactly once{'' if not others else f' except {others}'}.")
    else:
        console.print("- No worker was killed (no find_restaurants call was seen running).")
    raw_asked = cast(dict[bytes, bytes], demo.redis.hgetall(asked_key(demo.settings.prefix)))
    asked = {text_of(k): int(v) for k, v in raw_asked.items()}
    twice = {turn: n for turn, n in asked.items() if n != 1}
    if twice:
        console.print(f"- Model turns asked more than once: {twice}")
    else:
        console.print(
            f"- Each of the {len(asked)} model turns was asked once: an answer, once checkpointed, "
            "is never asked for again, whichever worker runs the next step."
        )
    how_to_look(demo, kill.session if kill else next(iter(demo.sessions)))


def how_to_look(demo: FleetDemo, session: str) -> None:
    """Commands that work as pasted: the sessions stay in the store the next command uses (issue #15)."""
    console = demo.console
    console.print("[bold]How to look at it[/]")
    if not demo.local:
        shown = redact_url(str(demo.settings.redis_url))
        console.print(f"  (in a shell with the same LOUSHO_REDIS_URL / REDIS_URL as this demo: {escape(shown)})")
    for command, what in (
        ("lousho sessions", "every session and its status"),
        (f"lousho show {session}", "the transcript"),
        (f"lousho history {session}", "every save, newest first: the steps you can fork from"),
    ):
        console.print(f"  {command:<32} # {what}", markup=False, highlight=False)


def _styled(status: str) -> str:
    color = {"finished": "green", "awaiting-approval": "yellow", "parked": "red"}.get(status, "cyan")
    return f"[{color}]{status}[/]"


def text_of(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
