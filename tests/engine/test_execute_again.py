"""Reference: 'What happens when you call execute() again with the same session_id' — one test per rule."""

from __future__ import annotations

from typing import Any

import pytest

from lousho import (
    AbortSignal,
    Agent,
    AgentExecutor,
    Message,
    SessionAwaitingApprovalError,
    ToolContext,
    define_tool,
)
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryStore
from tests.engine.helpers import assert_valid_transcript, tool_results
from tests.fixtures.core import CityArgs, ToolLog, charge_tool, weather_tool


class Crash(BaseException):
    """Stands for the process dying: nothing in lousho catches it."""


def crash_on(log: ToolLog, call_id: str, times: int = 1) -> Any:
    """A weather tool that dies (like a killed process) the first `times` runs of `call_id`."""

    async def execute(args: CityArgs, ctx: ToolContext) -> dict[str, str]:
        log.record(ctx)
        if ctx.tool_call_id == call_id and log.runs[call_id] <= times:
            raise Crash(call_id)
        return {"city": args.city}

    return define_tool(name="weather", description="", input=CityArgs, execute=execute)


async def run(agent: Agent, store: MemoryStore, provider: ScriptedProvider, input: Any = "plan", **kw: Any) -> Any:
    return await AgentExecutor.execute(
        agent=agent, input=input, provider=provider, session_id="s", checkpoint_store=store.checkpoints,
        approval_store=store.approvals, **kw,
    )


async def crashed_run(store: MemoryStore, log: ToolLog) -> tuple[Agent, ScriptedProvider]:
    """A run that died while its second tool call ran: c1 is recorded, c2 and c3 are not."""
    agent = Agent(name="a", model="m", tools=[crash_on(log, "c2")])
    provider = ScriptedProvider(
        [tool_calls(("c1", "weather", {"city": "a"}), ("c2", "weather", {"city": "b"}), ("c3", "weather", {"city": "c"})), "done"]
    )
    with pytest.raises(Crash):
        await run(agent, store, provider)
    return agent, provider


async def test_unfinished_run_resumes_its_pending_calls_without_calling_the_model(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = await crashed_run(store, log)
    asked_before = len(provider.calls)

    result = await run(agent, store, provider, input=[])

    assert len(provider.calls) == asked_before + 1  # only the turn after the tool results
    assert provider.calls[-1].messages[-3:] == result.messages[-4:-1]
    assert tool_results(result.messages) == ["c1", "c2", "c3"]
    assert log.runs == {"c1": 1, "c2": 2, "c3": 1}


async def test_resumed_run_keeps_the_remaining_max_steps_and_usage(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[crash_on(log, "c2")], max_steps=2)
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "a"})), tool_calls(("c2", "weather", {"city": "b"})), tool_calls(("c3", "weather", {"city": "c"}))])
    with pytest.raises(Crash):
        await run(agent, store, provider)

    result = await run(agent, store, provider, input=[])

    assert result.finish_reason == "max-steps"
    assert result.steps == 2
    assert result.usage.input_tokens == 20  # two scripted turns of 10 tokens each, counted once
    assert len(provider.calls) == 2


async def test_new_input_is_appended_after_the_pending_tool_results(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = await crashed_run(store, log)

    result = await run(agent, store, provider, input="actually, make it Paris")

    roles = [(m.role, m.tool_call_id or m.content) for m in result.messages]
    assert roles[-5:] == [("tool", "c1"), ("tool", "c2"), ("tool", "c3"), ("user", "actually, make it Paris"), ("assistant", "done")]
    assert_valid_transcript(provider.calls[-1].messages)


async def test_resent_starting_input_is_a_retry_and_is_not_appended(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = await crashed_run(store, log)

    result = await run(agent, store, provider, input="plan")

    assert [m.content for m in result.messages if m.role == "user"] == ["plan"]


async def test_empty_input_just_resumes(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = await crashed_run(store, log)

    result = await run(agent, store, provider, input=[])

    assert result.finish_reason == "stop"
    assert [m.content for m in result.messages if m.role == "user"] == ["plan"]


async def test_finished_run_continues_as_a_conversation_with_counters_from_zero(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[weather_tool(log)])
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "a"})), "first answer", "second answer"])
    first = await run(agent, store, provider, input="hello")

    second = await run(agent, store, provider, input="and now?")

    assert first.steps == 2 and len(first.tool_calls) == 1
    assert second.steps == 1 and second.tool_calls == [] and second.usage.input_tokens == 10
    assert second.messages[: len(first.messages)] == first.messages
    assert [m.content for m in second.messages[-2:]] == ["and now?", "second answer"]


async def test_resent_history_is_recognised_and_not_duplicated(store: MemoryStore, agent: Agent) -> None:
    provider = ScriptedProvider(["first answer", "second answer"])
    first = await run(agent, store, provider, input="hello")

    resent = [*first.messages, Message.user("next question")]
    second = await run(agent, store, provider, input=resent)

    assert [m.content for m in second.messages] == ["You plan trips.", "hello", "first answer", "next question", "second answer"]


async def test_awaiting_approval_raises_and_touches_nothing(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[charge_tool(log)])
    provider = ScriptedProvider([tool_calls(("c1", "charge_card", {"amount": 9}))])
    paused = await run(agent, store, provider)
    before = store.checkpoints.load("s")

    with pytest.raises(SessionAwaitingApprovalError) as raised:
        await run(agent, store, provider, input="are you done?")

    assert raised.value.session_id == "s" and raised.value.approval_id == paused.approval_id
    assert store.checkpoints.load("s") == before
    assert len(provider.calls) == 1 and log.runs == {}


async def test_system_messages_in_input_are_ignored_on_a_stored_session(store: MemoryStore, agent: Agent) -> None:
    provider = ScriptedProvider(["one", "two"])
    await run(agent, store, provider, input="hello")

    result = await run(agent, store, provider, input=[Message.system("You are a pirate."), Message.user("again")])

    assert [m.content for m in result.messages if m.role == "system"] == ["You plan trips."]
    assert result.messages[-2].content == "again"


async def test_delete_starts_the_session_over(store: MemoryStore, agent: Agent) -> None:
    provider = ScriptedProvider(["one", "two"])
    await run(agent, store, provider, input="hello")
    store.checkpoints.delete("s")

    result = await run(agent, store, provider, input="fresh start")

    assert [m.content for m in result.messages] == ["You plan trips.", "fresh start", "two"]


async def test_an_aborted_run_continues_on_the_next_execute(store: MemoryStore, log: ToolLog) -> None:
    signal = AbortSignal()

    async def stop_here(args: CityArgs, ctx: ToolContext) -> str:
        signal.abort()
        await ctx.signal.wait()
        return "late"

    agent = Agent(name="a", model="m", tools=[define_tool(name="weather", description="", input=CityArgs, execute=stop_here)])
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "a"})), "redirected"])
    aborted = await run(agent, store, provider, signal=signal)

    result = await run(agent, store, provider, input="forget it, just say hi")

    assert aborted.finish_reason == "aborted"
    assert result.finish_reason == "stop"
    assert [m.role for m in result.messages[-3:]] == ["tool", "user", "assistant"]
    assert_valid_transcript(provider.calls[-1].messages)
