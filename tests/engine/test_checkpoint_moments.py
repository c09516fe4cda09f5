"""Reference: 'What is checkpointed, and when' — one test per row of the table, and the rejections."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from lousho import (
    AbortSignal,
    Agent,
    AgentExecutor,
    PropagatingToolError,
    ProviderError,
    ToolContext,
    define_tool,
)
from lousho.providers import ScriptedProvider, tool_calls
from lousho.providers.base import RetryPolicy
from lousho.stores.memory import MemoryStore
from tests.engine.helpers import saves, tool_results
from tests.fixtures.core import CityArgs, ToolLog, charge_tool, weather_tool


async def test_checkpoint_is_saved_after_a_tool_call_response_before_any_tool_runs(store: MemoryStore) -> None:
    seen: list[Any] = []

    def inspect_store(args: CityArgs, ctx: ToolContext) -> str:
        seen.append(store.checkpoints.load("s"))
        return "ok"

    tool = define_tool(name="weather", description="", input=CityArgs, execute=inspect_store)
    agent = Agent(name="a", model="m", tools=[tool])
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "Oslo"})), "done"])
    await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    before = seen[0]
    assert before.status == "in-progress"
    assert before.messages[-1].tool_calls[0].id == "c1"
    assert tool_results(before.messages) == []


async def test_each_recorded_tool_result_is_saved_in_call_order(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[weather_tool(log)])
    calls = [(f"c{i}", "weather", {"city": f"city{i}"}) for i in range(3)]
    provider = ScriptedProvider([tool_calls(*calls), "done"])
    await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    recorded = [tool_results(cp.messages) for cp in saves(store, "s")]
    assert recorded == [[], ["c0"], ["c0", "c1"], ["c0", "c1", "c2"], ["c0", "c1", "c2"]]
    assert [cp.status for cp in saves(store, "s")] == ["in-progress"] * 4 + ["finished"]


async def test_results_finishing_out_of_order_are_recorded_in_call_order(store: MemoryStore, log: ToolLog) -> None:
    class Delay(BaseModel):
        seconds: float

    async def sleep(args: Delay, ctx: ToolContext) -> float:
        await asyncio.sleep(args.seconds)
        log.record(ctx)
        return args.seconds

    tool = define_tool(name="sleep", description="", input=Delay, execute=sleep)
    agent = Agent(name="a", model="m", tools=[tool], tool_concurrency=3)
    provider = ScriptedProvider([tool_calls(("c0", "sleep", {"seconds": 0.15}), ("c1", "sleep", {"seconds": 0.05}), ("c2", "sleep", {"seconds": 0.0})), "done"])
    await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert log.order == ["c2", "c1", "c0"]
    assert [tool_results(cp.messages) for cp in saves(store, "s")][1:4] == [["c0"], ["c0", "c1"], ["c0", "c1", "c2"]]


async def test_abort_saves_an_in_progress_checkpoint(store: MemoryStore) -> None:
    signal = AbortSignal()

    async def slow(args: CityArgs, ctx: ToolContext) -> str:
        signal.abort("user pressed stop")
        await ctx.signal.wait()
        await asyncio.sleep(10)
        return "never"

    agent = Agent(name="a", model="m", tools=[define_tool(name="slow", description="", input=CityArgs, execute=slow)])
    provider = ScriptedProvider([tool_calls(("c1", "slow", {"city": "x"}), ("c2", "slow", {"city": "y"}))])
    result = await AgentExecutor.execute(
        agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints, signal=signal
    )

    assert result.finish_reason == "aborted"
    stored = store.checkpoints.load("s")
    assert stored is not None and stored.status == "in-progress"
    assert [m.result()["error"] for m in stored.messages if m.role == "tool"] == ["cancelled", "cancelled"]


async def test_pause_for_approval_saves_awaiting_approval_with_its_id(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[charge_tool(log)])
    provider = ScriptedProvider([tool_calls(("c1", "charge_card", {"amount": 5}))])
    result = await AgentExecutor.execute(
        agent=agent, input="pay", provider=provider, session_id="s",
        checkpoint_store=store.checkpoints, approval_store=store.approvals,
    )

    stored = store.checkpoints.load("s")
    assert result.finish_reason == "awaiting-approval"
    assert stored is not None and stored.status == "awaiting-approval"
    assert stored.approval_id == result.approval_id is not None


async def test_finished_is_saved_when_the_model_stops_calling_tools(store: MemoryStore, agent: Agent) -> None:
    provider = ScriptedProvider(["all done"])
    result = await AgentExecutor.execute(agent=agent, input="hi", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    stored = store.checkpoints.load("s")
    assert result.finish_reason == "stop" and result.text == "all done"
    assert stored is not None and stored.status == "finished" and stored.finish_reason == "stop"


async def test_finished_is_saved_when_max_steps_runs_out(store: MemoryStore, agent: Agent) -> None:
    provider = ScriptedProvider([tool_calls((f"c{i}", "weather", {"city": "x"})) for i in range(5)])
    result = await AgentExecutor.execute(
        agent=agent, input="loop", provider=provider, session_id="s", checkpoint_store=store.checkpoints, max_steps=2
    )

    stored = store.checkpoints.load("s")
    assert result.finish_reason == "max-steps" and result.steps == 2
    assert stored is not None and stored.status == "finished" and stored.finish_reason == "max-steps"
    assert tool_results(stored.messages) == ["c0", "c1"]


class FailingProvider(ScriptedProvider):
    async def generate(self, request: Any) -> Any:
        if request.step == 2:
            raise ProviderError("upstream 500", retryable=True, status=500)
        return await super().generate(request)


async def test_a_provider_error_keeps_the_last_in_progress_checkpoint(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[weather_tool(log)], retry=RetryPolicy(max_attempts=2, base_delay_s=0.01))
    provider = FailingProvider([tool_calls(("c1", "weather", {"city": "x"})), "done"])
    with pytest.raises(ProviderError):
        await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    stored = store.checkpoints.load("s")
    assert stored is not None and stored.status == "in-progress"
    assert tool_results(stored.messages) == ["c1"]


async def test_a_throwing_hook_keeps_the_last_in_progress_checkpoint(store: MemoryStore, log: ToolLog) -> None:
    def refuse(call: Any, ctx: ToolContext) -> None:
        if call.id == "c2":
            raise RuntimeError("policy says no")

    agent = Agent(name="a", model="m", tools=[weather_tool(log)], before_tool=refuse)
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "x"}), ("c2", "weather", {"city": "y"}))])
    with pytest.raises(RuntimeError, match="policy says no"):
        await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    stored = store.checkpoints.load("s")
    assert stored is not None and stored.status == "in-progress"
    assert tool_results(stored.messages) == ["c1"]


async def test_a_propagating_tool_error_keeps_the_last_in_progress_checkpoint(store: MemoryStore) -> None:
    def explode(args: CityArgs, ctx: ToolContext) -> str:
        raise PropagatingToolError("the database is gone")

    agent = Agent(name="a", model="m", tools=[define_tool(name="explode", description="", input=CityArgs, execute=explode)])
    provider = ScriptedProvider([tool_calls(("c1", "explode", {"city": "x"}))])
    with pytest.raises(PropagatingToolError):
        await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    stored = store.checkpoints.load("s")
    assert stored is not None and stored.status == "in-progress"
    assert stored.pending_tool_calls()[0].id == "c1"
