"""Reference: 'Resuming with a changed agent' and 'Compatibility with stored data' — one test per rule."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from pydantic import BaseModel

from lousho import (
    Agent,
    AgentDriftError,
    AgentDriftWarning,
    AgentExecutor,
    ResumeToolMissingError,
    ToolContext,
    define_tool,
    resume_after_approval,
)
from lousho.events import DriftEvent, Event
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryStore
from tests.engine.test_execute_again import Crash, crash_on
from tests.fixtures.core import ToolLog, charge_tool, weather_tool


@pytest.fixture
def store(any_store: Any) -> Any:
    """These rules hold on every store (issue #4): each test runs on each built-in store."""
    return any_store


async def crashed(store: MemoryStore, log: ToolLog, agent: Agent) -> ScriptedProvider:
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "a"}), ("c2", "weather", {"city": "b"})), "done"])
    with pytest.raises(Crash):
        await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints)
    return provider


def crashing_agent(log: ToolLog, **changes: Any) -> Agent:
    fields: dict[str, Any] = {"name": "a", "model": "model-1", "instructions": "Be brief.", "tools": [crash_on(log, "c2")]}
    fields.update(changes)
    return Agent(**fields)


async def resume(agent: Agent, store: MemoryStore, provider: ScriptedProvider, **kw: Any) -> Any:
    return await AgentExecutor.execute(agent=agent, input=[], provider=provider, session_id="s", checkpoint_store=store.checkpoints, **kw)


async def test_warn_names_what_changed_emits_a_drift_event_and_continues(store: MemoryStore, log: ToolLog) -> None:
    provider = await crashed(store, log, crashing_agent(log))
    events: list[Event] = []

    with pytest.warns(AgentDriftWarning, match="model 'model-1' -> 'model-2'"):
        result = await resume(crashing_agent(log, model="model-2"), store, provider, on_event=events.append)

    assert result.finish_reason == "stop"
    drift = [e for e in events if isinstance(e, DriftEvent)]
    assert len(drift) == 1 and drift[0].drift.model == ("model-1", "model-2")


async def test_error_rejects_with_agent_drift_and_leaves_the_checkpoint(store: MemoryStore, log: ToolLog) -> None:
    provider = await crashed(store, log, crashing_agent(log))
    before = store.checkpoints.load("s")

    with pytest.raises(AgentDriftError) as raised:
        await resume(crashing_agent(log, instructions="Be verbose."), store, provider, on_agent_drift="error")

    assert raised.value.code == "LOUSHO_AGENT_DRIFT"
    assert store.checkpoints.load("s") == before
    assert len(provider.calls) == 1 and log.runs == {"c1": 1, "c2": 1}


async def test_error_on_an_approval_puts_the_approval_back(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="model-1", tools=[charge_tool(log)])
    provider = ScriptedProvider([tool_calls(("pay", "charge_card", {"amount": 3})), "done"])
    paused = await AgentExecutor.execute(
        agent=agent, input="pay", provider=provider, session_id="s", checkpoint_store=store.checkpoints, approval_store=store.approvals
    )
    changed = Agent(name="a", model="model-2", tools=[charge_tool(log)])

    with pytest.raises(AgentDriftError):
        await resume_after_approval({"id": paused.approval_id, "approved": True}, store.approvals, changed, provider,
                                    {"on_agent_drift": "error"}, store.checkpoints)

    assert [a.id for a in store.approvals.pending()] == [paused.approval_id]
    final = await resume_after_approval({"id": paused.approval_id, "approved": True}, store.approvals, agent, provider, {}, store.checkpoints)
    assert final.finish_reason == "stop" and log.runs["pay"] == 1


async def test_ignore_does_nothing(store: MemoryStore, log: ToolLog) -> None:
    provider = await crashed(store, log, crashing_agent(log))
    events: list[Event] = []

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = await resume(crashing_agent(log, model="model-2"), store, provider, on_agent_drift="ignore", on_event=events.append)

    assert result.finish_reason == "stop"
    assert not any(isinstance(e, DriftEvent) for e in events)


async def test_changing_only_a_tools_code_is_not_drift(store: MemoryStore, log: ToolLog) -> None:
    provider = await crashed(store, log, crashing_agent(log))
    rewritten = define_tool(name="weather", description="new code", input=crash_on(log, "x").input, execute=lambda a, c: "new")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = await resume(crashing_agent(log, tools=[rewritten]), store, provider)

    assert result.finish_reason == "stop"


async def test_drift_lists_tools_added_removed_and_changed(store: MemoryStore, log: ToolLog) -> None:
    class Other(BaseModel):
        q: str

    class NewShape(BaseModel):
        city: str
        days: int = 1

    provider = await crashed(store, log, crashing_agent(log, tools=[crash_on(log, "c2"), charge_tool(log, needs_approval=False)]))
    changed_weather = define_tool(name="weather", description="", input=NewShape, execute=lambda a, c: "x")
    search = define_tool(name="search", description="", input=Other, execute=lambda a, c: "x")
    events: list[Event] = []

    with pytest.warns(AgentDriftWarning):
        await resume(crashing_agent(log, tools=[changed_weather, search]), store, provider, on_event=events.append)

    drift = next(e for e in events if isinstance(e, DriftEvent)).drift
    assert (drift.tools_added, drift.tools_removed, drift.tools_changed) == (["search"], ["charge_card"], ["weather"])


@pytest.mark.parametrize("policy", ["warn", "error", "ignore"])
async def test_a_pending_call_to_a_missing_tool_always_rejects(store: MemoryStore, log: ToolLog, policy: Any) -> None:
    provider = await crashed(store, log, crashing_agent(log))
    before = store.checkpoints.load("s")

    with pytest.raises(ResumeToolMissingError) as raised:
        await resume(crashing_agent(log, tools=[]), store, provider, on_agent_drift=policy)

    assert raised.value.code == "LOUSHO_RESUME_TOOL_MISSING" and "weather" in str(raised.value)
    assert store.checkpoints.load("s") == before


async def test_an_approved_call_to_a_missing_tool_rejects(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="a", model="m", tools=[charge_tool(log)])
    provider = ScriptedProvider([tool_calls(("pay", "charge_card", {"amount": 3}))])
    paused = await AgentExecutor.execute(
        agent=agent, input="pay", provider=provider, session_id="s", checkpoint_store=store.checkpoints, approval_store=store.approvals
    )

    with pytest.raises(ResumeToolMissingError):
        await resume_after_approval({"id": paused.approval_id, "approved": True}, store.approvals, Agent(name="a", model="m"),
                                    provider, {"on_agent_drift": "ignore"}, store.checkpoints)
    assert log.runs == {}


async def test_a_checkpoint_without_fingerprint_resumes_without_a_warning(store: MemoryStore, log: ToolLog) -> None:
    provider = await crashed(store, log, crashing_agent(log))
    stored = store.checkpoints.load("s")
    assert stored is not None
    store.checkpoints.put_raw("s", stored.model_copy(update={"fingerprint": None}).model_dump_json(exclude={"fingerprint"}))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = await resume(crashing_agent(log, model="another-model"), store, provider)

    assert result.finish_reason == "stop"


async def test_a_checkpoint_without_status_is_in_progress(store: MemoryStore, log: ToolLog) -> None:
    provider = await crashed(store, log, crashing_agent(log))
    stored = store.checkpoints.load("s")
    assert stored is not None
    store.checkpoints.put_raw("s", stored.model_dump_json(exclude={"status"}))

    result = await resume(crashing_agent(log), store, provider)

    assert result.finish_reason == "stop" and log.runs["c2"] == 2


async def test_a_dynamic_agent_saves_run_config_and_a_crash_resume_uses_it(store: MemoryStore, log: ToolLog) -> None:
    chosen: list[dict[str, Any]] = []

    def model_for(ctx: dict[str, Any]) -> str:
        chosen.append(ctx)
        return "big-model" if ctx.get("tier") == "gold" else "small-model"

    def tools_for(ctx: dict[str, Any]) -> list[Any]:
        return [crash_on(log, "c2")] if ctx.get("tier") == "gold" else []

    agent = Agent(name="dyn", model=model_for, instructions=lambda ctx: f"Serve a {ctx.get('tier')} customer.", tools=tools_for)
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "a"}), ("c2", "weather", {"city": "b"})), "done"])
    with pytest.raises(Crash):
        await AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store.checkpoints, context={"tier": "gold"})

    stored = store.checkpoints.load("s")
    assert stored is not None and stored.run_config == {"ctx": {"tier": "gold"}, "model": "big-model"}
    result = await AgentExecutor.execute(agent=agent, input=[], provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert result.finish_reason == "stop"
    assert provider.calls[-1].model == "big-model"
    assert len(chosen) == 1  # the model was not chosen again: the saved one was used


def test_tool_context_signal_is_usable_in_sync_tools(log: ToolLog) -> None:
    ctx = ToolContext(tool_call_id="x", session_id=None)
    assert ctx.signal.aborted is False
    assert weather_tool(log).name == "weather"
