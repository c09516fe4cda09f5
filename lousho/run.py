"""One in-process run: the loop over the step machine, with a save at every moment of the
reference's checkpoint table, tool batches, approval pauses and aborts.

`AgentExecutor` (executor.py) builds a `Run` and hands it a checkpoint; the fleet
drives the same engine functions step by step instead.
"""

from __future__ import annotations

import asyncio
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lousho.abort import AbortSignal, RunAborted
from lousho.approvals import ApprovalSnapshot, ApprovalStore
from lousho.checkpoint import Checkpoint, CheckpointStore, maybe_await
from lousho.definition import ResolvedAgent
from lousho.engine import (
    CANCELLED_RESULT,
    AwaitApproval,
    Finish,
    ModelTurn,
    PlannedCall,
    RunTools,
    SendPendingInput,
    append_pending_input,
    finish,
    next_step,
    plan_tool_call,
    record_tool_result,
    run_planned_call,
    take_model_turn,
    tool_context,
)
from lousho.errors import (
    AgentDriftError,
    ConfigurationError,
    ProviderError,
    ResumeToolMissingError,
)
from lousho.events import (
    CheckpointSavedEvent,
    DriftEvent,
    Event,
    EventSink,
    FinishedEvent,
    ProviderRetryEvent,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from lousho.fingerprint import AgentFingerprint, diff_fingerprints
from lousho.messages import Message, ToolCall, Usage
from lousho.providers.base import LLMProvider
from lousho.subagents import run_sub_agent

__all__ = ["AgentDriftWarning", "DriftPolicy", "Run", "RunResult"]

FinishReason = Literal["stop", "max-steps", "awaiting-approval", "aborted"]
DriftPolicy = Literal["warn", "error", "ignore"]


class AgentDriftWarning(UserWarning):
    """The resuming agent differs from the one that saved the run (`on_agent_drift='warn'`)."""


class RunResult(BaseModel):
    """What `execute()` returns. Counters (`steps`, `usage`, `tool_calls`) are the current run's."""

    model_config = ConfigDict(frozen=True)

    finish_reason: FinishReason
    session_id: str | None
    messages: list[Message]
    """The whole conversation."""
    steps: int
    usage: Usage
    tool_calls: list[ToolCall]
    approval_id: str | None = None
    text: str | None = None
    """The last assistant message's text."""
    business_state: Any = None
    checkpoint: Checkpoint

    @classmethod
    def of(cls, checkpoint: Checkpoint, reason: FinishReason) -> RunResult:
        text = next((m.content for m in reversed(checkpoint.messages) if m.role == "assistant"), None)
        return cls(
            finish_reason=reason,
            session_id=checkpoint.session_id,
            messages=checkpoint.messages,
            steps=checkpoint.step_index,
            usage=checkpoint.usage,
            tool_calls=checkpoint.run_tool_calls(),
            approval_id=checkpoint.approval_id,
            text=text,
            business_state=checkpoint.business_state,
            checkpoint=checkpoint,
        )


@dataclass(kw_only=True)
class Run:
    """One run of one agent over one session, in this process."""

    agent: ResolvedAgent
    provider: LLMProvider
    session_id: str | None
    checkpoint_store: CheckpointStore | None
    approval_store: ApprovalStore | None
    max_steps: int
    signal: AbortSignal = field(default_factory=AbortSignal)
    on_event: EventSink | None = None
    on_agent_drift: DriftPolicy = "warn"
    metadata: dict[str, Any] = field(default_factory=dict)
    _finished_early: dict[str, Any] = field(default_factory=dict)
    _latest: Checkpoint = field(init=False)
    """The newest checkpoint of this run, saved or not: what an abort starts from."""

    def __post_init__(self) -> None:
        gated = [t.name for t in self.agent.tools.values() if t.needs_approval is not False]
        if gated and self.approval_store is None:
            raise ConfigurationError(
                f"tools {', '.join(gated)} may need approval: pass approval_store= (for example memory_store().approvals)"
            )

    # -- saving -----------------------------------------------------------------

    def _stamp(self, checkpoint: Checkpoint, **update: Any) -> Checkpoint:
        """The next version of the checkpoint, with this agent's identity recorded."""
        update.update(
            version=checkpoint.version + 1,
            agent_name=self.agent.name,
            fingerprint=self.fingerprint(checkpoint),
            run_config=self.agent.run_config,
        )
        return checkpoint.model_copy(update=update)

    async def _write(self, checkpoint: Checkpoint) -> Checkpoint:
        if self.checkpoint_store is not None and self.session_id is not None:
            await maybe_await(self.checkpoint_store.save(self.session_id, checkpoint))
            await self.emit(
                CheckpointSavedEvent(step=checkpoint.step_index, status=checkpoint.status, version=checkpoint.version)
            )
        return checkpoint

    async def save(self, checkpoint: Checkpoint) -> Checkpoint:
        return await self._write(self._stamp(checkpoint))

    def fingerprint(self, checkpoint: Checkpoint) -> AgentFingerprint:
        """A run keeps the instructions it started with (its transcript's system message)."""
        system = next((m.content for m in checkpoint.messages if m.role == "system"), None)
        return self.agent.fingerprint(system if system is not None else None)

    async def emit(self, event: Event) -> None:
        if self.on_event is not None:
            await maybe_await(self.on_event(event.model_copy(update={"session_id": self.session_id})))

    # -- resume checks ----------------------------------------------------------

    async def check_drift(self, saved: AgentFingerprint | None, on_error: Any = None) -> None:
        """Compare the saved fingerprint with this agent's before anything runs (reference: 'Resuming with a changed agent')."""
        drift = diff_fingerprints(saved, self.agent.fingerprint(None))
        if not drift or self.on_agent_drift == "ignore":
            return
        if self.on_agent_drift == "error":
            if on_error is not None:
                await on_error()
            raise AgentDriftError(
                f"session {self.session_id!r} was saved by a different agent: {drift.describe()}; "
                "resume it with the agent that started it, or pass on_agent_drift='warn'"
            )
        warnings.warn(
            f"lousho: resuming session {self.session_id!r} with a changed agent: {drift.describe()}",
            AgentDriftWarning,
            stacklevel=3,
        )
        await self.emit(DriftEvent(drift=drift))

    def check_tools_exist(self, calls: list[ToolCall], saved: AgentFingerprint | None) -> None:
        """A pending call whose tool is gone always rejects; a name the model made up does not."""
        for call in calls:
            if call.name not in self.agent.tools and (saved is None or call.name in saved.tools):
                raise ResumeToolMissingError(
                    f"session {self.session_id!r} has a pending call {call.id!r} to tool {call.name!r}, which this agent "
                    "no longer has; add the tool back (or fork the session with a recorded result for the call)"
                )

    # -- the loop ---------------------------------------------------------------

    async def run(self, checkpoint: Checkpoint) -> RunResult:
        try:
            return await self._loop(checkpoint)
        except RunAborted:
            return await self._abort(self._latest)

    async def _loop(self, checkpoint: Checkpoint) -> RunResult:
        self._latest = checkpoint
        while True:
            self.signal.raise_if_aborted()
            step = next_step(checkpoint, self.max_steps)
            if isinstance(step, Finish):
                if not step.already_saved:
                    checkpoint = await self.save(finish(checkpoint, step.reason))
                result = RunResult.of(checkpoint, "max-steps" if step.reason == "max-steps" else "stop")
                await self.emit(FinishedEvent(finish_reason=result.finish_reason, text=result.text))
                return result
            if isinstance(step, AwaitApproval):
                return RunResult.of(checkpoint, "awaiting-approval")
            if isinstance(step, SendPendingInput):
                checkpoint = append_pending_input(checkpoint)
            elif isinstance(step, ModelTurn):
                checkpoint = await self._model_turn(checkpoint)
            elif isinstance(step, RunTools):
                checkpoint = await self._tool_batch(checkpoint, step.calls)
            self._latest = checkpoint

    async def _model_turn(self, checkpoint: Checkpoint) -> Checkpoint:
        return await self.record_answer(await self.answer(checkpoint))

    async def answer(self, checkpoint: Checkpoint) -> Checkpoint:
        """Ask the model for the next turn: the checkpoint with its answer, not saved yet."""
        on_delta = self._emit_delta if self.on_event is not None else None
        answered, response = await take_model_turn(
            checkpoint, self.agent, self.provider, self.signal, on_delta=on_delta, on_retry=self._emit_retry
        )
        if response.message.content:
            await self.emit(TextEvent(text=response.message.content))
        return answered

    async def record_answer(self, answered: Checkpoint) -> Checkpoint:
        """Save the model's answer (`answer`), then tell which calls it asked for."""
        saved = await self.save(answered)
        for call in saved.messages[-1].tool_calls:
            await self.emit(ToolCallEvent(call=call))
        return saved

    async def _emit_delta(self, text: str) -> None:
        await self.emit(TextEvent(text=text, delta=True))

    async def _emit_retry(self, attempt: int, delay_s: float, error: ProviderError) -> None:
        await self.emit(ProviderRetryEvent(attempt=attempt, delay_s=delay_s, error=str(error), status=error.status))

    async def _tool_batch(self, checkpoint: Checkpoint, calls: list[ToolCall]) -> Checkpoint:
        """Run the pending calls in order up to the first one that needs approval, then pause on it.

        A sub-agent call is a barrier: the calls before it are recorded first, and if the
        sub-agent pauses, this run pauses on the same approval."""
        planned: list[PlannedCall] = []
        for call in calls:
            plan = await plan_tool_call(call, self.agent, self._ctx(call))
            if plan.needs_approval:
                checkpoint = await self.run_calls(checkpoint, planned)
                return await self.pause(checkpoint, call)
            tool = self.agent.tools.get(call.name)
            if not plan.preset and tool is not None and tool.sub_agent is not None:
                checkpoint = await self.run_calls(checkpoint, planned)
                planned = []
                child = await run_sub_agent(self, call, plan.args, tool.sub_agent)
                checkpoint = await self.record_sub_agent_result(checkpoint, call, child)
                if checkpoint.status == "awaiting-approval":
                    return checkpoint
                continue
            planned.append(plan)
        return await self.run_calls(checkpoint, planned)

    async def record_sub_agent_result(self, checkpoint: Checkpoint, call: ToolCall, child: RunResult) -> Checkpoint:
        """A paused sub-agent pauses this run on its approval; a finished one's text is the call's result."""
        if child.finish_reason == "awaiting-approval" and child.approval_id:
            return await self.pause(checkpoint, call, child_approval_id=child.approval_id)
        if child.finish_reason == "aborted":
            raise RunAborted(self.signal.reason)
        return await self.run_calls(checkpoint, [PlannedCall(call, result=child.text, preset=True)])

    def _ctx(self, call: ToolCall) -> Any:
        return tool_context(call, self.agent, self.session_id, self.signal, self.metadata)

    async def run_calls(self, checkpoint: Checkpoint, planned: list[PlannedCall]) -> Checkpoint:
        """Run calls up to `tool_concurrency` at once; record results in call order, a save each."""
        results: dict[int, Any] = {}
        running: dict[asyncio.Task[Any], int] = {}
        queue = iter(enumerate(planned))
        recorded = 0
        aborted = asyncio.ensure_future(self.signal.wait())
        try:
            while True:
                while len(running) < self.agent.definition.tool_concurrency and (item := next(queue, None)):
                    index, plan = item
                    running[asyncio.ensure_future(run_planned_call(plan, self.agent, self._ctx(plan.call)))] = index
                while recorded in results:
                    plan = planned[recorded]
                    checkpoint = await self.save(record_tool_result(checkpoint, plan.call, results.pop(recorded)))
                    self._latest = checkpoint
                    await self.emit(ToolResultEvent(call=plan.call, result=checkpoint.messages[-1].result()))
                    recorded += 1
                if not running:
                    return checkpoint
                done, _ = await asyncio.wait({*running, aborted}, return_when=asyncio.FIRST_COMPLETED)
                for task in done - {aborted}:
                    results[running.pop(task)] = task.result()
                if aborted in done:
                    self._finished_early = {planned[i].call.id: r for i, r in results.items()}
                    raise RunAborted(self.signal.reason)
        finally:
            aborted.cancel()
            for task in running:
                task.cancel()

    async def _abort(self, checkpoint: Checkpoint) -> RunResult:
        """Every unfinished call of the turn gets a 'cancelled' result; the run stays 'in-progress'."""
        if checkpoint.status == "awaiting-approval":
            return RunResult.of(checkpoint, "awaiting-approval")
        for call in checkpoint.pending_tool_calls():
            checkpoint = record_tool_result(checkpoint, call, self._finished_early.get(call.id, CANCELLED_RESULT))
        checkpoint = await self.save(checkpoint.model_copy(update={"status": "in-progress"}))
        await self.emit(FinishedEvent(finish_reason="aborted"))
        return RunResult.of(checkpoint, "aborted")

    # -- approvals (lousho/pausing.py) -----------------------------------------

    async def pause(self, checkpoint: Checkpoint, call: ToolCall, child_approval_id: str | None = None) -> Checkpoint:
        from lousho.pausing import pause_for_approval

        return await pause_for_approval(self, checkpoint, call, child_approval_id)

    async def apply_decision(
        self, snapshot: ApprovalSnapshot, checkpoint: Checkpoint, source: ApprovalStore | None
    ) -> RunResult:
        """Record the paused call's result, then go on with the rest of the turn (reference: approvals, 1-3).

        `source` is the store the approval was decided in (later approvals may go elsewhere)."""
        from lousho.pausing import prepare_resume, record_decision

        resumed = await prepare_resume(self, snapshot, checkpoint, source)
        self._latest = resumed
        try:
            resumed = await record_decision(self, resumed, snapshot, source)
            return await self._loop(resumed)
        except RunAborted:
            return await self._abort(self._latest)
