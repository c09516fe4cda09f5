"""Reference: 'Guarantees' and 'At-least-once tools' — one test per guarantee, after crashes and resumes."""

from __future__ import annotations

from typing import Any

import pytest

from lousho import Agent, AgentExecutor, Checkpoint, ToolContext, define_tool
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryCheckpointStore, MemoryStore
from tests.engine.helpers import assert_valid_transcript, tool_results
from tests.engine.test_execute_again import Crash, crash_on
from tests.fixtures.core import CityArgs, ToolLog, weather_tool


class CrashAfterSave(MemoryCheckpointStore):
    """Dies right after the save that records a model turn asking for tools (the answer is checkpointed)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = True

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        super().save(session_id, checkpoint)
        last = checkpoint.messages[-1]
        if self.armed and last.role == "assistant" and last.tool_calls:
            self.armed = False
            raise Crash("died after the model's answer was saved")


async def test_every_call_gets_exactly_one_result_in_call_order(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[crash_on(log, "c3", times=2)], tool_concurrency=2)
    calls = [(f"c{i}", "weather", {"city": str(i)}) for i in range(5)]
    provider = ScriptedProvider([tool_calls(*calls), "done"])
    for _ in range(2):
        with pytest.raises(Crash):
            await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    result = await AgentExecutor.execute(agent=agent, input=[], provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert tool_results(result.messages) == [f"c{i}" for i in range(5)]
    assert_valid_transcript(result.messages)


async def test_recorded_result_is_never_re_executed(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[crash_on(log, "c2")])
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "a"}), ("c2", "weather", {"city": "b"})), "done"])
    with pytest.raises(Crash):
        await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    await AgentExecutor.execute(agent=agent, input=[], provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert log.runs["c1"] == 1


async def test_checkpointed_model_turn_is_never_generated_again(log: ToolLog) -> None:
    checkpoints = CrashAfterSave()
    agent = Agent(name="a", model="m", tools=[weather_tool(log)])
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "a"})), "done"])
    with pytest.raises(Crash):
        await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=checkpoints)

    result = await AgentExecutor.execute(agent=agent, input=[], provider=provider, session_id="s", checkpoint_store=checkpoints)

    assert len(provider.calls) == 2  # the tool-call turn once, then the final turn once
    assert result.text == "done" and log.runs == {"c1": 1}


async def test_provider_always_receives_a_valid_transcript(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[crash_on(log, "c2")])
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "a"}), ("c2", "weather", {"city": "b"})), "done", "again"])
    with pytest.raises(Crash):
        await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)
    await AgentExecutor.execute(agent=agent, input="new input mid-run", provider=provider, session_id="s", checkpoint_store=store.checkpoints)
    await AgentExecutor.execute(agent=agent, input="one more", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    for request in provider.calls:
        assert_valid_transcript(request.messages)
        assert request.messages[-1].role in ("user", "tool")


async def test_a_re_run_tool_sees_the_same_tool_call_id(store: MemoryStore) -> None:
    keys: list[str] = []

    def charge(args: CityArgs, ctx: ToolContext) -> str:
        keys.append(ctx.tool_call_id)
        if len(keys) == 1:
            raise Crash("died while charging")
        return "charged"

    agent = Agent(name="a", model="m", tools=[define_tool(name="charge", description="", input=CityArgs, execute=charge)])
    provider = ScriptedProvider([tool_calls(("call_pay", "charge", {"city": "a"})), "done"])
    with pytest.raises(Crash):
        await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)
    await AgentExecutor.execute(agent=agent, input=[], provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert keys == ["call_pay", "call_pay"]


async def test_tool_context_carries_the_session_id(store: MemoryStore) -> None:
    seen: list[Any] = []

    def look(args: CityArgs, ctx: ToolContext) -> str:
        seen.append((ctx.session_id, ctx.tool_call_id, ctx.signal.aborted))
        return "ok"

    agent = Agent(name="a", model="m", tools=[define_tool(name="look", description="", input=CityArgs, execute=look)])
    provider = ScriptedProvider([tool_calls(("c1", "look", {"city": "a"})), "done"])
    await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert seen == [("s", "c1", False)]
