"""Tools (sync or async, validated arguments, unknown names) and the agent's hooks."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from lousho import Agent, AgentExecutor, ModelRequest, ModelResponse, ToolContext, define_tool
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryStore
from tests.fixtures.core import CityArgs, ToolLog, weather_tool


async def run(agent: Agent, store: MemoryStore, provider: ScriptedProvider) -> Any:
    return await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)


async def test_a_sync_tool_runs_off_the_event_loop_thread(store: MemoryStore) -> None:
    threads: list[int] = []

    def sync_tool(args: CityArgs, ctx: ToolContext) -> str:
        threads.append(threading.get_ident())
        return args.city.upper()

    agent = Agent(name="a", model="m", tools=[define_tool(name="up", description="", input=CityArgs, execute=sync_tool)])
    result = await run(agent, store, ScriptedProvider([tool_calls(("c1", "up", {"city": "oslo"})), "done"]))

    assert result.messages[-2].result() == "OSLO"
    assert threads != [threading.get_ident()]


async def test_invalid_arguments_become_an_error_result_the_model_reads(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[weather_tool(log)])
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": 42, "extra": True})), "sorry"])

    result = await run(agent, store, provider)

    error = provider.calls[1].messages[-1].result()
    assert result.finish_reason == "stop" and "city" in error["error"] and "note" in error
    assert log.runs == {}


async def test_an_unknown_tool_becomes_an_error_result(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[weather_tool(log)])
    provider = ScriptedProvider([tool_calls(("c1", "teleport", {})), "ok"])

    result = await run(agent, store, provider)

    assert result.messages[-2].result() == {"error": "unknown tool 'teleport'", "note": "Available tools: weather."}


async def test_a_tool_exception_becomes_an_error_result(store: MemoryStore) -> None:
    def broken(args: CityArgs, ctx: ToolContext) -> str:
        raise TimeoutError("the weather service timed out")

    agent = Agent(name="a", model="m", tools=[define_tool(name="w", description="", input=CityArgs, execute=broken)])
    result = await run(agent, store, ScriptedProvider([tool_calls(("c1", "w", {"city": "x"})), "ok"]))

    assert result.messages[-2].result()["error"] == "TimeoutError: the weather service timed out"


async def test_a_pydantic_result_is_stored_as_json(store: MemoryStore) -> None:
    agent = Agent(name="a", model="m", tools=[define_tool(name="echo", description="", input=CityArgs, execute=lambda a, c: a)])
    result = await run(agent, store, ScriptedProvider([tool_calls(("c1", "echo", {"city": "x"})), "ok"]))

    assert result.messages[-2].result() == {"city": "x"}


async def test_hooks_run_in_order_and_may_replace_what_they_get(store: MemoryStore, log: ToolLog) -> None:
    seen: list[str] = []

    async def before_model(request: ModelRequest) -> ModelRequest:
        seen.append(f"before_model:{request.step}")
        return request.model_copy(update={"model": "routed-model"})

    def after_model(response: ModelResponse) -> None:
        seen.append("after_model")

    def before_tool(call: Any, ctx: ToolContext) -> None:
        seen.append(f"before_tool:{call.id}")

    async def after_tool(call: Any, result: Any) -> Any:
        seen.append(f"after_tool:{call.id}")
        return {"redacted": True}

    agent = Agent(name="a", model="m", tools=[weather_tool(log)], before_model=before_model, after_model=after_model,
                  before_tool=before_tool, after_tool=after_tool)
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "x"})), "ok"])
    result = await run(agent, store, provider)

    assert seen == ["before_model:1", "after_model", "before_tool:c1", "after_tool:c1", "before_model:2", "after_model"]
    assert provider.calls[0].model == "routed-model"
    assert result.messages[-2].result() == {"redacted": True}


@pytest.mark.parametrize("hook", ["before_model", "after_model", "before_tool", "after_tool"])
async def test_a_hook_that_raises_rejects_the_run(store: MemoryStore, log: ToolLog, hook: str) -> None:
    def refuse(*args: Any) -> None:
        raise PermissionError(f"{hook} refused")

    agent = Agent(name="a", model="m", tools=[weather_tool(log)], **{hook: refuse})
    with pytest.raises(PermissionError, match=hook):
        await run(agent, store, ScriptedProvider([tool_calls(("c1", "weather", {"city": "x"})), "ok"]))

    stored = store.checkpoints.load("s")
    assert stored is None or stored.status == "in-progress"


async def test_duplicate_or_empty_call_ids_from_a_model_are_made_unique(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[weather_tool(log)])
    provider = ScriptedProvider([tool_calls(("", "weather", {"city": "x"}), ("dup", "weather", {"city": "y"}), ("dup", "weather", {"city": "z"})), "ok"])

    result = await run(agent, store, provider)

    ids = [c.id for c in next(m for m in result.messages if m.tool_calls).tool_calls]
    assert len(set(ids)) == 3 and all(ids)
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ids


async def test_a_run_without_a_store_is_not_saved_but_completes(log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[weather_tool(log)])
    result = await AgentExecutor.execute(agent=agent, input="go", provider=ScriptedProvider([tool_calls(("c1", "weather", {"city": "x"})), "ok"]))

    assert result.finish_reason == "stop" and result.steps == 2 and len(result.tool_calls) == 1
