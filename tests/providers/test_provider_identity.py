"""The provider's model id is part of the agent's identity: it goes into the fingerprint, a resume
with another model is drift, and a dynamic agent's chosen model is saved in `run_config`."""

from __future__ import annotations

from typing import Any

import pytest

from lousho import Agent, AgentDriftWarning, create_agent, memory_store
from lousho.checkpoint import maybe_await
from lousho.errors import AgentDriftError, ProviderError
from lousho.testing.fake_llm_servers import FakeLLMServer, call, failure, reply

from .conftest import MakeProvider, ToolRuns

INSTRUCTIONS = "You plan trips."


async def crashed_run(server: FakeLLMServer, agent: Any) -> None:
    """A run whose first turn (a tool call) is checkpointed and whose second turn fails."""
    server.add(reply(tool_calls=[call("call_1", "weather", {"city": "Lisbon"})]), failure(400, "try later"))
    with pytest.raises(ProviderError):
        await agent.send("Weather in Lisbon?", session_id="trip")


async def test_resuming_with_another_model_warns_and_the_new_model_is_asked(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, runs: ToolRuns
) -> None:
    store = memory_store()
    first = create_agent(provider=make_provider("model-a"), store=store, instructions=INSTRUCTIONS, tools=[weather])
    await crashed_run(server, first)
    saved = await maybe_await(store.checkpoints.load("trip"))
    assert saved is not None and saved.fingerprint is not None and saved.fingerprint.model == "model-a"

    server.add(reply("Sunny."))
    second = create_agent(provider=make_provider("model-b"), store=store, instructions=INSTRUCTIONS, tools=[weather])
    with pytest.warns(AgentDriftWarning, match="model 'model-a' -> 'model-b'"):
        resumed = await second.resume("trip")
    assert resumed is not None and resumed.text == "Sunny."
    assert [r.body["model"] for r in server.requests] == ["model-a", "model-a", "model-b"]
    latest = await maybe_await(store.checkpoints.load("trip"))
    assert latest is not None and latest.fingerprint is not None and latest.fingerprint.model == "model-b"
    assert runs.runs["call_1"] == 1


async def test_resuming_with_another_model_and_on_agent_drift_error_asks_nothing(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any
) -> None:
    store = memory_store()
    first = create_agent(provider=make_provider("model-a"), store=store, instructions=INSTRUCTIONS, tools=[weather])
    await crashed_run(server, first)
    before = await maybe_await(store.checkpoints.load("trip"))
    strict = create_agent(provider=make_provider("model-b"), store=store, instructions=INSTRUCTIONS, tools=[weather],
                          on_agent_drift="error")  # fmt: skip
    with pytest.raises(AgentDriftError, match="model-a"):
        await strict.resume("trip")
    assert len(server.requests) == 2
    assert await maybe_await(store.checkpoints.load("trip")) == before


async def test_a_dynamic_agent_saves_its_chosen_model_and_a_resume_keeps_it(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, runs: ToolRuns
) -> None:
    router = Agent(name="router", model=lambda ctx: f"model-{ctx['tier']}", instructions=INSTRUCTIONS, tools=[weather])
    store = memory_store()
    agent = create_agent(agent=router, provider=make_provider("model-default"), store=store)
    server.add(reply(tool_calls=[call("call_1", "weather", {"city": "Lisbon"})]), failure(400, "try later"))
    with pytest.raises(ProviderError):
        await agent.send("Weather in Lisbon?", session_id="trip", context={"tier": "big"})
    saved = await maybe_await(store.checkpoints.load("trip"))
    assert saved is not None and saved.run_config == {"ctx": {"tier": "big"}, "model": "model-big"}
    assert saved.fingerprint is not None and saved.fingerprint.model == "model-big"

    server.add(reply("Sunny."))
    resumed = await agent.resume("trip", context={"tier": "small"})  # the saved run_config wins: no drift
    assert resumed is not None and resumed.text == "Sunny."
    assert [r.body["model"] for r in server.requests] == ["model-big"] * 3  # the chosen model, not the provider's
    assert runs.runs["call_1"] == 1


async def test_create_agent_takes_the_providers_model(make_provider: MakeProvider) -> None:
    provider = make_provider("model-x")
    assert provider.model == "model-x"
    assert create_agent(provider=provider).definition.model == "model-x"
    assert create_agent(provider=provider, model="model-y").definition.model == "model-y"
