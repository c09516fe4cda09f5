"""Property: kill a random run at any point, resume until it finishes, and the four guarantees hold.

Faults are injected before and after every provider call, tool execution and store
save: an exception that nothing in lousho catches (a process dying) or a real
cancellation of the run's task. The components check the guarantees as they go
(a tool is never run for a call whose result is stored; the provider is never asked
a turn that is stored), and the final transcript is checked at the end.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from lousho import Agent, AgentExecutor, Checkpoint, ModelRequest, ModelResponse, ToolContext, define_tool
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.memory import MemoryCheckpointStore
from tests.engine.helpers import assert_valid_transcript
from tests.engine.test_execute_again import Crash

KINDS = ("ok", "fails", "bad-args", "slow")


class Args(BaseModel):
    n: int


@dataclass
class Faults:
    """Counts fault points; fires the planned fault at the planned point of the current attempt."""

    plan: list[tuple[int, str]]
    attempt: int = 0
    point: int = 0
    task: asyncio.Task[Any] | None = None
    violations: list[str] = field(default_factory=list)

    def next_attempt(self, task: asyncio.Task[Any]) -> None:
        self.attempt, self.point, self.task = self.attempt + 1, 0, task

    async def maybe_fail(self, sync: bool = False) -> None:
        self.point += 1
        if self.attempt > len(self.plan) or self.plan[self.attempt - 1][0] != self.point:
            return
        if self.plan[self.attempt - 1][1] == "cancel" and not sync and self.task is not None:
            self.task.cancel()
            await asyncio.sleep(0)
            return
        raise Crash(f"fault at point {self.point} of attempt {self.attempt}")


class FaultyStore(MemoryCheckpointStore):
    def __init__(self, faults: Faults) -> None:
        super().__init__(history_limit=0)
        self.faults = faults

    async def save(self, session_id: str, checkpoint: Checkpoint) -> None:  # type: ignore[override]
        await self.faults.maybe_fail(sync=True)
        super().save(session_id, checkpoint)
        await self.faults.maybe_fail(sync=True)


class CheckingProvider(ScriptedProvider):
    def __init__(self, answers: list[Any], faults: Faults, store: FaultyStore) -> None:
        super().__init__(answers, by_turn=True)
        self.faults, self.store = faults, store

    async def generate(self, request: ModelRequest) -> ModelResponse:
        stored = self.store.load("s")
        asked = sum(m.role == "assistant" for m in request.messages)
        if stored is not None and sum(m.role == "assistant" for m in stored.messages) > asked:
            self.faults.violations.append(f"turn {asked + 1} was asked again after it was checkpointed")
        try:
            assert_valid_transcript(request.messages)
        except AssertionError as exc:
            self.faults.violations.append(f"invalid transcript sent: {exc}")
        await self.faults.maybe_fail()
        response = await super().generate(request)
        await self.faults.maybe_fail()
        return response


def build_tool(faults: Faults, store: FaultyStore) -> Any:
    async def execute(args: Args, ctx: ToolContext) -> dict[str, int]:
        stored = store.load("s")
        if stored is not None and any(m.tool_call_id == ctx.tool_call_id for m in stored.messages):
            faults.violations.append(f"{ctx.tool_call_id} ran again after its result was recorded")
        await faults.maybe_fail()
        if args.n % 4 == 3:
            await asyncio.sleep(0.001 * (args.n % 3))
        if args.n % 4 == 1:
            raise ValueError("this tool fails; the model reads the error")
        await faults.maybe_fail()
        return {"n": args.n}

    return define_tool(name="work", description="", input=Args, execute=execute)


def script(turns: list[list[str]]) -> list[Any]:
    answers: list[Any] = []
    for t, kinds in enumerate(turns):
        calls = []
        for i, kind in enumerate(kinds):
            arguments: dict[str, Any] = {"n": "x"} if kind == "bad-args" else {"n": 4 * (t + i) + KINDS.index(kind)}
            calls.append((f"t{t}c{i}", "work", arguments))
        answers.append(tool_calls(*calls))
    return [*answers, "finished"]


async def run_until_finished(agent: Agent, provider: CheckingProvider, store: FaultyStore, faults: Faults) -> Checkpoint:
    for _ in range(len(faults.plan) + 2):
        task = asyncio.ensure_future(
            AgentExecutor.execute(agent=agent, input="go", provider=provider, session_id="s", checkpoint_store=store)
        )
        faults.next_attempt(task)
        try:
            await task
            break
        except (Crash, asyncio.CancelledError):
            stored = store.load("s")
            if stored is not None and stored.status == "finished":
                break  # it died after the final save: the run is complete
    final = store.load("s")
    assert final is not None
    return final


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.lists(st.sampled_from(KINDS), min_size=1, max_size=4), min_size=1, max_size=3),
    concurrency=st.integers(1, 3),
    plan=st.lists(st.tuples(st.integers(1, 30), st.sampled_from(["crash", "cancel"])), max_size=6),
)
def test_guarantees_hold_after_faults_at_any_point(turns: list[list[str]], concurrency: int, plan: list[tuple[int, str]]) -> None:
    faults = Faults(plan=plan)
    store = FaultyStore(faults)
    provider = CheckingProvider(script(turns), faults, store)
    agent = Agent(name="a", model="m", tools=[build_tool(faults, store)], tool_concurrency=concurrency, max_steps=10)

    final = asyncio.run(run_until_finished(agent, provider, store, faults))

    assert faults.violations == []
    assert final.status == "finished", final.status
    assert_valid_transcript(final.messages)
    calls = [c.id for m in final.messages if m.role == "assistant" for c in m.tool_calls]
    results = [m.tool_call_id for m in final.messages if m.role == "tool"]
    assert results == calls, "every call has exactly one result, in call order"
    assert [m.tool_calls[0].id if m.tool_calls else m.content for m in final.messages if m.role == "assistant"] == [
        *(f"t{t}c0" for t in range(len(turns))),
        "finished",
    ]
