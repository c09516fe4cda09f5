"""Reference: 'Approvals in the middle of a tool batch' — one test per rule."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lousho import (
    Agent,
    AgentExecutor,
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    InvalidDecisionError,
    RunResult,
    SessionAwaitingApprovalError,
    ToolContext,
    define_tool,
    memory_store,
    resume_after_approval,
)
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryStore
from tests.engine.helpers import assert_valid_transcript, tool_results
from tests.fixtures.core import AmountArgs, ToolLog, charge_tool, weather_tool

BATCH = tool_calls(
    ("w1", "weather", {"city": "Oslo"}),
    ("pay1", "charge_card", {"amount": 10}),
    ("w2", "weather", {"city": "Rome"}),
    ("pay2", "charge_card", {"amount": 20}),
    ("w3", "weather", {"city": "Nice"}),
)


def gated_agent(log: ToolLog, concurrency: int = 1) -> Agent:
    return Agent(name="shop", model="m", tools=[weather_tool(log), charge_tool(log)], tool_concurrency=concurrency)


async def start(agent: Agent, store: MemoryStore, provider: ScriptedProvider) -> RunResult:
    return await AgentExecutor.execute(
        agent=agent, input="buy", provider=provider, session_id="s",
        checkpoint_store=store.checkpoints, approval_store=store.approvals,
    )


async def resolve(approval_id: str | None, approved: bool, agent: Agent, store: MemoryStore, provider: ScriptedProvider, note: str | None = None) -> RunResult:
    return await resume_after_approval(
        {"id": approval_id, "approved": approved, "note": note}, store.approvals, agent, provider, {}, store.checkpoints
    )


async def test_calls_before_the_gated_call_run_and_are_recorded(store: MemoryStore, log: ToolLog) -> None:
    result = await start(gated_agent(log), store, ScriptedProvider([BATCH]))

    assert result.finish_reason == "awaiting-approval"
    assert tool_results(result.messages) == ["w1"]
    assert dict(log.runs) == {"w1": 1}


async def test_the_snapshot_keeps_the_remaining_tool_calls(store: MemoryStore, log: ToolLog) -> None:
    result = await start(gated_agent(log), store, ScriptedProvider([BATCH]))

    snapshot = store.approvals.load(result.approval_id or "")
    assert snapshot is not None
    assert snapshot.tool_call.id == "pay1"
    assert [c.id for c in snapshot.remaining_tool_calls or []] == ["w2", "pay2", "w3"]


async def test_an_approved_call_records_the_tools_result(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log), ScriptedProvider([BATCH, "done"])
    paused = await start(agent, store, provider)

    again = await resolve(paused.approval_id, True, agent, store, provider)

    results = {m.tool_call_id: m.result() for m in again.messages if m.role == "tool"}
    assert results["pay1"] == {"charged": 10, "idempotency_key": "pay1"}


async def test_a_rejected_call_records_a_structured_rejection(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log), ScriptedProvider([BATCH, "done"])
    paused = await start(agent, store, provider)

    again = await resolve(paused.approval_id, False, agent, store, provider, note="too expensive")

    results = {m.tool_call_id: m.result() for m in again.messages if m.role == "tool"}
    assert results["pay1"] == {"error": "rejected", "note": "too expensive"}
    assert "pay1" not in log.runs


async def test_remaining_calls_run_and_pause_again_under_a_new_approval_id(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log), ScriptedProvider([BATCH, "done"])
    paused = await start(agent, store, provider)

    second = await resolve(paused.approval_id, True, agent, store, provider)

    assert second.finish_reason == "awaiting-approval"
    assert second.approval_id not in (None, paused.approval_id)
    assert tool_results(second.messages) == ["w1", "pay1", "w2"]
    assert len(provider.calls) == 1


async def test_the_model_is_called_once_every_call_has_exactly_one_result(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log), ScriptedProvider([BATCH, "done"])
    first = await start(agent, store, provider)
    second = await resolve(first.approval_id, True, agent, store, provider)

    final = await resolve(second.approval_id, False, agent, store, provider)

    assert final.finish_reason == "stop" and final.text == "done"
    assert len(provider.calls) == 2
    assert tool_results(provider.calls[1].messages) == ["w1", "pay1", "w2", "pay2", "w3"]
    assert_valid_transcript(final.messages)
    assert dict(log.runs) == {"w1": 1, "pay1": 1, "w2": 1, "w3": 1}


async def test_a_gated_call_with_invalid_arguments_gets_an_error_result_without_asking(store: MemoryStore, log: ToolLog) -> None:
    provider = ScriptedProvider([tool_calls(("pay", "charge_card", {"amount": "lots"})), "done"])

    result = await start(gated_agent(log), store, provider)

    assert result.finish_reason == "stop"
    error = result.messages[-2].result()
    assert "invalid arguments" in error["error"] and "amount" in error["error"]
    assert store.approvals.pending() == []


async def test_remaining_calls_can_fail_validation_after_a_resume(store: MemoryStore, log: ToolLog) -> None:
    batch = tool_calls(("pay", "charge_card", {"amount": 1}), ("w", "weather", {"town": "typo"}))
    agent, provider = gated_agent(log), ScriptedProvider([batch, "done"])
    paused = await start(agent, store, provider)

    final = await resolve(paused.approval_id, True, agent, store, provider)

    assert final.finish_reason == "stop"
    assert "invalid arguments" in final.messages[-2].result()["error"]


async def test_concurrency_above_one_runs_calls_around_a_gated_call_in_order(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log, concurrency=3), ScriptedProvider([BATCH, "done"])
    first = await start(agent, store, provider)
    assert tool_results(first.messages) == ["w1"]

    second = await resolve(first.approval_id, True, agent, store, provider)
    final = await resolve(second.approval_id, True, agent, store, provider)

    assert tool_results(final.messages) == ["w1", "pay1", "w2", "pay2", "w3"]
    assert_valid_transcript(final.messages)


async def test_needs_approval_can_be_a_function_of_the_arguments(store: MemoryStore, log: ToolLog) -> None:
    def over_100(args: AmountArgs, ctx: ToolContext) -> bool:
        return args.amount > 100

    agent = Agent(name="shop", model="m", tools=[charge_tool(log, needs_approval=over_100)])
    provider = ScriptedProvider([tool_calls(("small", "charge_card", {"amount": 5}), ("big", "charge_card", {"amount": 500}))])

    result = await start(agent, store, provider)

    assert result.finish_reason == "awaiting-approval"
    assert tool_results(result.messages) == ["small"]


async def test_a_decision_resolved_twice_is_refused_and_the_tool_does_not_run_again(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log), ScriptedProvider([tool_calls(("pay", "charge_card", {"amount": 1})), "done"])
    paused = await start(agent, store, provider)

    outcomes = await asyncio.gather(
        resolve(paused.approval_id, True, agent, store, provider),
        resolve(paused.approval_id, True, agent, store, provider),
        return_exceptions=True,
    )

    assert sum(isinstance(o, RunResult) for o in outcomes) == 1
    assert sum(isinstance(o, ApprovalAlreadyResolvedError) for o in outcomes) == 1
    assert log.runs["pay"] == 1


async def test_an_unknown_approval_id_is_a_clear_error(store: MemoryStore, log: ToolLog) -> None:
    with pytest.raises(ApprovalNotFoundError, match="appr_nope"):
        await resolve("appr_nope", True, gated_agent(log), store, ScriptedProvider())


@pytest.mark.parametrize("decision", [{}, {"id": "x"}, {"id": "x", "approved": "maybe"}, {"id": 3, "approved": True}, {"id": "x", "approved": True, "extra": 1}])
async def test_a_malformed_decision_is_a_typed_error(store: MemoryStore, log: ToolLog, decision: dict[str, Any]) -> None:
    with pytest.raises(InvalidDecisionError):
        await resume_after_approval(decision, store.approvals, gated_agent(log), ScriptedProvider(), {}, store.checkpoints)


async def test_without_the_checkpoint_store_the_session_keeps_its_awaiting_mark(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log), ScriptedProvider([tool_calls(("pay", "charge_card", {"amount": 1})), "done"])
    paused = await start(agent, store, provider)

    result = await resume_after_approval({"id": paused.approval_id, "approved": True}, store.approvals, agent, provider)

    assert result.finish_reason == "stop"
    stored = store.checkpoints.load("s")
    assert stored is not None and stored.status == "awaiting-approval"
    with pytest.raises(SessionAwaitingApprovalError):
        await start(agent, store, provider)


async def test_a_snapshot_without_remaining_tool_calls_resumes_as_before(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log), ScriptedProvider([BATCH, "done"])
    paused = await start(agent, store, provider)
    snapshot = store.approvals.load(paused.approval_id or "")
    assert snapshot is not None
    store.approvals.save(snapshot.model_copy(update={"remaining_tool_calls": None}))  # as written by an older version

    final = await resolve(paused.approval_id, True, agent, store, provider)

    assert final.finish_reason == "stop"
    results = {m.tool_call_id: m.result() for m in final.messages if m.role == "tool"}
    assert [results[c]["error"] for c in ("w2", "pay2", "w3")] == ["not run"] * 3
    assert dict(log.runs) == {"w1": 1, "pay1": 1}


async def test_the_resumed_run_uses_the_approval_store_from_the_options(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log), ScriptedProvider([BATCH, "done"])
    paused = await start(agent, store, provider)
    other = memory_store().approvals

    second = await resume_after_approval(
        {"id": paused.approval_id, "approved": True}, store.approvals, agent, provider, {"approval_store": other}, store.checkpoints
    )

    assert other.load(second.approval_id or "") is not None
    assert store.approvals.load(second.approval_id or "") is None


async def test_a_decision_recorded_before_a_crash_is_applied_by_the_next_execute(store: MemoryStore, log: ToolLog) -> None:
    agent, provider = gated_agent(log), ScriptedProvider([tool_calls(("pay", "charge_card", {"amount": 1})), "done"])
    paused = await start(agent, store, provider)
    store.approvals.decide(paused.approval_id or "", True, None)  # the process died right after recording the decision

    result = await start(agent, store, provider)

    assert result.finish_reason == "stop"
    assert log.runs["pay"] == 1


async def test_a_tool_without_an_approval_store_is_a_configuration_error(store: MemoryStore, log: ToolLog) -> None:
    from lousho import ConfigurationError

    with pytest.raises(ConfigurationError, match="approval_store"):
        await AgentExecutor.execute(agent=gated_agent(log), input="buy", provider=ScriptedProvider(), session_id="s", checkpoint_store=store.checkpoints)


def test_define_tool_refuses_an_input_that_is_not_a_pydantic_model() -> None:
    from lousho import ConfigurationError

    with pytest.raises(ConfigurationError, match="BaseModel"):
        define_tool(name="x", description="", input=dict, execute=lambda a, c: None)  # type: ignore[type-var]


async def test_two_gated_calls_resolved_days_apart_each_by_a_new_store_and_executor(tmp_path: Any, log: ToolLog) -> None:
    from lousho.stores.sql import SqliteStore

    db = str(tmp_path / "jobs.db")
    answers = [BATCH, "done"]

    def fresh() -> tuple[Any, Agent, ScriptedProvider]:  # what another process, days later, would build
        return SqliteStore(db), gated_agent(log), ScriptedProvider(answers, by_turn=True)

    store, agent, provider = fresh()
    first = await AgentExecutor.execute(agent=agent, input="buy", provider=provider, session_id="s",
                                        checkpoint_store=store.checkpoints, approval_store=store.approvals)
    store.close()

    store, agent, provider = fresh()
    second = await resume_after_approval({"id": first.approval_id, "approved": True}, store.approvals, agent, provider, {}, store.checkpoints)
    store.close()

    store, agent, provider = fresh()
    final = await resume_after_approval({"id": second.approval_id, "approved": True}, store.approvals, agent, provider, {}, store.checkpoints)

    assert (first.finish_reason, second.finish_reason, final.finish_reason) == ("awaiting-approval", "awaiting-approval", "stop")
    assert tool_results(final.messages) == ["w1", "pay1", "w2", "pay2", "w3"]
    assert dict(log.runs) == {"w1": 1, "pay1": 1, "w2": 1, "pay2": 1, "w3": 1}
    stored = store.checkpoints.load("s")
    assert stored is not None and stored.status == "finished"
    assert store.approvals.pending() == []
    store.close()
