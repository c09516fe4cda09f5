"""create_agent(): send, stream, resume, session, fork and approvals over one store."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from lousho import (
    Agent,
    ConfigurationError,
    ProviderError,
    SessionAwaitingApprovalError,
    ToolContext,
    define_tool,
    get_checkpoint_history,
)
from lousho.agent import DurableAgent, create_agent
from lousho.events import ApprovalRequestedEvent, CheckpointSavedEvent, Event, FinishedEvent
from lousho.providers.scripted import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryStore
from tests.fixtures.core import CityArgs, ToolLog, charge_tool, weather_tool

WEATHER = ("call_weather", "weather", {"city": "Oslo"})


def planner(log: ToolLog, store: MemoryStore | None, answers: list[Any], **options: Any) -> DurableAgent:
    return create_agent(
        provider=ScriptedProvider(answers),
        store=store,
        name="planner",
        model="test-model",
        instructions="You plan trips.",
        tools=[weather_tool(log), charge_tool(log)],
        **options,
    )


# -- send and resume ---------------------------------------------------------------------


async def test_send_with_session_id_is_checkpointed(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(WEATHER), "Pack sunscreen."])

    result = await agent.send("Plan my trip", session_id="trip")

    assert (result.finish_reason, result.text, result.session_id) == ("stop", "Pack sunscreen.", "trip")
    saved = store.checkpoints.load("trip")
    assert saved is not None and saved.status == "finished" and saved.messages == result.messages
    assert agent.definition.name == "planner" and agent.store is store


async def test_send_continues_the_sessions_conversation(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, ["Hello.", "Three people, noted."])

    await agent.send("Book a table for 2", session_id="chat")
    again = await agent.send("Make it 3 people", session_id="chat")

    assert [m.content for m in again.messages if m.role == "user"] == ["Book a table for 2", "Make it 3 people"]
    assert again.steps == 1


async def test_send_without_session_id_saves_nothing(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(WEATHER), "Done."])

    result = await agent.send("Plan my trip")

    assert result.finish_reason == "stop"
    assert store.checkpoints.sessions() == []


async def test_agent_without_store_runs_plain(log: ToolLog) -> None:
    agent = create_agent(provider=ScriptedProvider(["Hi."]), tools=[weather_tool(log)])

    assert (await agent.send("Hi")).text == "Hi."
    with pytest.raises(ConfigurationError, match="needs a store"):
        await agent.resume("x")
    with pytest.raises(ConfigurationError, match="needs a store"):
        agent.session("x")


async def test_resume_returns_none_for_unknown_and_finished_sessions(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, ["Done."])
    await agent.send("Hi", session_id="done")

    assert await agent.resume("nobody") is None
    assert await agent.resume("done") is None
    assert len(agent.provider.calls) == 1  # type: ignore[attr-defined]


async def test_resume_finishes_an_interrupted_run(log: ToolLog, store: MemoryStore) -> None:
    crashed = planner(log, store, [tool_calls(WEATHER)])  # no answer for step 2: the provider fails there
    with pytest.raises(ProviderError):
        await crashed.send("Plan my trip", session_id="trip")
    assert store.checkpoints.load("trip").status == "in-progress"

    restarted = planner(log, store, ["Pack sunscreen."])
    result = await restarted.resume("trip")

    assert result is not None and result.text == "Pack sunscreen."
    assert log.runs["call_weather"] == 1  # the recorded result was not re-run
    assert len(restarted.provider.calls) == 1  # type: ignore[attr-defined]


async def test_resume_of_a_session_awaiting_a_pending_approval_raises(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(("c1", "charge_card", {"amount": 5}))])
    paused = await agent.send("Charge 5", session_id="shop")

    with pytest.raises(SessionAwaitingApprovalError) as error:
        await agent.resume("shop")
    assert error.value.approval_id == paused.approval_id


# -- approvals -----------------------------------------------------------------------------


async def test_approvals_pending_and_resolve_keep_checkpointing(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(("c1", "charge_card", {"amount": 5})), "Charged."])
    paused = await agent.send("Charge 5", session_id="shop")
    assert paused.finish_reason == "awaiting-approval"
    assert [a.id for a in await agent.approvals.pending("shop")] == [paused.approval_id]
    assert await agent.approvals.pending("other") == []
    assert paused.approval_id is not None

    result = await agent.approvals.resolve(paused.approval_id, approved=True)

    assert (result.finish_reason, result.text) == ("stop", "Charged.")
    assert log.runs["c1"] == 1
    saved = store.checkpoints.load("shop")
    assert (saved.status, saved.approval_id) == ("finished", None)
    assert await agent.approvals.pending() == []


async def test_approvals_resolve_rejection_records_a_rejection(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(("c1", "charge_card", {"amount": 5})), "Not charged."])
    paused = await agent.send("Charge 5", session_id="shop")
    assert paused.approval_id is not None

    result = await agent.approvals.resolve(paused.approval_id, approved=False, note="too much")

    rejection = next(m for m in result.messages if m.role == "tool").result()
    assert rejection["note"] == "too much" and "error" in rejection
    assert log.runs["c1"] == 0


# -- sessions and forks ----------------------------------------------------------------------


async def test_session_sends_resumes_and_forks(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(WEATHER), "Pack sunscreen.", "Take an umbrella."])
    session = agent.session(id="trip")

    first = await session.send("Plan my trip")
    assert first.text == "Pack sunscreen."
    assert await session.resume() is None
    assert (await session.checkpoint()).status == "finished"  # type: ignore[union-attr]
    history = await session.history()
    assert history is not None and [e.step for e in history] == [2, 1, 1]

    forked = await session.fork(
        from_step=1, patch={"tool_result": {"tool_call_id": "call_weather", "result": {"forecast": "rain"}}}
    )
    assert forked.id == "trip.fork-1"
    resumed = await forked.resume()
    assert resumed is not None and resumed.text == "Take an umbrella."

    comparison = await agent.compare("trip", forked.id)
    assert comparison.diverged_at == 1


async def test_session_without_id_gets_a_new_one(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, ["a", "b"])
    one, two = agent.session(), agent.session()

    assert one.id != two.id
    await one.send("hi")
    assert store.checkpoints.sessions() == [one.id]


async def test_agent_fork_with_append_input_then_resume(log: ToolLog, store: MemoryStore) -> None:
    """The reference's createAgent example."""
    agent = planner(log, store, [tool_calls(WEATHER), "Pack sunscreen.", "Rain plan."])
    await agent.send("Plan my trip", session_id="trip")

    fork = await agent.fork("trip", from_step=1, patch={"append_input": "It will rain, plan for that."})
    result = await agent.resume(fork.session_id)

    assert result is not None and result.text == "Rain plan."
    assert result.messages[-2].content == "It will rain, plan for that."
    assert agent.provider.calls[-1].messages[-1].content == "It will rain, plan for that."  # type: ignore[attr-defined]


# -- stream ----------------------------------------------------------------------------------


async def collect(stream: Any) -> list[Event]:
    return [event async for event in stream]


async def test_stream_yields_events_in_order(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(WEATHER), "Pack sunscreen."])

    stream = agent.stream("Plan my trip", session_id="trip")
    events = await collect(stream)

    assert [e.type for e in events] == [
        "checkpoint-saved",  # step 1's answer, before any tool runs
        "tool-call",
        "checkpoint-saved",  # the weather result
        "tool-result",
        "text",
        "checkpoint-saved",  # finished
        "finished",
    ]
    assert all(e.session_id == "trip" for e in events)
    assert stream.result is not None and stream.result.text == "Pack sunscreen."


async def test_stream_yields_a_checkpoint_saved_event_for_each_save(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(WEATHER, ("w2", "weather", {"city": "Rome"})), "Done."])

    events = await collect(agent.stream("Two cities", session_id="trip"))

    saved = [e for e in events if isinstance(e, CheckpointSavedEvent)]
    history = await get_checkpoint_history(store.checkpoints, "trip")
    assert history is not None
    assert [(e.step, e.status) for e in saved] == [(h.step, h.status) for h in reversed(history)]
    assert [e.version for e in saved] == [1, 2, 3, 4]
    assert isinstance(events[-1], FinishedEvent) and events[-1].finish_reason == "stop"


async def test_stream_ends_with_finished_when_the_run_pauses(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(("c1", "charge_card", {"amount": 5})), "Charged."])

    events = await collect(agent.stream("Charge 5", session_id="shop"))

    assert [e.type for e in events[-2:]] == ["approval-requested", "finished"]
    approval = events[-2]
    assert isinstance(approval, ApprovalRequestedEvent)
    assert isinstance(events[-1], FinishedEvent) and events[-1].finish_reason == "awaiting-approval"

    resolved = await collect(agent.approvals.stream_resolve(approval.approval_id, approved=True))
    assert [e.type for e in resolved] == ["checkpoint-saved", "tool-result", "text", "checkpoint-saved", "finished"]


async def test_stream_without_session_id_saves_nothing(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, ["Hi."])

    events = await collect(agent.stream("Hi"))

    assert [e.type for e in events] == ["text", "finished"]
    assert store.checkpoints.sessions() == []


async def test_stream_raises_the_runs_exception_after_its_events(log: ToolLog, store: MemoryStore) -> None:
    agent = planner(log, store, [tool_calls(WEATHER)])
    seen: list[str] = []

    with pytest.raises(ProviderError):
        async for event in agent.stream("Plan my trip", session_id="trip"):
            seen.append(event.type)

    assert seen == ["checkpoint-saved", "tool-call", "checkpoint-saved", "tool-result"]


def slow_weather(started: asyncio.Event, cancelled: asyncio.Event) -> Any:
    async def execute(args: CityArgs, ctx: ToolContext) -> dict[str, str]:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {"forecast": "sun"}

    return define_tool(name="weather", description="Forecast", input=CityArgs, execute=execute)


@pytest.mark.parametrize("how", ["aclose", "async with", "break"])
async def test_stream_cancels_the_run_when_the_consumer_stops_early(store: MemoryStore, how: str) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()
    agent = create_agent(
        provider=ScriptedProvider([tool_calls(WEATHER), "never"]),
        store=store,
        model="test-model",
        tools=[slow_weather(started, cancelled)],
    )

    if how == "aclose":
        stream = agent.stream("Plan", session_id="trip")
        async for event in stream:
            if event.type == "tool-call":
                await started.wait()
                break
        await stream.aclose()
    elif how == "async with":
        async with agent.stream("Plan", session_id="trip") as stream:
            async for event in stream:
                if event.type == "tool-call":
                    await started.wait()
                    break
    else:
        async for event in agent.stream("Plan", session_id="trip"):
            if event.type == "tool-call":
                await started.wait()
                break
        gc.collect()  # the dropped stream is closed by the event loop's async-generator finalizer

    await asyncio.wait_for(cancelled.wait(), timeout=5)
    saved = store.checkpoints.load("trip")
    assert saved.status == "in-progress" and [c.id for c in saved.pending_tool_calls()] == ["call_weather"]


# -- create_agent options ----------------------------------------------------------------------


async def test_create_agent_takes_an_existing_definition(log: ToolLog, store: MemoryStore) -> None:
    definition = Agent(name="planner", model="m", tools=[weather_tool(log)])

    agent = create_agent(provider=ScriptedProvider(["ok"]), store=store, agent=definition)

    assert agent.definition is definition
    assert (await agent.send("hi", session_id="s")).text == "ok"
    with pytest.raises(ConfigurationError, match="either agent="):
        create_agent(provider=ScriptedProvider(), agent=definition, name="other")


async def test_create_agent_passes_hooks_and_refuses_unknown_options(log: ToolLog) -> None:
    seen: list[int] = []
    agent = create_agent(provider=ScriptedProvider(["ok"]), before_model=lambda request: seen.append(request.step))

    await agent.send("hi")

    assert seen == [1]
    with pytest.raises(ConfigurationError, match="unknown options before_modle"):
        create_agent(provider=ScriptedProvider(), before_modle=print)
    with pytest.raises(ConfigurationError, match="store bundle"):
        create_agent(provider=ScriptedProvider(), store=object())


async def test_on_agent_drift_error_refuses_a_changed_agent(log: ToolLog, store: MemoryStore) -> None:
    crashed = planner(log, store, [tool_calls(WEATHER)])
    with pytest.raises(ProviderError):
        await crashed.send("Plan my trip", session_id="trip")

    changed = create_agent(
        provider=ScriptedProvider(["x"]),
        store=store,
        name="planner",
        model="another-model",
        instructions="You plan trips.",
        tools=[weather_tool(log), charge_tool(log)],
        on_agent_drift="error",
    )
    with pytest.raises(Exception) as error:
        await changed.resume("trip")
    assert getattr(error.value, "code", None) == "LOUSHO_AGENT_DRIFT"
