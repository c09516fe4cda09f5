"""The in-process demo: a run killed with SIGKILL mid-tool, resumed by another process, paused
for an approval and approved. Everything lives in one SQLite file, as it would on one machine."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lousho.agent import create_agent
from lousho.checkpoint import Checkpoint
from lousho.demo.trip import CRASH_ENV, TRIP_REQUESTS, trip_planner, trip_provider
from lousho.stores.sql import SqliteStore

__all__ = ["run_demo"]

SESSION = "trip-lisbon"


def _transcript(checkpoint: Checkpoint, title: str) -> Table:
    table = Table(title=title, show_lines=False)
    table.add_column("#", justify="right")
    table.add_column("role")
    table.add_column("content")
    for index, message in enumerate(checkpoint.messages):
        calls = ", ".join(f"{c.name}({c.arguments}) #{c.id}" for c in message.tool_calls)
        content = " -> ".join(part for part in (message.content or "", calls) if part)
        if message.role == "tool":
            content = f"#{message.tool_call_id}: {content}"
        table.add_row(str(index), message.role, escape(content[:160]))
    return table


async def _child(db: str) -> None:
    agent = create_agent(provider=trip_provider(), store=SqliteStore(db), agent=trip_planner())
    await agent.send(TRIP_REQUESTS[SESSION], session_id=SESSION)


async def _run_child_that_crashes(db: str, console: Console) -> int:
    env = {**os.environ, CRASH_ENV: "lisbon_food"}
    console.print(
        f"[bold]1.[/] A worker process starts [cyan]{SESSION}[/] and is killed with SIGKILL while it runs `find_restaurants`..."
    )
    # Its own session: Ctrl-C in the terminal is the demo's to handle; on it, the demo ends the child by pid,
    # at once, and no traceback of the child's reaches the screen (issue #15).
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lousho.demo.inprocess", "--child", db, env=env, start_new_session=True
    )
    try:
        returncode = await child.wait()
    except BaseException:  # cancelled by Ctrl-C (asyncio.run turns SIGINT into a cancellation)
        if child.returncode is None:
            child.kill()
            await asyncio.shield(child.wait())
        raise
    console.print(f"   the process died (exit {returncode}); nothing in it said goodbye.")
    return returncode


async def run_demo(console: Console | None = None) -> None:
    console = console or Console()
    with tempfile.TemporaryDirectory(prefix="lousho-demo-") as folder:
        db = str(Path(folder) / "jobs.db")
        await _run_child_that_crashes(db, console)
        store = SqliteStore(db)
        stored = await asyncio.to_thread(store.checkpoints.load, SESSION)
        assert stored is not None
        console.print(_transcript(stored, f"2. What the checkpoint holds after the crash (status: {stored.status})"))
        agent = create_agent(provider=trip_provider(), store=store, agent=trip_planner())
        console.print(
            "[bold]3.[/] Another process resumes it: the recorded weather result is not run again, the model is not asked again."
        )
        paused = await agent.resume(SESSION)
        assert paused is not None
        console.print(
            f"   the run paused for approval of `book_table` (approval {paused.approval_id}); a human approves it."
        )
        final = await agent.approvals.resolve(paused.approval_id or "", approved=True, note="looks good")
        done = await asyncio.to_thread(store.checkpoints.load, SESSION)
        assert done is not None
        console.print(_transcript(done, f"4. Finished ({final.finish_reason}): {final.text}"))
        history = await agent.history(SESSION) or []
        console.print(f"The session has {len(history)} saves in its history; fork any of them with agent.fork(...).")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        asyncio.run(_child(sys.argv[2]))
    else:
        asyncio.run(run_demo())
