"""The agent of the interrupted-call tests (issue #17), shared by the test process and the child
process that a test SIGKILLs in the middle of a tool call.

`python -m tests.engine.interrupted_app <store dir> <policy>` runs session `s-<policy>` on a file store;
its `send_<policy>` tool writes `<store dir>/started-<call id>` and then hangs, for the test to kill it.
Every run of a tool is counted in `<store dir>/runs-<call id>` (one line per run), outside the store.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from lousho import Agent, ToolContext, create_agent, define_tool
from lousho.agent import DurableAgent
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.file import FileStore
from lousho.tools import InterruptPolicy

POLICIES: tuple[InterruptPolicy, ...] = ("rerun", "ask", "fail")


class Email(BaseModel):
    to: str


def runs(folder: Path, call_id: str) -> int:
    path = folder / f"runs-{call_id}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def make_agent(folder: Path, *, hang: bool = False, on_first_run: Any = None) -> DurableAgent:
    """`hang`: the first run of a `send_*` call hangs after it started (the child process, to be killed).
    `on_first_run(ctx)`: awaited by the first run of a `send_*` call (the abort tests stop the run there)."""

    async def send(args: Email, ctx: ToolContext) -> dict[str, Any]:
        with (folder / f"runs-{ctx.tool_call_id}").open("a") as log:
            log.write("ran\n")
        first = runs(folder, ctx.tool_call_id) == 1
        (folder / f"started-{ctx.tool_call_id}").touch()
        if first and hang:
            await asyncio.sleep(3600)
        if first and on_first_run is not None:
            await on_first_run(ctx)
        return {"sent_to": args.to}

    async def log_note(args: Email, ctx: ToolContext) -> str:
        with (folder / f"runs-{ctx.tool_call_id}").open("a") as log:
            log.write("ran\n")
        return f"noted {args.to}"

    tools = [
        *(define_tool(name=f"send_{p}", description="Send an email", input=Email, execute=send, on_interrupted=p)
          for p in POLICIES),
        define_tool(name="log_note", description="Write a note", input=Email, execute=log_note),
    ]
    agent = Agent(name="mailer", model="scripted", tools=tools)
    return create_agent(provider=ScriptedByPolicy(), store=FileStore(folder / "store"), agent=agent)


def script_turn(policy: str) -> Any:
    return tool_calls((f"{policy}-send", f"send_{policy}", {"to": "ann@example.com"}),
                      (f"{policy}-note", "log_note", {"to": "ann@example.com"}))


class ScriptedByPolicy(ScriptedProvider):
    """Turn 1 asks for `send_<policy>` then `log_note` (the policy read off the session id `s-<policy>`);
    turn 2 answers with the results it was given, so a test sees what the model read."""

    async def generate(self, request: Any) -> Any:
        from lousho import Message
        from lousho.providers.base import ModelResponse

        policy = (request.session_id or "s-rerun").split("-", 1)[1]
        if not any(m.role == "assistant" for m in request.messages):
            return ModelResponse(message=script_turn(policy))
        results = [m.content for m in request.messages if m.role == "tool"]
        return ModelResponse(message=Message.assistant(f"done after {len(results)} results"))


def main() -> None:
    folder, policy = Path(sys.argv[1]), sys.argv[2]
    agent = make_agent(folder, hang=True)
    asyncio.run(agent.send("send it", session_id=f"s-{policy}"))


if __name__ == "__main__":
    main()
