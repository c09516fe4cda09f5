"""The run context on resume (issue #16), in process, on every store: a crash resume and a resume after
an approval give the tools the context the run saved (`ctx.metadata`), for a static agent and a dynamic
one (reference: 'a crash resume uses them ... resolved again with the saved ctx'); a `context=` passed
to the resume is what its tools see, and the run keeps its saved context (README: 'Resuming with a
changed agent')."""

from __future__ import annotations

from typing import Any

import pytest

from lousho import Agent, AgentExecutor, ToolContext, define_tool, resume_after_approval
from lousho.checkpoint import maybe_await
from lousho.providers import ScriptedProvider, tool_calls
from tests.fixtures.core import CityArgs

ACME = {"tenant": "acme", "tier": "gold"}
GLOBEX = {"tenant": "globex", "tier": "gold"}


class Crash(BaseException):
    """Stands for the process dying: nothing in lousho catches it."""


class Remember:
    """An agent whose `remember` tool records the `ctx.metadata` each run of a call saw; the calls named
    in `crash_once` die (like a killed process) on their first run."""

    def __init__(self, *, dynamic: bool, gated: bool = False, crash_once: tuple[str, ...] = ()) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.crash_once = set(crash_once)
        tool = define_tool(name="remember", description="", input=CityArgs, execute=self.remember, needs_approval=gated)
        if dynamic:
            self.agent = Agent(name="ctx", model=lambda ctx: f"model-{ctx.get('tier')}", tools=lambda ctx: [tool])
        else:
            self.agent = Agent(name="ctx", model="model-static", tools=[tool])

    async def remember(self, args: CityArgs, ctx: ToolContext) -> dict[str, Any]:
        self.seen.append((ctx.tool_call_id, dict(ctx.metadata)))
        if ctx.tool_call_id in self.crash_once:
            self.crash_once.discard(ctx.tool_call_id)
            raise Crash(ctx.tool_call_id)
        return {"tenant": ctx.metadata.get("tenant")}


def one_call() -> ScriptedProvider:
    return ScriptedProvider([tool_calls(("c1", "remember", {"city": "x"})), "done"])


async def crashed_run(store: Any, tool: Remember, provider: ScriptedProvider) -> None:
    """Start the session with ACME as its context; the process 'dies' while c1 runs."""
    with pytest.raises(Crash):
        await AgentExecutor.execute(
            agent=tool.agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints,
            context=ACME,
        )  # fmt: skip


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
async def test_a_crash_resume_gives_tools_the_saved_run_context(any_store: Any, dynamic: bool) -> None:
    tool, provider = Remember(dynamic=dynamic, crash_once=("c1",)), one_call()
    await crashed_run(any_store, tool, provider)

    result = await AgentExecutor.execute(
        agent=tool.agent, input=[], provider=provider, session_id="s", checkpoint_store=any_store.checkpoints
    )

    assert result.finish_reason == "stop"
    assert tool.seen == [("c1", ACME), ("c1", ACME)]
    stored = await maybe_await(any_store.checkpoints.load("s"))
    assert stored is not None and stored.run_config is not None and stored.run_config["ctx"] == ACME


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
async def test_a_context_passed_to_a_resume_is_what_its_tools_see(any_store: Any, dynamic: bool) -> None:
    tool, provider = Remember(dynamic=dynamic, crash_once=("c1",)), one_call()
    await crashed_run(any_store, tool, provider)

    await AgentExecutor.execute(
        agent=tool.agent, input=[], provider=provider, session_id="s", checkpoint_store=any_store.checkpoints,
        context=GLOBEX,
    )  # fmt: skip

    assert tool.seen == [("c1", ACME), ("c1", GLOBEX)]
    stored = await maybe_await(any_store.checkpoints.load("s"))
    assert stored is not None and stored.run_config is not None
    assert stored.run_config["ctx"] == ACME  # the run keeps the context it saved


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
async def test_a_resume_after_approval_gives_tools_the_saved_run_context(any_store: Any, dynamic: bool) -> None:
    tool, provider = Remember(dynamic=dynamic, gated=True), one_call()
    paused = await AgentExecutor.execute(
        agent=tool.agent, input="go", provider=provider, session_id="s", checkpoint_store=any_store.checkpoints,
        approval_store=any_store.approvals, context=ACME,
    )  # fmt: skip
    assert paused.finish_reason == "awaiting-approval" and tool.seen == []

    result = await resume_after_approval(
        {"id": paused.approval_id, "approved": True}, any_store.approvals, tool.agent, provider, {},
        any_store.checkpoints,
    )  # fmt: skip

    assert result.finish_reason == "stop"
    assert tool.seen == [("c1", ACME)]
