"""Reference: 'An aborted call gets a cancelled result' (issue #16), in process, on every store.

A call that was running when its run was aborted gets `CANCELLED_RESULT` whatever the tool then does:
raises (what a cooperative tool does, like an aborted HTTP request), returns, or raises
`PropagatingToolError`. A call whose tool returned before the abort keeps its result (docs: README,
'A durable run in your process')."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lousho import AbortSignal, Agent, AgentExecutor, PropagatingToolError, ToolContext, define_tool
from lousho.checkpoint import maybe_await
from lousho.engine import CANCELLED_RESULT
from lousho.providers import ScriptedProvider, tool_calls
from tests.engine.helpers import assert_valid_transcript
from tests.fixtures.core import CityArgs


async def _stop_how(how: str) -> Any:
    """What a tool does once it notices the abort."""
    if how == "raises":
        raise RuntimeError("request aborted")
    if how == "raises-propagating":
        raise PropagatingToolError("the tool gave up")
    return {"partial": True}


def _agent(signal: AbortSignal, how: str, ran: list[str]) -> Agent:
    async def quick(args: CityArgs, ctx: ToolContext) -> dict[str, str]:
        ran.append(ctx.tool_call_id)
        return {"city": args.city}

    async def slow(args: CityArgs, ctx: ToolContext) -> Any:
        ran.append(ctx.tool_call_id)
        asyncio.get_running_loop().call_later(0.02, signal.abort, "user pressed stop")
        await ctx.signal.wait()
        return await _stop_how(how)

    tools = [
        define_tool(name="quick", description="", input=CityArgs, execute=quick),
        define_tool(name="slow", description="", input=CityArgs, execute=slow),
    ]
    return Agent(name="a", model="m", tools=tools)


def _results(checkpoint: Any) -> dict[str, Any]:
    return {m.tool_call_id: m.result() for m in checkpoint.messages if m.role == "tool"}


@pytest.mark.parametrize("how", ["raises", "returns", "raises-propagating"])
async def test_an_aborted_call_gets_the_cancelled_result_whatever_the_tool_then_does(any_store: Any, how: str) -> None:
    signal, ran = AbortSignal(), list[str]()
    provider = ScriptedProvider([tool_calls(("c1", "slow", {"city": "x"}), ("c2", "quick", {"city": "y"}))])
    result = await AgentExecutor.execute(
        agent=_agent(signal, how, ran), input="go", provider=provider, session_id="s",
        checkpoint_store=any_store.checkpoints, signal=signal,
    )  # fmt: skip

    assert result.finish_reason == "aborted"
    stored = await maybe_await(any_store.checkpoints.load("s"))
    assert stored is not None and stored.status == "in-progress"
    assert _results(stored) == {"c1": CANCELLED_RESULT, "c2": CANCELLED_RESULT}
    assert ran == ["c1"]  # the call after it never started
    assert_valid_transcript(stored.messages)


async def test_a_call_that_returned_before_the_abort_keeps_its_result(any_store: Any) -> None:
    signal, ran = AbortSignal(), list[str]()
    agent = _agent(signal, "returns", ran)
    agent.tool_concurrency = 2
    provider = ScriptedProvider([tool_calls(("c1", "quick", {"city": "x"}), ("c2", "slow", {"city": "y"}))])
    result = await AgentExecutor.execute(
        agent=agent,
        input="go",
        provider=provider,
        session_id="s",
        checkpoint_store=any_store.checkpoints,
        signal=signal,
    )

    assert result.finish_reason == "aborted"
    stored = await maybe_await(any_store.checkpoints.load("s"))
    assert stored is not None
    assert _results(stored) == {"c1": {"city": "x"}, "c2": CANCELLED_RESULT}
