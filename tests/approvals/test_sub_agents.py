"""Sub-agents: an agent as another agent's tool, and approvals that pause both (reference: checkpoint table)."""

from __future__ import annotations

from lousho import Agent, AgentExecutor, RunResult, resume_after_approval
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryStore
from lousho.subagents import agent_tool
from tests.engine.helpers import assert_valid_transcript
from tests.fixtures.core import ToolLog, charge_tool, weather_tool


def agents(log: ToolLog) -> tuple[Agent, Agent]:
    cashier = Agent(name="cashier", model="m", instructions="You take payments.", tools=[charge_tool(log)])
    planner = Agent(name="planner", model="m", tools=[weather_tool(log), agent_tool(cashier)])
    return planner, cashier


async def start(planner: Agent, store: MemoryStore, provider: ScriptedProvider) -> RunResult:
    return await AgentExecutor.execute(
        agent=planner, input="plan and pay", provider=provider, session_id="trip",
        checkpoint_store=store.checkpoints, approval_store=store.approvals,
    )


async def resolve(approval_id: str | None, planner: Agent, store: MemoryStore, provider: ScriptedProvider) -> RunResult:
    return await resume_after_approval({"id": approval_id, "approved": True}, store.approvals, planner, provider, {}, store.checkpoints)


async def test_a_sub_agents_answer_is_the_calls_result(store: MemoryStore, log: ToolLog) -> None:
    cashier = Agent(name="cashier", model="m", tools=[])
    planner = Agent(name="planner", model="m", tools=[agent_tool(cashier)])
    # one provider serves both agents, in the order they ask: planner, cashier, planner
    provider = ScriptedProvider([tool_calls(("ask", "cashier", {"input": "what is owed?"})), "12 euros", "You owe 12 euros."])

    result = await start(planner, store, provider)

    assert result.text == "You owe 12 euros."
    assert result.messages[-2].result() == "12 euros"
    child = store.checkpoints.load("trip.sub-ask")
    assert child is not None and child.status == "finished"


async def test_a_sub_agent_pause_pauses_the_parent_on_the_same_approval(store: MemoryStore, log: ToolLog) -> None:
    planner, _ = agents(log)
    provider = ScriptedProvider([
        tool_calls(("w", "weather", {"city": "Oslo"}), ("pay", "cashier", {"input": "charge 30"})),
        tool_calls(("c1", "charge_card", {"amount": 30})),
    ])

    paused = await start(planner, store, provider)

    parent = store.checkpoints.load("trip")
    child = store.checkpoints.load("trip.sub-pay")
    assert paused.finish_reason == "awaiting-approval"
    assert parent is not None and child is not None
    assert parent.status == child.status == "awaiting-approval"
    assert parent.approval_id == child.approval_id == paused.approval_id
    snapshot = store.approvals.load(paused.approval_id or "")
    assert snapshot is not None and snapshot.child is not None and snapshot.child.tool_call.id == "c1"
    assert [a.id for a in store.approvals.pending()] == [paused.approval_id]


async def test_resolving_resumes_the_sub_agent_and_then_the_parent(store: MemoryStore, log: ToolLog) -> None:
    planner, _ = agents(log)
    provider = ScriptedProvider([
        tool_calls(("pay", "cashier", {"input": "charge 30"})),
        tool_calls(("c1", "charge_card", {"amount": 30})),
        "charged 30",
        "Trip paid.",
    ])
    paused = await start(planner, store, provider)

    final = await resolve(paused.approval_id, planner, store, provider)

    assert final.finish_reason == "stop" and final.text == "Trip paid."
    assert final.messages[-2].result() == "charged 30"
    assert log.runs["c1"] == 1
    assert_valid_transcript(final.messages)


async def test_a_sub_agent_that_pauses_again_pauses_the_parent_again(store: MemoryStore, log: ToolLog) -> None:
    planner, _ = agents(log)
    provider = ScriptedProvider([
        tool_calls(("pay", "cashier", {"input": "charge twice"})),
        tool_calls(("c1", "charge_card", {"amount": 1}), ("c2", "charge_card", {"amount": 2})),
        "charged both",
        "All paid.",
    ])
    first = await start(planner, store, provider)

    second = await resolve(first.approval_id, planner, store, provider)

    parent = store.checkpoints.load("trip")
    assert second.finish_reason == "awaiting-approval" and second.approval_id != first.approval_id
    assert parent is not None and parent.approval_id == second.approval_id
    final = await resolve(second.approval_id, planner, store, provider)
    assert final.text == "All paid." and dict(log.runs) == {"c1": 1, "c2": 1}


async def test_pending_shows_the_sub_agents_inner_call_and_names_the_parent(store: MemoryStore, log: ToolLog) -> None:
    planner, _ = agents(log)
    provider = ScriptedProvider([
        tool_calls(("pay", "cashier", {"input": "charge 30"})),
        tool_calls(("c1", "charge_card", {"amount": 30})),
    ])
    await start(planner, store, provider)

    [listed] = store.approvals.pending()

    assert listed.session_id == "trip"  # the parent, paused on the same approval
    assert listed.waiting.session_id == "trip.sub-pay"
    assert (listed.waiting.tool_call.name, listed.waiting.tool_call.arguments) == ("charge_card", {"amount": 30})
    child = store.checkpoints.load("trip.sub-pay")
    assert child is not None and child.parent_session_id == "trip"
