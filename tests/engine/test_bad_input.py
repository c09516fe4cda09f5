"""Bad input gets a clear, typed error and loses nothing: the stored checkpoint stays as it was."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lousho import (
    AbortSignal,
    Agent,
    AgentExecutor,
    Checkpoint,
    ConfigurationError,
    CorruptCheckpointError,
    InvalidDecisionError,
    InvalidSessionIdError,
    Message,
    SDKError,
    ToolCall,
    create_agent,
    memory_store,
    resume_after_approval,
)
from lousho.errors import InvalidInputError
from lousho.inputs import materialize_accepted, start_session
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryStore
from lousho.testing.store_contract.samples import sample_snapshot
from tests.engine.helpers import assert_valid_transcript
from tests.fixtures.core import ToolLog, charge_tool, weather_tool

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


# -- input that would break the transcript (issue #21): refused at the boundary, nothing written -------------

CALL = {"id": "c1", "name": "weather", "arguments": {"city": "Lisbon"}}
UNENCODABLE: list[Any] = [  # lone surrogates: what a JSON escape such as "\ud800" decodes to (issue #31)
    "\ud800 hi",
    {"role": "user", "content": "fine \udfff"},
    ["ok", Message.user("half an emoji: \ud83d")],
    [Message.system("Be \ud800 terse."), Message.user("hi")],
]
WRONG_SHAPES: list[Any] = [123, [1, 2], {"foo": "bar"}, [["hi"]], b"hi", {"role": "user", "content": 5}, 1.5]
BREAKS_THE_TRANSCRIPT: list[Any] = [
    {"role": "tool", "content": '{"forecast": "sun"}', "tool_call_id": "c1", "name": "weather"},
    [{"role": "user", "content": "hi"}, {"role": "tool", "content": "{}", "tool_call_id": "c9"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}],
    Message.assistant(tool_calls=[ToolCall(id="c1", name="weather", arguments={"city": "Lisbon"})]),
    {"role": "user", "content": "hi", "tool_calls": [CALL]},
    "",
    "   ",
    {"role": "user"},
    ["hi", {"role": "assistant", "content": ""}],
    *UNENCODABLE,
]
NOTHING_TO_START_FROM: list[Any] = [None, [], [Message.system("You are a pirate.")], [{"role": "assistant", "content": "Hello!"}]]


def _stored(store: MemoryStore, session_id: str = "s") -> tuple[str | None, int]:
    """The session's stored checkpoint as JSON and the length of its history: what a write would change."""
    checkpoint = store.checkpoints.load(session_id)
    return (None if checkpoint is None else checkpoint.model_dump_json()), len(store.checkpoints.history(session_id))


@pytest.mark.parametrize("bad", WRONG_SHAPES + BREAKS_THE_TRANSCRIPT + NOTHING_TO_START_FROM)
async def test_input_that_would_break_a_new_sessions_transcript_is_refused_and_nothing_is_written(
    store: MemoryStore, agent: Agent, bad: Any
) -> None:
    provider = ScriptedProvider(["hi"])

    with pytest.raises(InvalidInputError) as raised:
        await AgentExecutor.execute(agent=agent, input=bad, provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert isinstance(raised.value, SDKError) and raised.value.code == "LOUSHO_INVALID_INPUT"
    assert "input is text, a message, a message dict" in str(raised.value).lower()  # says what is accepted
    assert store.checkpoints.load("s") is None and store.checkpoints.sessions() == []
    assert provider.calls == []


@pytest.mark.parametrize("bad", NOTHING_TO_START_FROM)
async def test_a_new_session_needs_a_user_message_first_and_the_error_says_so(agent: Agent, bad: Any) -> None:
    provider = ScriptedProvider(["hi"])

    with pytest.raises(InvalidInputError, match="a new session needs a user message to start from"):
        await AgentExecutor.execute(agent=agent, input=bad, provider=provider)  # not saved: a new session each time

    assert provider.calls == []


@pytest.mark.parametrize("bad", WRONG_SHAPES + BREAKS_THE_TRANSCRIPT + [[Message.system("Now be a pirate.")]])
@pytest.mark.parametrize("status", ["finished", "in-progress"])
async def test_input_that_would_break_a_stored_sessions_transcript_is_refused_and_the_checkpoint_stays_as_it_was(
    store: MemoryStore, log: ToolLog, bad: Any, status: str
) -> None:
    agent = Agent(name="a", model="m", instructions="You plan trips.", tools=[weather_tool(log)])
    signal = AbortSignal()
    if status == "in-progress":
        signal.abort()  # aborted before its first model turn: in-progress, nothing pending
    provider = ScriptedProvider(["first answer", "never sent"])
    await AgentExecutor.execute(agent=agent, input="hello", provider=provider, session_id="s", checkpoint_store=store.checkpoints, signal=signal)
    before, asked = _stored(store), len(provider.calls)
    assert store.checkpoints.load("s").status == status  # type: ignore[union-attr]

    with pytest.raises(InvalidInputError):
        await AgentExecutor.execute(agent=agent, input=bad, provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert _stored(store) == before and len(provider.calls) == asked


async def test_on_a_stored_session_system_messages_alone_are_refused_and_empty_input_just_resumes(
    store: MemoryStore, agent: Agent
) -> None:
    provider = ScriptedProvider(["resumed"])
    signal = AbortSignal()
    signal.abort()
    await AgentExecutor.execute(agent=agent, input="hello", provider=provider, session_id="s", checkpoint_store=store.checkpoints, signal=signal)

    with pytest.raises(InvalidInputError, match="system messages in input are not sent"):
        await AgentExecutor.execute(agent=agent, input=Message.system("Be a pirate."), provider=provider, session_id="s", checkpoint_store=store.checkpoints)
    result = await AgentExecutor.execute(agent=agent, input=[], provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert result.finish_reason == "stop" and [m.content for m in result.messages] == ["You plan trips.", "hello", "resumed"]


async def test_tool_calls_and_results_in_input_are_refused_unless_they_re_send_the_sessions_own_history(
    store: MemoryStore, agent: Agent
) -> None:
    provider = ScriptedProvider([tool_calls(("c1", "weather", {"city": "Lisbon"})), "sunny", "second answer"])
    first = await AgentExecutor.execute(agent=agent, input="hello", provider=provider, session_id="s", checkpoint_store=store.checkpoints)
    history = [m.model_dump() for m in first.messages]

    with pytest.raises(InvalidInputError, match="answers no call"):  # the results alone, without their call
        await AgentExecutor.execute(agent=agent, input=[history[3], {"role": "user", "content": "and tomorrow?"}],
                                    provider=provider, session_id="s", checkpoint_store=store.checkpoints)
    second = await AgentExecutor.execute(agent=agent, input=[*history, {"role": "user", "content": "and tomorrow?"}],
                                         provider=provider, session_id="s", checkpoint_store=store.checkpoints)

    assert second.messages[: len(first.messages)] == first.messages
    assert [m.content for m in second.messages[len(first.messages) :]] == ["and tomorrow?", "second answer"]
    assert_valid_transcript(provider.calls[-1].messages)


@pytest.mark.parametrize("bad", [123, {"foo": "bar"}, {"role": "tool", "content": "{}", "tool_call_id": "c1"}, None])
async def test_create_agent_send_and_stream_refuse_bad_input_the_same_way(bad: Any) -> None:
    durable = create_agent(provider=ScriptedProvider(["hi"]), instructions="Be brief.", store=memory_store())

    with pytest.raises(InvalidInputError):
        await durable.send(bad, session_id="s")
    with pytest.raises(InvalidInputError):
        async for _ in durable.stream(bad, session_id="s"):
            pass

    assert durable.store.checkpoints.sessions() == []


async def test_text_that_cannot_be_stored_is_refused_naming_where_without_echoing_it(store: MemoryStore, agent: Agent) -> None:
    provider = ScriptedProvider(["hi"])

    with pytest.raises(InvalidInputError) as raised:
        await AgentExecutor.execute(agent=agent, input=["hello", "so \ud800 secret"], provider=provider, session_id="s",
                                    checkpoint_store=store.checkpoints)

    assert "message 2 (user) holds text that cannot be stored at character 3 of its content" in str(raised.value)
    assert "secret" not in str(raised.value) and "\ud800" not in str(raised.value)
    assert store.checkpoints.sessions() == [] and provider.calls == []


@pytest.mark.parametrize("state", [{"note": "\ud800"}, {"when": object()}, ["ok", {"deep": ["\udfff"]}]])
async def test_a_business_state_that_cannot_be_stored_is_invalid_input_and_nothing_is_written(
    store: MemoryStore, agent: Agent, state: Any
) -> None:
    with pytest.raises(InvalidInputError, match="business_state cannot be stored"):
        await AgentExecutor.execute(agent=agent, input="hi", provider=ScriptedProvider(["x"]), session_id="s",
                                    checkpoint_store=store.checkpoints, business_state=state)

    assert store.checkpoints.sessions() == []


def test_a_fleet_session_opens_with_the_same_transcript_as_one_in_process() -> None:
    given = [Message.system("You are terse."), Message.user("hi")]
    accepted = Checkpoint(session_id="s", agent_name="a", pending_input=given, business_state={"k": 1})

    for instructions in ("You plan trips.", ""):
        in_process = start_session("s", instructions, given, {"k": 1})
        on_the_fleet = materialize_accepted(accepted, instructions)
        assert on_the_fleet.messages == in_process.messages, instructions
        assert (on_the_fleet.run_start, on_the_fleet.run_input_count) == (in_process.run_start, in_process.run_input_count)
        assert on_the_fleet.pending_input == []


# -- decisions are exactly True or False (issue #21) ----------------------------------------------------------

LAX_DECISIONS: list[Any] = ["no", 0, "false", "off", "yes", 1, None, "maybe", 2, "true", 1.0]


async def _paused(store: MemoryStore, log: ToolLog) -> tuple[Agent, str, tuple[str | None, int]]:
    agent = Agent(name="a", model="m", tools=[charge_tool(log)])
    provider = ScriptedProvider([tool_calls(("pay", "charge_card", {"amount": 5}))])
    paused = await AgentExecutor.execute(agent=agent, input="pay", provider=provider, session_id="s",
                                         checkpoint_store=store.checkpoints, approval_store=store.approvals)
    assert paused.approval_id is not None
    return agent, paused.approval_id, _stored(store)


@pytest.mark.parametrize("approved", LAX_DECISIONS)
async def test_a_decision_that_is_not_a_bool_is_refused_and_the_approval_stays_pending(
    store: MemoryStore, log: ToolLog, approved: Any
) -> None:
    agent, approval_id, before = await _paused(store, log)
    provider = ScriptedProvider(["done"])
    durable = create_agent(provider=provider, agent=agent, store=store)

    with pytest.raises(InvalidDecisionError, match="True or False"):
        await resume_after_approval({"id": approval_id, "approved": approved}, store.approvals, agent, provider, {}, store.checkpoints)
    with pytest.raises(InvalidDecisionError):
        await durable.approvals.resolve(approval_id, approved=approved)
    with pytest.raises(InvalidDecisionError):
        store.approvals.decide(approval_id, approved, None)

    assert store.approvals.load(approval_id).status == "pending"  # type: ignore[union-attr]
    assert _stored(store) == before and log.runs == {} and provider.calls == []


@pytest.mark.parametrize("approved", ["no", 0, "yes", 1, None])
def test_every_store_refuses_a_decision_that_is_not_a_bool(any_store: Any, approved: Any) -> None:
    any_store.approvals.save(sample_snapshot("appr_lax"))

    with pytest.raises(InvalidDecisionError):
        any_store.approvals.decide("appr_lax", approved, None)

    assert any_store.approvals.load("appr_lax").status == "pending"


async def test_nul_characters_in_input_and_answers_round_trip_on_every_store(any_store: Any) -> None:
    """NUL is valid Unicode, and every store keeps its JSON escape (PostgreSQL's text refuses a raw NUL, never
    sees one): it is kept, not refused (issue #31)."""
    durable = create_agent(provider=ScriptedProvider(["an\x00swer"]), instructions="Answer.", store=any_store)

    await durable.send("nul \x00 here", session_id="nul")

    stored = any_store.checkpoints.load("nul")
    assert [m.content for m in stored.messages] == ["Answer.", "nul \x00 here", "an\x00swer"]


async def test_a_tool_result_with_a_lone_surrogate_is_stored_as_its_json_escape_and_the_run_goes_on() -> None:
    from pydantic import BaseModel

    from lousho import define_tool

    class Text(BaseModel):
        text: str

    mangle = define_tool(name="mangle", description="Cut text", input=Text, execute=lambda args, ctx: {"cut": args.text[:1] + "\ud83d"})
    store = memory_store()
    durable = create_agent(provider=ScriptedProvider([tool_calls(("c1", "mangle", {"text": "😀"})), "done"]),
                           agent=Agent(name="a", model="m", tools=[mangle]), store=store)

    result = await durable.send("cut it", session_id="t")

    tool_message = store.checkpoints.load("t").messages[-2]  # type: ignore[union-attr]
    assert result.text == "done" and tool_message.content == '{"cut": "\\ud83d\\ude00\\ud83d"}'
    assert tool_message.result() == {"cut": "😀\ud83d"}
