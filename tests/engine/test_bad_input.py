"""Bad input gets a clear, typed error and loses nothing: the stored checkpoint stays as it was."""

from __future__ import annotations

import json

import pytest

from lousho import (
    Agent,
    AgentExecutor,
    ConfigurationError,
    CorruptCheckpointError,
    InvalidSessionIdError,
)
from lousho.providers import ScriptedProvider
from lousho.stores.memory import MemoryStore

VALID = {"session_id": "s", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({**VALID, "messages": "oops"}), "wrong shape"),
        (json.dumps({**VALID, "schema_version": 99}), "newer than this lousho reads"),
        (json.dumps({**VALID, "session_id": "someone-else"}), "belongs to session 'someone-else'"),
    ],
)
async def test_a_corrupt_checkpoint_raises_a_typed_error_and_is_never_overwritten(
    store: MemoryStore, agent: Agent, raw: str, problem: str
) -> None:
    store.checkpoints.put_raw("s", raw)
    provider = ScriptedProvider(["hi"])

    with pytest.raises(CorruptCheckpointError) as raised:
        await AgentExecutor.execute(agent=agent, input="hello", provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert raised.value.session_id == "s" and problem in str(raised.value)
    assert store.checkpoints._latest["s"] == raw
    assert provider.calls == []


@pytest.mark.parametrize("session_id", ["", "a" * 201, "chat/42", "{tag}", "a b", "*", "ünï", "x\n"])
async def test_a_session_id_with_odd_characters_is_refused(store: MemoryStore, agent: Agent, session_id: str) -> None:
    with pytest.raises(InvalidSessionIdError, match="not allowed"):
        await AgentExecutor.execute(agent=agent, input="hi", provider=ScriptedProvider(["x"]), session_id=session_id, checkpoint_store=store.checkpoints)


@pytest.mark.parametrize("session_id", ["chat-42", "user:7:chat", "a@b.com", "3f2b9c1e-0d5a-4c8e-9a7b-1e2d3c4b5a69", "trip.fork-1"])
async def test_ordinary_session_ids_are_accepted(store: MemoryStore, agent: Agent, session_id: str) -> None:
    result = await AgentExecutor.execute(agent=agent, input="hi", provider=ScriptedProvider(["x"]), session_id=session_id, checkpoint_store=store.checkpoints)
    assert result.session_id == session_id


async def test_a_checkpoint_store_without_a_session_id_is_a_configuration_error(store: MemoryStore, agent: Agent) -> None:
    with pytest.raises(ConfigurationError, match="session_id"):
        await AgentExecutor.execute(agent=agent, input="hi", provider=ScriptedProvider(["x"]), checkpoint_store=store.checkpoints)


def test_agent_limits_are_checked_when_it_is_defined() -> None:
    with pytest.raises(ConfigurationError, match="max_steps"):
        Agent(name="a", model="m", max_steps=0)
    with pytest.raises(ConfigurationError, match="tool_concurrency"):
        Agent(name="a", model="m", tool_concurrency=0)


async def test_a_business_state_that_is_not_json_fails_before_anything_is_stored(store: MemoryStore, agent: Agent) -> None:
    with pytest.raises(ValueError):
        await AgentExecutor.execute(agent=agent, input="hi", provider=ScriptedProvider(["x"]), session_id="s",
                                    checkpoint_store=store.checkpoints, business_state={"when": object()})
    assert store.checkpoints.load("s") is None
