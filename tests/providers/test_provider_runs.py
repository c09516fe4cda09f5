"""Full runs of lousho's real engine on the OpenAI and Anthropic providers (official SDKs), against a
local HTTP server speaking each API. Each test runs once per API; the server's request log is the
proof of what was sent, and of which model turns were (not) asked again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lousho import Agent, create_agent, memory_store
from lousho.checkpoint import maybe_await
from lousho.errors import ProviderError
from lousho.events import Event
from lousho.providers.base import RetryPolicy
from lousho.testing.fake_llm_servers import (
    FakeLLMServer,
    RecordedRequest,
    call,
    cut_stream,
    failure,
    rate_limited,
    reply,
)

from .conftest import CityArgs, MakeProvider, ToolRuns

INSTRUCTIONS = "You plan trips."
QUESTION = "Weather in Lisbon and Porto?"
FAST_RETRY = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=2.0)


def result_json(result: dict[str, Any]) -> str:
    """A tool result as the transcript stores it (Message.tool_result)."""
    return json.dumps(result, ensure_ascii=False)


def sun(city: str) -> str:
    return result_json({"city": city, "forecast": "sun"})


def transcript_length(api: str, request: RecordedRequest) -> int:
    return len(request.messages)


async def collect(stream: Any) -> tuple[list[Event], BaseException | None]:
    """All events of a stream, and the exception that ended it (None when it finished)."""
    events: list[Event] = []
    try:
        async for event in stream:
            events.append(event)
    except Exception as exc:
        return events, exc
    return events, None


def deltas(events: list[Event]) -> list[str]:
    return [e.text for e in events if e.type == "text" and e.delta]


# -- a full run: what goes over the wire ------------------------------------------------------------


async def test_a_multi_turn_run_with_tools_sends_each_api_its_own_wire_format(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, runs: ToolRuns
) -> None:
    server.add(
        reply(
            "Let me check.",
            tool_calls=[call("call_1", "weather", {"city": "Lisbon"}), call("call_2", "weather", {"city": "Porto"})],
            usage=(20, 5),
        ),
        reply(tool_calls=[call("call_3", "weather", {"city": "Faro"})], usage=(30, 6)),
        reply("Sunny everywhere.", usage=(40, 7)),
    )
    store = memory_store()
    agent = create_agent(provider=make_provider("model-a"), store=store, name="planner", instructions=INSTRUCTIONS,
                         tools=[weather])  # fmt: skip

    result = await agent.send(QUESTION, session_id="trip")

    assert agent.definition.model == "model-a"  # create_agent took the provider's model
    assert (result.finish_reason, result.text) == ("stop", "Sunny everywhere.")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (90, 18)
    assert dict(runs.runs) == {"call_1": 1, "call_2": 1, "call_3": 1}
    assert [c.arguments for c in result.tool_calls] == [{"city": "Lisbon"}, {"city": "Porto"}, {"city": "Faro"}]
    requests = server.requests
    assert len(requests) == 3
    assert all(r.body["model"] == "model-a" and not r.stream for r in requests)
    last = requests[2].body
    schema = CityArgs.model_json_schema()
    if api == "openai":
        assert all(r.path == "/v1/chat/completions" for r in requests)
        assert last["tools"] == [
            {"type": "function", "function": {"name": "weather", "description": "Forecast for a city", "parameters": schema}}
        ]
        assert last["messages"] == [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lisbon"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Porto"}'}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": sun("Lisbon")},
            {"role": "tool", "tool_call_id": "call_2", "content": sun("Porto")},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_3", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Faro"}'}},
            ]},
            {"role": "tool", "tool_call_id": "call_3", "content": sun("Faro")},
        ]  # fmt: skip
    else:
        assert all(r.path == "/v1/messages" for r in requests)
        assert all(r.body["system"] == INSTRUCTIONS and r.body["max_tokens"] == 1024 for r in requests)
        assert last["tools"] == [{"name": "weather", "description": "Forecast for a city", "input_schema": schema}]
        assert last["messages"] == [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Lisbon"}},
                {"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Porto"}},
            ]},
            {"role": "user", "content": [  # consecutive results: one user message
                {"type": "tool_result", "tool_use_id": "call_1", "content": sun("Lisbon")},
                {"type": "tool_result", "tool_use_id": "call_2", "content": sun("Porto")},
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_3", "name": "weather", "input": {"city": "Faro"}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_3", "content": sun("Faro")}]},
        ]  # fmt: skip
    # each request is the one before it plus the new turn: nothing was re-ordered or lost
    assert requests[0].messages == last["messages"][: len(requests[0].messages)]
    assert requests[1].messages == last["messages"][: len(requests[1].messages)]


async def test_the_next_message_of_a_finished_conversation_goes_after_the_answers(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any
) -> None:
    server.add(reply("Hello!"), reply("Still here."))
    agent = create_agent(provider=make_provider(), store=memory_store(), instructions=INSTRUCTIONS, tools=[weather])
    await agent.send("Hi", session_id="chat")
    again = await agent.send("Are you there?", session_id="chat")
    assert again.text == "Still here."
    second = server.requests[1].messages
    if api == "openai":
        assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
        assert second[2] == {"role": "assistant", "content": "Hello!"}
    else:
        assert second == [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
            {"role": "user", "content": "Are you there?"},
        ]


# -- streaming -------------------------------------------------------------------------------------


async def test_a_streamed_run_yields_text_deltas_before_each_turn_is_checkpointed(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, runs: ToolRuns
) -> None:
    server.add(
        reply("Checking the forecast.", tool_calls=[call("call_1", "weather", {"city": "Lisbon"})], usage=(20, 5)),
        reply("Sunny in Lisbon, go!", usage=(40, 9)),
    )
    store = memory_store()
    agent = create_agent(provider=make_provider(), store=store, instructions=INSTRUCTIONS, tools=[weather])

    stream = agent.stream("Weather in Lisbon?", session_id="trip")
    events, error = await collect(stream)

    assert error is None
    kinds = [(e.type, getattr(e, "delta", None), getattr(e, "step", None)) for e in events]
    first_save = kinds.index(("checkpoint-saved", None, 1))
    turn_two_save = kinds.index(("checkpoint-saved", None, 2))
    before_first = [e for e in events[:first_save] if e.type == "text"]
    assert len(before_first) > 2 and all(e.delta for e in before_first[:-1])  # several deltas, then the whole text
    assert "".join(e.text for e in before_first[:-1]) == "Checking the forecast."
    assert before_first[-1].text == "Checking the forecast." and not before_first[-1].delta
    turn_two = [e for e in events[first_save:turn_two_save] if e.type == "text" and e.delta]
    assert "".join(e.text for e in turn_two) == "Sunny in Lisbon, go!"
    tool_events = [e for e in events if e.type == "tool-call"]
    assert [e.call.arguments for e in tool_events] == [{"city": "Lisbon"}]  # put together from fragments
    assert events[-1].type == "finished"
    assert stream.result is not None and stream.result.text == "Sunny in Lisbon, go!"
    assert (stream.result.usage.input_tokens, stream.result.usage.output_tokens) == (60, 14)  # from the streams' usage
    assert runs.runs["call_1"] == 1
    assert all(r.stream for r in server.requests) and len(server.requests) == 2
    if api == "openai":
        assert all(r.body["stream_options"] == {"include_usage": True} for r in server.requests)
    saved = await maybe_await(store.checkpoints.load("trip"))
    assert saved is not None and saved.status == "finished" and saved.messages[-1].content == "Sunny in Lisbon, go!"


async def test_a_stream_cut_mid_answer_is_retried_and_its_partial_text_is_not_kept(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any
) -> None:
    server.add(cut_stream("Partial answer that never ends", after=2), reply("A whole answer."))
    agent = create_agent(
        agent=Agent(name="planner", model="model-a", instructions=INSTRUCTIONS, tools=[weather], retry=FAST_RETRY),
        provider=make_provider(),
        store=memory_store(),
    )
    events, error = await collect(agent.stream("Hi", session_id="s"))
    assert error is None
    assert deltas(events)[:2] == ["Partial ", "answer "]
    retry = [e for e in events if e.type == "provider-retry"]
    assert len(retry) == 1 and retry[0].attempt == 1
    assert events.index(retry[0]) == 2  # right after the two deltas of the cut attempt
    assert "".join(deltas(events)[2:]) == "A whole answer."
    assert events[-1].type == "finished" and events[-1].text == "A whole answer."
    assert len(server.requests) == 2


# -- retries ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "send"])
async def test_a_rate_limit_is_retried_after_retry_after_then_the_run_finishes(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, streamed: bool
) -> None:
    server.add(rate_limited(retry_after=0.3), reply("Made it."))
    agent = create_agent(
        agent=Agent(name="planner", model="model-a", tools=[weather], retry=FAST_RETRY),
        provider=make_provider(),
        store=memory_store(),
    )
    if streamed:
        events, error = await collect(agent.stream("Hi", session_id="s"))
        assert error is None
    else:
        events = []
        result = await agent.send("Hi", session_id="s", on_event=events.append)
        assert result.text == "Made it."
    retries = [e for e in events if e.type == "provider-retry"]
    assert len(retries) == 1
    assert (retries[0].attempt, retries[0].status) == (1, 429)
    assert 0.3 <= retries[0].delay_s <= 0.45  # the server's Retry-After, and up to half that again (jitter)
    assert "429" in retries[0].error
    assert events[-1].type == "finished" and events[-1].finish_reason == "stop"
    assert len(server.requests) == 2  # the SDK retried nothing by itself (max_retries=0)


async def test_retries_are_bounded_then_the_error_is_raised(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any
) -> None:
    server.add(rate_limited(0), failure(503, "upstream busy"), rate_limited(0), reply("never asked"))
    agent = create_agent(
        agent=Agent(name="planner", model="model-a", tools=[weather], retry=FAST_RETRY),
        provider=make_provider(),
        store=memory_store(),
    )
    events: list[Event] = []
    with pytest.raises(ProviderError) as info:
        await agent.send("Hi", session_id="s", on_event=events.append)
    assert info.value.retryable and info.value.status == 429
    assert [e.status for e in events if e.type == "provider-retry"] == [429, 503]
    assert len(server.requests) == 3 and server.remaining == 1


# -- errors that fail the turn, and resuming after them ----------------------------------------------


async def test_a_400_fails_at_once_and_leaves_the_last_in_progress_checkpoint(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, runs: ToolRuns
) -> None:
    server.add(reply(tool_calls=[call("call_1", "weather", {"city": "Lisbon"})]), failure(400, "messages: bad shape"))
    store = memory_store()
    agent = create_agent(
        agent=Agent(name="planner", model="model-a", instructions=INSTRUCTIONS, tools=[weather], retry=FAST_RETRY),
        provider=make_provider(),
        store=store,
    )
    with pytest.raises(ProviderError) as info:
        await agent.send("Weather in Lisbon?", session_id="trip")
    error = info.value
    assert (error.retryable, error.status, error.code) == (False, 400, "LOUSHO_PROVIDER_ERROR")
    assert "HTTP 400" in str(error) and "messages: bad shape" in str(error) and "model-a" in str(error)
    assert len(server.requests) == 2  # not retried
    saved = await maybe_await(store.checkpoints.load("trip"))
    assert saved is not None and saved.status == "in-progress" and saved.step_index == 1
    assert saved.messages[-1].role == "tool" and saved.messages[-1].tool_call_id == "call_1"

    server.add(reply("Sunny in Lisbon."))
    resumed = await agent.resume("trip")
    assert resumed is not None and resumed.text == "Sunny in Lisbon."
    assert runs.runs["call_1"] == 1  # the recorded result was not re-run
    requests = server.requests
    assert len(requests) == 3
    assert requests[2].messages == requests[1].messages  # only the failed turn was asked again


async def test_a_stream_cut_that_fails_the_run_is_generated_again_on_resume_and_the_checkpointed_turn_is_not(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, runs: ToolRuns
) -> None:
    server.add(
        reply("Let me look.", tool_calls=[call("call_1", "weather", {"city": "Lisbon"})]),
        cut_stream("Partial answer that never ends", after=2),
    )
    store = memory_store()
    agent = create_agent(
        agent=Agent(
            name="planner", model="model-a", instructions=INSTRUCTIONS, tools=[weather], retry=RetryPolicy(max_attempts=1)
        ),
        provider=make_provider(),
        store=store,
    )
    events, error = await collect(agent.stream("Weather in Lisbon?", session_id="trip"))

    assert isinstance(error, ProviderError) and error.retryable
    assert deltas(events)[-2:] == ["Partial ", "answer "]  # streamed...
    assert not [e for e in events if e.type == "checkpoint-saved" and e.step == 2]  # ...but never checkpointed
    saved = await maybe_await(store.checkpoints.load("trip"))
    assert saved is not None and (saved.status, saved.step_index) == ("in-progress", 1)
    assert all(m.content != "Partial answer " for m in saved.messages)

    server.add(reply("Sunny in Lisbon."))
    again = agent.stream_resume("trip")
    events, error = await collect(again)
    assert error is None and again.result is not None and again.result.text == "Sunny in Lisbon."
    assert "".join(deltas(events)) == "Sunny in Lisbon."
    requests = server.requests
    assert len(requests) == 3
    assert requests[2].messages == requests[1].messages  # the cut turn generated again, from the same transcript
    assert [len(r.messages) for r in requests].count(len(requests[0].messages)) == 1  # turn 1 asked once
    assert runs.runs["call_1"] == 1


async def test_a_consumer_that_stops_mid_stream_loses_only_the_unsaved_turn(
    api: str, server: FakeLLMServer, make_provider: MakeProvider, weather: Any, runs: ToolRuns
) -> None:
    server.add(
        reply("Let me look.", tool_calls=[call("call_1", "weather", {"city": "Lisbon"})]),
        reply("This long answer is streamed slowly and nobody reads its end", chunk_delay_s=0.02),
        reply("Sunny in Lisbon."),
    )
    store = memory_store()
    agent = create_agent(provider=make_provider(), store=store, instructions=INSTRUCTIONS, tools=[weather])
    seen: list[Event] = []
    async with agent.stream("Weather in Lisbon?", session_id="trip") as stream:
        async for event in stream:
            seen.append(event)
            if event.type == "text" and event.delta and any(e.type == "tool-result" for e in seen):
                break  # the consumer dies in the middle of turn 2
    assert deltas(seen)[-1] == "This "
    saved = await maybe_await(store.checkpoints.load("trip"))
    assert saved is not None and (saved.status, saved.step_index) == ("in-progress", 1)

    # another process: a new provider and agent on the same store
    later = create_agent(provider=make_provider(), store=store, instructions=INSTRUCTIONS, tools=[weather])
    resumed = await later.resume("trip")
    assert resumed is not None and resumed.text == "Sunny in Lisbon."
    requests = server.requests
    assert len(requests) == 3
    assert requests[2].messages == requests[1].messages
    assert runs.runs["call_1"] == 1
