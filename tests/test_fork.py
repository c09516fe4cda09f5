"""Fork and replay (reference: 'Fork and replay'): one test per rule, then compare_trajectories."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lousho import (
    Agent,
    AgentExecutor,
    CheckpointNotFoundError,
    ConfigurationError,
    Message,
    PropagatingToolError,
    RunResult,
    ToolContext,
    create_agent,
    define_tool,
    get_checkpoint_history,
    memory_store,
)
from lousho.checkpoint import Checkpoint, maybe_await
from lousho.providers.scripted import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryCheckpointStore, MemoryStore
from lousho.trajectory import SessionExistsError, TrajectoryComparison, compare_trajectories, fork
from tests.fixtures.core import CityArgs, ToolLog, charge_tool, weather_tool

WEATHER = ("call_weather", "weather", {"city": "Oslo"})
RAIN = {"city": "Oslo", "forecast": "rain"}


@pytest.fixture
def store(any_store: Any) -> Any:
    """These rules hold on every store (issue #4): each test runs on each built-in store."""
    return any_store


async def run_trip(agent: Agent, store: MemoryStore, session_id: str = "trip", **kwargs: Any) -> ScriptedProvider:
    """Step 1 asks for the weather (saved twice: the call, then its result); step 2 answers and finishes."""
    provider = ScriptedProvider([tool_calls(WEATHER), "Pack sunscreen."])
    await AgentExecutor.execute(
        agent=agent,
        input="Plan my trip",
        provider=provider,
        session_id=session_id,
        checkpoint_store=store.checkpoints,
        **kwargs,
    )
    return provider


async def resume(agent: Agent, store: MemoryStore, session_id: str, answers: list[Any], **kwargs: Any) -> Any:
    provider = ScriptedProvider(answers)
    result = await AgentExecutor.execute(
        agent=agent,
        input=[],
        provider=provider,
        session_id=session_id,
        checkpoint_store=store.checkpoints,
        **kwargs,
    )
    return result, provider


def crashing_weather(log: ToolLog) -> Any:
    """A weather tool whose every run rejects the run: the turn's calls stay pending in the checkpoint."""

    def execute(args: CityArgs, ctx: ToolContext) -> None:
        log.record(ctx)
        raise PropagatingToolError("the process died")

    return define_tool(name="weather", description="Forecast", input=CityArgs, execute=execute)


async def crashed_two_call_turn(log: ToolLog, store: MemoryStore) -> None:
    """A session whose step-1 turn asks for two weather calls, neither with a result."""
    agent = Agent(name="planner", model="test-model", instructions="You plan trips.", tools=[crashing_weather(log)])
    provider = ScriptedProvider([tool_calls(("w1", "weather", {"city": "Oslo"}), ("w2", "weather", {"city": "Rome"}))])
    with pytest.raises(PropagatingToolError):
        await AgentExecutor.execute(
            agent=agent, input="Two cities", provider=provider, session_id="two", checkpoint_store=store.checkpoints
        )


# -- fork: which entry, what is saved --------------------------------------------------


async def test_fork_takes_the_newest_entry_of_the_step(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)
    history = await get_checkpoint_history(store.checkpoints, "trip")
    assert history is not None
    assert [e.step for e in history] == [2, 1, 1]
    newest_of_step_1 = history[1].checkpoint

    forked = await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints)

    assert forked.step == 1
    assert forked.checkpoint.messages == newest_of_step_1.messages
    assert forked.checkpoint.messages[-1].role == "tool"  # the result, not the older pending-call entry


async def test_fork_from_a_save_takes_that_save_of_the_step(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)
    history = await get_checkpoint_history(store.checkpoints, "trip")
    assert history is not None
    older_of_step_1 = history[2].checkpoint  # the model's turn, before its call's result

    executor_fork = await AgentExecutor.fork(
        session_id="trip", from_save=older_of_step_1.version, checkpoint_store=store.checkpoints
    )
    lousho_agent = create_agent(agent=agent, store=store, provider=ScriptedProvider([]))
    session_fork = await lousho_agent.session("trip").fork(from_save=older_of_step_1.version)

    assert executor_fork.checkpoint.messages == older_of_step_1.messages
    assert executor_fork.checkpoint.messages[-1].tool_calls  # the pending call, not its result
    stored = await maybe_await(store.checkpoints.load(session_fork.id))
    assert stored is not None and stored.messages == older_of_step_1.messages


async def test_fork_is_saved_as_the_new_sessions_in_progress_checkpoint(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)

    forked = await fork(session_id="trip", from_step=2, checkpoint_store=store.checkpoints)

    saved = store.checkpoints.load(forked.session_id)
    assert saved == forked.checkpoint
    assert (saved.session_id, saved.status, saved.approval_id, saved.version) == (
        forked.session_id,
        "in-progress",
        None,
        1,
    )
    assert saved.finish_reason is None


async def test_patch_keys_apply_in_order(agent: Agent, store: MemoryStore) -> None:
    """messages first (here it drops the weather result), then tool_result records it again, then append_input."""
    await run_trip(agent, store)

    def drop_result(messages: list[Message]) -> list[Message]:
        return [m for m in messages if m.role != "tool"]

    forked = await fork(
        session_id="trip",
        from_step=1,
        checkpoint_store=store.checkpoints,
        patch={
            "append_input": "Plan for that.",
            "tool_result": {"tool_call_id": "call_weather", "result": RAIN},
            "business_state": {"budget": 100},
            "messages": drop_result,
        },
    )

    checkpoint = forked.checkpoint
    assert [m.role for m in checkpoint.messages] == ["system", "user", "assistant", "tool"]
    assert checkpoint.messages[-1].result() == RAIN
    assert checkpoint.business_state == {"budget": 100}
    assert [m.content for m in checkpoint.pending_input] == ["Plan for that."]


async def test_messages_patch_rewrites_the_transcript(agent: Agent, store: MemoryStore, log: ToolLog) -> None:
    await run_trip(agent, store)

    def rewrite(messages: list[Message]) -> list[Message]:
        return [Message.user("Plan my trip to Rome") if m.role == "user" else m for m in messages]

    forked = await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints, patch={"messages": rewrite})
    result, provider = await resume(agent, store, forked.session_id, ["Rome it is."])

    assert provider.calls[0].messages[1].content == "Plan my trip to Rome"
    assert result.text == "Rome it is."


async def test_messages_patch_must_keep_the_transcript_valid(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)

    def result_after_user(messages: list[Message]) -> list[Message]:
        return [*messages[:3], Message.user("wait"), messages[3]]

    with pytest.raises(ConfigurationError, match="invalid transcript"):
        await fork(
            session_id="trip", from_step=1, checkpoint_store=store.checkpoints, patch={"messages": result_after_user}
        )
    assert store.checkpoints.sessions() == ["trip"]


async def test_business_state_patch_replaces_it(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store, business_state={"budget": 500, "nights": 2})

    forked = await fork(
        session_id="trip", from_step=1, checkpoint_store=store.checkpoints, patch={"business_state": {"budget": 50}}
    )
    result, _ = await resume(agent, store, forked.session_id, ["Cheap trip."])

    assert forked.checkpoint.business_state == {"budget": 50}
    assert result.business_state == {"budget": 50}


async def test_tool_result_patch_replaces_in_place(agent: Agent, store: MemoryStore, log: ToolLog) -> None:
    await run_trip(agent, store)
    source = store.checkpoints.load("trip")

    forked = await fork(
        session_id="trip",
        from_step=1,
        checkpoint_store=store.checkpoints,
        patch={"tool_result": {"tool_call_id": "call_weather", "result": RAIN}},
    )
    result, provider = await resume(agent, store, forked.session_id, ["Take an umbrella."])

    old, new = source.messages[3], forked.checkpoint.messages[3]
    assert (new.role, new.tool_call_id, new.name) == (old.role, old.tool_call_id, old.name)
    assert len(forked.checkpoint.messages) == 4
    assert new.result() == RAIN
    assert provider.calls[0].messages[3].result() == RAIN  # the model reads the patched result
    assert log.runs["call_weather"] == 1  # a recorded result is never re-run
    assert result.text == "Take an umbrella."


async def test_tool_result_patch_records_the_next_pending_call(store: MemoryStore, log: ToolLog) -> None:
    await crashed_two_call_turn(log, store)

    forked = await fork(
        session_id="two",
        from_step=1,
        checkpoint_store=store.checkpoints,
        patch={"tool_result": {"tool_call_id": "w1", "result": RAIN}},
    )

    assert forked.checkpoint.messages[-1].tool_call_id == "w1"
    assert [c.id for c in forked.checkpoint.pending_tool_calls()] == ["w2"]


async def test_tool_result_for_a_later_pending_call_keeps_call_order(store: MemoryStore, log: ToolLog) -> None:
    """w2 cannot be recorded while w1 has no result; given both, in order, both are recorded."""
    await crashed_two_call_turn(log, store)

    with pytest.raises(ConfigurationError, match="call order") as error:
        await fork(
            session_id="two",
            from_step=1,
            checkpoint_store=store.checkpoints,
            patch={"tool_result": {"tool_call_id": "w2", "result": RAIN}},
        )
    assert "'w1'" in str(error.value)

    forked = await fork(
        session_id="two",
        from_step=1,
        checkpoint_store=store.checkpoints,
        patch={"tool_result": [{"tool_call_id": "w1", "result": {"n": 1}}, {"tool_call_id": "w2", "result": RAIN}]},
    )
    assert [m.tool_call_id for m in forked.checkpoint.messages if m.role == "tool"] == ["w1", "w2"]
    assert forked.checkpoint.pending_tool_calls() == []


async def test_tool_result_for_an_unknown_call_is_refused(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)

    with pytest.raises(ConfigurationError, match="no tool call 'nope'"):
        await fork(
            session_id="trip",
            from_step=1,
            checkpoint_store=store.checkpoints,
            patch={"tool_result": {"tool_call_id": "nope", "result": 1}},
        )


async def test_append_input_is_sent_after_pending_calls(store: MemoryStore, log: ToolLog) -> None:
    await crashed_two_call_turn(log, store)
    agent = Agent(name="planner", model="test-model", instructions="You plan trips.", tools=[weather_tool(log)])

    forked = await fork(
        session_id="two", from_step=1, checkpoint_store=store.checkpoints, patch={"append_input": "It will rain."}
    )
    result, provider = await resume(agent, store, forked.session_id, ["Umbrellas for both."])

    sent = provider.calls[0].messages
    assert [(m.role, m.tool_call_id) for m in sent[-3:]] == [("tool", "w1"), ("tool", "w2"), ("user", None)]
    assert sent[-1].content == "It will rain."
    assert result.finish_reason == "stop"


async def test_unknown_patch_keys_are_refused(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)

    with pytest.raises(ConfigurationError, match="toolResult"):
        await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints, patch={"toolResult": {}})
    assert store.checkpoints.sessions() == ["trip"]


# -- fork: the budget, approvals ---------------------------------------------------------


async def test_fork_keeps_step_count_and_usage(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)
    history = await get_checkpoint_history(store.checkpoints, "trip")
    assert history is not None
    step_1 = history[1].checkpoint

    forked = await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints)
    assert (forked.checkpoint.step_index, forked.checkpoint.usage) == (1, step_1.usage)

    result, _ = await resume(
        agent, store, forked.session_id, [tool_calls(("again", "weather", {"city": "Oslo"})), "x"], max_steps=2
    )
    assert result.finish_reason == "max-steps"  # one step of the budget was left
    assert result.steps == 2
    assert result.usage.input_tokens == step_1.usage.input_tokens + 10


async def test_fork_of_awaiting_approval_entry_asks_again(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="shop", model="test-model", tools=[weather_tool(log), charge_tool(log)])
    paused = await AgentExecutor.execute(
        agent=agent,
        input="Charge 5",
        provider=ScriptedProvider([tool_calls(("c1", "charge_card", {"amount": 5}))]),
        session_id="shop",
        checkpoint_store=store.checkpoints,
        approval_store=store.approvals,
    )
    assert paused.finish_reason == "awaiting-approval"

    forked = await fork(session_id="shop", from_step=1, checkpoint_store=store.checkpoints)
    assert (forked.checkpoint.status, forked.checkpoint.approval_id) == ("in-progress", None)
    again, provider = await resume(agent, store, forked.session_id, [], approval_store=store.approvals)

    assert again.finish_reason == "awaiting-approval"
    assert again.approval_id not in (None, paused.approval_id)
    assert provider.calls == []  # the gated call is pending: no model turn before it is decided
    assert log.runs["c1"] == 0
    assert store.checkpoints.load("shop").approval_id == paused.approval_id
    assert {a.id for a in store.approvals.pending()} == {paused.approval_id, again.approval_id}


async def test_tool_result_patch_settles_a_gated_call(store: MemoryStore, log: ToolLog) -> None:
    agent = Agent(name="shop", model="test-model", tools=[charge_tool(log)])
    await AgentExecutor.execute(
        agent=agent,
        input="Charge 5",
        provider=ScriptedProvider([tool_calls(("c1", "charge_card", {"amount": 5}))]),
        session_id="shop",
        checkpoint_store=store.checkpoints,
        approval_store=store.approvals,
    )

    forked = await fork(
        session_id="shop",
        from_step=1,
        checkpoint_store=store.checkpoints,
        patch={"tool_result": {"tool_call_id": "c1", "result": {"charged": 5}}},
    )
    result, _ = await resume(agent, store, forked.session_id, ["Charged."], approval_store=store.approvals)

    assert result.finish_reason == "stop"
    assert log.runs["c1"] == 0


# -- fork: naming and refusals ---------------------------------------------------------


async def test_default_fork_id_is_first_free_n(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)

    first = await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints)
    second = await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints)
    store.checkpoints.delete(first.session_id)
    third = await fork(session_id="trip", from_step=2, checkpoint_store=store.checkpoints)

    assert [first.session_id, second.session_id, third.session_id] == ["trip.fork-1", "trip.fork-2", "trip.fork-1"]


async def test_new_session_id_names_the_fork(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)

    forked = await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints, new_session_id="rainy")

    assert forked.session_id == "rainy"
    assert store.checkpoints.load("rainy").session_id == "rainy"


async def test_existing_new_session_id_is_refused(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)
    await run_trip(agent, store, session_id="other")
    before = store.checkpoints.load("other")

    with pytest.raises(SessionExistsError) as error:
        await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints, new_session_id="other")

    assert isinstance(error.value, ConfigurationError)
    assert store.checkpoints.load("other") == before


async def test_existing_new_session_id_is_refused_when_created_after_the_check(agent: Agent) -> None:
    """The save is version 1, so a compare-and-set store refuses it if the session appeared meanwhile."""

    class RacingStore(MemoryCheckpointStore):
        def load(self, session_id: str) -> Checkpoint | None:
            if session_id == "other":  # someone else creates it right after our check
                existing = super().load(session_id)
                return None if existing is not None else existing
            return super().load(session_id)

    store = MemoryStore(checkpoints=RacingStore())
    await run_trip(agent, store)
    await run_trip(agent, store, session_id="other")
    before = MemoryCheckpointStore.load(store.checkpoints, "other")

    with pytest.raises(SessionExistsError):
        await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints, new_session_id="other")
    assert MemoryCheckpointStore.load(store.checkpoints, "other") == before


async def test_missing_step_lists_kept_steps(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)

    with pytest.raises(CheckpointNotFoundError) as error:
        await fork(session_id="trip", from_step=7, checkpoint_store=store.checkpoints)

    assert error.value.code == "LOUSHO_CHECKPOINT_NOT_FOUND"
    assert "step 7" in str(error.value) and "steps kept are 1, 2" in str(error.value)


async def test_step_dropped_past_history_limit_is_missing(agent: Agent) -> None:
    store = memory_store(history_limit=1)
    await run_trip(agent, store)

    with pytest.raises(CheckpointNotFoundError, match="steps kept are 2"):
        await fork(session_id="trip", from_step=1, checkpoint_store=store.checkpoints)


async def test_unknown_session_cannot_fork(store: MemoryStore) -> None:
    with pytest.raises(CheckpointNotFoundError, match="holds no entries"):
        await fork(session_id="nobody", from_step=1, checkpoint_store=store.checkpoints)


async def test_store_without_history_cannot_fork(agent: Agent) -> None:
    class PlainStore:
        def __init__(self) -> None:
            self.data: dict[str, Checkpoint] = {}

        def save(self, session_id: str, checkpoint: Checkpoint) -> None:
            self.data[session_id] = checkpoint

        def load(self, session_id: str) -> Checkpoint | None:
            return self.data.get(session_id)

        def delete(self, session_id: str, keep_history: bool = False) -> None:
            self.data.pop(session_id, None)

    plain = PlainStore()
    await AgentExecutor.execute(
        agent=agent,
        input="Plan my trip",
        provider=ScriptedProvider(["Done."]),
        session_id="trip",
        checkpoint_store=plain,
    )

    with pytest.raises(ConfigurationError, match="keeps no checkpoint history"):
        await fork(session_id="trip", from_step=1, checkpoint_store=plain)
    assert list(plain.data) == ["trip"]


async def test_source_session_is_unchanged(agent: Agent, store: MemoryStore) -> None:
    await run_trip(agent, store)
    latest = store.checkpoints.load("trip")
    history = store.checkpoints.history("trip")

    forked = await fork(
        session_id="trip",
        from_step=1,
        checkpoint_store=store.checkpoints,
        patch={"tool_result": {"tool_call_id": "call_weather", "result": RAIN}, "append_input": "More."},
    )
    await resume(agent, store, forked.session_id, ["Umbrella."])

    assert store.checkpoints.load("trip") == latest
    assert store.checkpoints.history("trip") == history


# -- compare_trajectories ----------------------------------------------------------------


async def forked_trip(agent: Agent, store: MemoryStore) -> tuple[Checkpoint, Checkpoint]:
    """The reference's example: the weather at step 1 was rain instead of sun."""
    await run_trip(agent, store)
    forked = await fork(
        session_id="trip",
        from_step=1,
        checkpoint_store=store.checkpoints,
        patch={"tool_result": {"tool_call_id": "call_weather", "result": RAIN}},
    )
    await resume(agent, store, forked.session_id, ["Take an umbrella."])
    return store.checkpoints.load("trip"), store.checkpoints.load(forked.session_id)


async def test_compare_finds_the_step_the_fork_changed(agent: Agent, store: MemoryStore) -> None:
    original, replayed = await forked_trip(agent, store)

    diverged_at, a, b, drift = compare_trajectories(original, replayed)

    assert diverged_at == 1  # the step whose weather result was patched (steps count from 1, like from_step)
    assert [s.step for s in a] == [1, 2] and len(b) == 2
    assert a[0].tool_calls[0].result == {"city": "Oslo", "forecast": "sun"}
    assert b[0].tool_calls[0].result == RAIN
    assert (a[1].text, b[1].text) == ("Pack sunscreen.", "Take an umbrella.")
    assert not drift


async def test_comparison_is_a_model_that_unpacks_as_a_tuple(agent: Agent, store: MemoryStore) -> None:
    original, replayed = await forked_trip(agent, store)

    comparison = compare_trajectories(original, replayed)
    diverged_at, a, b, drift = comparison

    assert isinstance(comparison, TrajectoryComparison)
    assert (diverged_at, a, b, drift) == (comparison.diverged_at, comparison.a, comparison.b, comparison.drift)
    assert "diverged at step 1" in comparison.describe()
    assert TrajectoryComparison.model_validate_json(comparison.model_dump_json()) == comparison


def transcript(*turns: Message) -> list[Message]:
    return [Message.system("sys"), Message.user("go"), *turns]


def call(call_id: str, name: str, args: dict[str, Any]) -> Message:
    return tool_calls((call_id, name, args))


def result(call_id: str, name: str, value: Any) -> Message:
    return Message(role="tool", content=json.dumps(value), tool_call_id=call_id, name=name)


def test_identical_runs_have_no_divergence() -> None:
    run = transcript(call("a", "weather", {"city": "Oslo"}), result("a", "weather", 1), Message.assistant("done"))

    comparison = compare_trajectories(run, list(run))

    assert comparison.diverged_at is None and not comparison.drift
    assert "identical" in comparison.describe()


def test_diverged_at_ignores_call_ids() -> None:
    a = transcript(call("call_1", "weather", {"city": "Oslo"}), result("call_1", "weather", 1), Message.assistant("ok"))
    b = transcript(call("tc_9", "weather", {"city": "Oslo"}), result("tc_9", "weather", 1), Message.assistant("ok"))

    assert compare_trajectories(a, b).diverged_at is None


def test_diverged_at_is_the_first_differing_step() -> None:
    a = transcript(call("1", "weather", {"city": "Oslo"}), result("1", "weather", 1), Message.assistant("sun"))
    b = transcript(call("1", "weather", {"city": "Oslo"}), result("1", "weather", 1), Message.assistant("rain"))

    assert compare_trajectories(a, b).diverged_at == 2


def test_a_prefix_diverges_where_the_longer_run_goes_on() -> None:
    a = transcript(call("1", "weather", {"city": "Oslo"}))
    b = transcript(call("1", "weather", {"city": "Oslo"}), result("1", "weather", 1), Message.assistant("ok"))

    comparison = compare_trajectories(a, b)

    assert comparison.diverged_at == 1  # a's call has no result, b's has
    assert comparison.drift.step_count == (1, 2)
    assert comparison.drift.finish_reason == (None, "stop")


def test_drift_reports_tool_order_and_arguments() -> None:
    a = transcript(
        tool_calls(("1", "weather", {"city": "Oslo"}), ("2", "book", {"what": "beach"})),
        result("1", "weather", 1),
        result("2", "book", 1),
        Message.assistant("ok"),
    )
    b = transcript(
        tool_calls(("1", "weather", {"city": "Rome"}), ("2", "weather", {"city": "Oslo"})),
        result("1", "weather", 1),
        result("2", "weather", 1),
        call("3", "book", {"what": "museum"}),
        result("3", "book", 1),
        Message.assistant("ok"),
    )

    drift = compare_trajectories(a, b).drift

    assert [(d.step, d.a, d.b) for d in drift.tool_order] == [
        (1, ["weather", "book"], ["weather", "weather"]),
        (2, [], ["book"]),
    ]
    assert [(d.step, d.position, d.tool, d.a, d.b) for d in drift.arguments] == [
        (1, 0, "weather", {"city": "Oslo"}, {"city": "Rome"})
    ]
    assert drift.step_count == (2, 3)
    assert drift.finish_reason is None


async def test_compare_takes_checkpoints_results_and_transcripts(agent: Agent, store: MemoryStore) -> None:
    original, replayed = await forked_trip(agent, store)
    paused = original.model_copy(update={"status": "in-progress", "finish_reason": None})

    from_messages = compare_trajectories(original.messages, replayed.messages)
    from_checkpoints = compare_trajectories(original, paused)

    assert from_messages.diverged_at == 1
    assert from_checkpoints.diverged_at is None
    assert from_checkpoints.drift.finish_reason == ("stop", "in-progress")
    from_results = compare_trajectories(RunResult.of(original, "stop"), RunResult.of(replayed, "max-steps"))
    assert from_results.diverged_at == 1 and from_results.drift.finish_reason == ("stop", "max-steps")
    with pytest.raises(ConfigurationError, match="takes a Checkpoint"):
        compare_trajectories(original, 42)  # type: ignore[arg-type]
