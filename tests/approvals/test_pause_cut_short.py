"""A pause cut short between its two writes: the approval is stored, the process dies before the paused
checkpoint is saved. A human may see that approval and decide it; the run, going on from its last checkpoint,
pauses again on the same call and must find that approval, not write a second one (found by the chaos suite:
a session waited for ever on a second approval of a call whose first the human had decided; issue #33)."""

from __future__ import annotations

from typing import Any

import pytest

from lousho import Agent, AgentExecutor, RunResult
from lousho.checkpoint import Checkpoint
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryStore
from tests.engine.helpers import tool_results
from tests.fixtures.core import ToolLog, charge_tool, weather_tool

BATCH = tool_calls(("w1", "weather", {"city": "Oslo"}), ("pay1", "charge_card", {"amount": 10}))


class Crash(BaseException):
    """Stands for the process dying: nothing in lousho catches it."""


class DiesBeforeThePausedSave:
    """The store's checkpoints, in a process that dies as it is about to save its first paused checkpoint."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.died = inner, False

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        if checkpoint.status == "awaiting-approval" and not self.died:
            self.died = True
            raise Crash("between the approval's write and the paused checkpoint's")
        self.inner.save(session_id, checkpoint)

    def load(self, session_id: str) -> Checkpoint | None:
        loaded: Checkpoint | None = self.inner.load(session_id)
        return loaded

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        self.inner.delete(session_id, keep_history)


async def run(agent: Agent, store: MemoryStore, checkpoints: Any, provider: ScriptedProvider, input: Any) -> RunResult:
    return await AgentExecutor.execute(
        agent=agent, input=input, provider=provider, session_id="s", checkpoint_store=checkpoints,
        approval_store=store.approvals,
    )


async def crashed_pause(store: MemoryStore, log: ToolLog) -> tuple[Agent, ScriptedProvider, str]:
    """The run dies as it pauses on pay1; the approval it stored is what a human's web app lists."""
    agent = Agent(name="shop", model="m", tools=[weather_tool(log), charge_tool(log)])
    provider = ScriptedProvider([BATCH, "done"])
    with pytest.raises(Crash):
        await run(agent, store, DiesBeforeThePausedSave(store.checkpoints), provider, "buy")
    stored = store.checkpoints.load("s")
    assert stored is not None and stored.status == "in-progress"  # the pause was never saved
    listed = store.approvals.pending("s")
    assert [a.tool_call.id for a in listed] == ["pay1"]
    return agent, provider, listed[0].id


@pytest.mark.parametrize("approved", [True, False])
async def test_a_decision_on_the_approval_of_a_pause_cut_short_is_applied_when_the_run_goes_on(
    store: MemoryStore, log: ToolLog, approved: bool
) -> None:
    agent, provider, approval_id = await crashed_pause(store, log)
    store.approvals.decide(approval_id, approved, "decided while the process was down")

    result = await run(agent, store, store.checkpoints, provider, [])

    assert result.finish_reason == "stop"
    assert tool_results(result.messages) == ["w1", "pay1"]
    paid = next(m.result() for m in result.messages if m.tool_call_id == "pay1")
    if approved:
        assert paid == {"charged": 10, "idempotency_key": "pay1"}
        assert log.runs["pay1"] == 1
    else:
        assert paid == {"error": "rejected", "note": "decided while the process was down"}
        assert log.runs["pay1"] == 0
    assert store.approvals.pending("s") == []
    snapshot = store.approvals.load(approval_id)
    assert snapshot is not None and snapshot.applied_at is not None
    assert log.runs["w1"] == 1


async def test_a_pause_run_again_waits_on_the_approval_the_cut_short_pause_stored(
    store: MemoryStore, log: ToolLog
) -> None:
    agent, provider, approval_id = await crashed_pause(store, log)

    result = await run(agent, store, store.checkpoints, provider, [])

    assert result.finish_reason == "awaiting-approval"
    assert result.approval_id == approval_id
    assert [a.id for a in store.approvals.pending("s")] == [approval_id]  # one approval for the call, not two


async def test_an_applied_approval_is_never_taken_for_a_new_pause(store: MemoryStore, log: ToolLog) -> None:
    """The same session id, transcript and call again (the session deleted and started over): the approval of
    the first pause is applied; the new pause asks the human again, under a new id."""
    agent = Agent(name="shop", model="m", tools=[charge_tool(log)])
    first = await run(agent, store, store.checkpoints, ScriptedProvider([tool_calls(("pay1", "charge_card", {"amount": 10}))]), "buy")
    assert first.approval_id is not None
    store.approvals.decide(first.approval_id, True, None)
    assert (await run(agent, store, store.checkpoints, ScriptedProvider(["done"]), [])).finish_reason == "stop"
    store.checkpoints.delete("s")

    again = await run(agent, store, store.checkpoints, ScriptedProvider([tool_calls(("pay1", "charge_card", {"amount": 10}))]), "buy")

    assert again.finish_reason == "awaiting-approval"
    assert again.approval_id not in (None, first.approval_id)
    assert log.runs["pay1"] == 1
