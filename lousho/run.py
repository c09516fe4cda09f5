"""One in-process run: the loop over the step machine, with a save at every moment of the
reference's checkpoint table, tool batches, approval pauses, sub-agents and aborts.

`AgentExecutor` (executor.py) builds a `Run` and hands it the session's stored checkpoint
(`start`); the fleet drives the same run context (`run_context.py`) step by step instead.
A sub-agent is a `Run` of its own, started here, so nothing below this module imports it
back (issue #14: no import circle closed inside a function).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from lousho.abort import RunAborted
from lousho.approvals import ApprovalKind, ApprovalSnapshot, ApprovalStore, utc_now
from lousho.checkpoint import Checkpoint, CheckpointStore, child_session_id, maybe_await, validate_session_id
from lousho.definition import Agent
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
)
from lousho.errors import SessionAwaitingApprovalError
from lousho.events import FinishedEvent, ToolResultEvent
from lousho.inputs import add_input_to_unfinished, continue_finished, start_session, validate_input
from lousho.interruptions import decided_interrupted_result, interruption_of, mark_started, needs_start_mark
from lousho.messages import Message, ToolCall
from lousho.pausing import NOT_RUN, pause_for_approval, prepare_resume, rejection
from lousho.run_context import AgentDriftWarning, DriftPolicy, RunContext, RunResult, load_stored
from lousho.subagents import SubAgentInput
from lousho.tools import interrupted_result

__all__ = ["AgentDriftWarning", "DriftPolicy", "Run", "RunResult"]


@dataclass(kw_only=True)
class Run(RunContext):
    """One run of one agent over one session, in this process."""

    _finished_early: dict[str, Any] = field(default_factory=dict)

    # -- what a call of execute() means (reference: 'What happens when you call execute() again') --

    async def start(self, stored: Checkpoint | None, messages: list[Message], business_state: Any = None) -> RunResult:
        """Start a new session, continue an unfinished one, or add the input to a finished one."""
        if stored is None:
            start = start_session(
                self.session_id or f"run-{uuid.uuid4().hex}", self.agent.instructions, messages, business_state
            )
            return await self.run(start.model_copy(update={"parent_session_id": self.parent_session_id}))
        if stored.status == "awaiting-approval":
            return await self._continue_decided_approval(stored)
        if stored.status == "in-progress":
            self.check_tools_exist(stored.pending_tool_calls(), stored.fingerprint)
            await self.check_drift(stored.fingerprint)
            checkpoint: Checkpoint | None = add_input_to_unfinished(stored, messages)
        else:
            checkpoint = continue_finished(stored, messages)
            if checkpoint is None:
                return RunResult.of(stored, "max-steps" if stored.finish_reason == "max-steps" else "stop")
        assert checkpoint is not None
        if business_state is not None:
            checkpoint = checkpoint.model_copy(update={"business_state": business_state})
        return await self.run(checkpoint)

    async def _continue_decided_approval(self, stored: Checkpoint) -> RunResult:
        """A paused session throws, unless its approval was decided and the process died before applying it."""
        assert stored.approval_id is not None
        if self.approval_store is None:
            raise SessionAwaitingApprovalError(stored.session_id, stored.approval_id)
        snapshot = await self._decided_unapplied(stored)
        if snapshot is None:
            raise SessionAwaitingApprovalError(stored.session_id, stored.approval_id)
        return await self.apply_decision(snapshot, stored, self.approval_store)

    async def _decided_unapplied(self, paused: Checkpoint) -> ApprovalSnapshot | None:
        """The approval `paused` waits on, when it is decided and its decision not yet applied."""
        if self.approval_store is None or paused.approval_id is None:
            return None
        snapshot: ApprovalSnapshot | None = await maybe_await(self.approval_store.load(paused.approval_id))
        if snapshot is None or snapshot.status == "pending" or snapshot.applied_at is not None:
            return None
        return snapshot

    # -- the loop ---------------------------------------------------------------

    async def run(self, checkpoint: Checkpoint) -> RunResult:
        try:
            return await self._loop(checkpoint)
        except RunAborted:
            return await self.abort(self.latest)

    async def _loop(self, checkpoint: Checkpoint) -> RunResult:
        self.latest = checkpoint
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
                # Decided already: a pause run again after a crash found the decision a human made on the
                # approval the crashed run stored (`pausing._approval_of_this_pause`): it stands.
                decided = await self._decided_unapplied(checkpoint)
                if decided is None:
                    return RunResult.of(checkpoint, "awaiting-approval")
                return await self.apply_decision(decided, checkpoint, self.approval_store)
            if isinstance(step, SendPendingInput):
                checkpoint = append_pending_input(checkpoint)
            elif isinstance(step, ModelTurn):
                checkpoint = await self.record_answer(await self.answer(checkpoint))
            elif isinstance(step, RunTools):
                checkpoint = await self._tool_batch(checkpoint, step.calls)
            self.latest = checkpoint

    async def _tool_batch(self, checkpoint: Checkpoint, calls: list[ToolCall]) -> Checkpoint:
        """Run the pending calls in order up to the first one that needs approval, then pause on it.

        A sub-agent call is a barrier: the calls before it are recorded first, and if the
        sub-agent pauses, this run pauses on the same approval."""
        planned: list[PlannedCall] = []
        for call in calls:
            interrupted = interruption_of(self.agent, call, checkpoint.started_calls)
            if interrupted == "ask":  # it may have run: a human says what it did (issue #17)
                checkpoint = await self.run_calls(checkpoint, planned)
                return await self.pause(checkpoint, call, kind="interrupted")
            if interrupted == "fail":
                planned.append(PlannedCall(call, result=interrupted_result(call.name), preset=True))
                continue
            plan = await plan_tool_call(call, self.agent, self.tool_context(call))
            if plan.needs_approval:
                checkpoint = await self.run_calls(checkpoint, planned)
                return await self.pause(checkpoint, call)
            tool = self.agent.tools.get(call.name)
            if not plan.preset and tool is not None and tool.sub_agent is not None:
                checkpoint = await self.run_calls(checkpoint, planned)
                planned = []
                child = await self.run_sub_agent(call, plan.args, tool.sub_agent)
                checkpoint = await self.record_sub_agent_result(checkpoint, call, child)
                if checkpoint.status == "awaiting-approval":
                    return checkpoint
                continue
            planned.append(plan)
        return await self.run_calls(checkpoint, planned)

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
                    if not plan.preset and needs_start_mark(self.agent, plan.call, checkpoint):
                        # Saved before it runs, so a resume after a crash knows it may have run (issue #17).
                        checkpoint = self.latest = await self.save(mark_started(checkpoint, plan.call.id))
                    call_run = run_planned_call(plan, self.agent, self.tool_context(plan.call))
                    running[asyncio.ensure_future(call_run)] = index
                while recorded in results:
                    plan = planned[recorded]
                    checkpoint = await self.save(record_tool_result(checkpoint, plan.call, results.pop(recorded)))
                    self.latest = checkpoint
                    await self.emit(ToolResultEvent(call=plan.call, result=checkpoint.messages[-1].result()))
                    recorded += 1
                if not running:
                    return checkpoint
                done, _ = await asyncio.wait({*running, aborted}, return_when=asyncio.FIRST_COMPLETED)
                for task in done - {aborted}:
                    results[running.pop(task)] = task.result()
                if aborted in done or self.signal.aborted:
                    self._finished_early = {planned[i].call.id: r for i, r in results.items()}
                    raise RunAborted(self.signal.reason)
        finally:
            aborted.cancel()
            for task in running:
                task.cancel()

    async def abort(self, checkpoint: Checkpoint) -> RunResult:
        """Stop the run at `checkpoint` (usually `latest`): every unfinished call of the turn gets
        its result if it finished, else 'cancelled'; the run stays 'in-progress'.

        A call that was running and is not 'rerun' on interruption (it is in `started_calls`) may have
        done its work: a 'fail' tool gets `interrupted_result`; at an 'ask' tool's call the results stop,
        and the session pauses on an interrupted-call approval, which the next resume shows; the calls
        after it run once it is decided (issue #17)."""
        if checkpoint.status == "awaiting-approval":
            return RunResult.of(checkpoint, "awaiting-approval")
        for call in checkpoint.pending_tool_calls():
            result = self._finished_early.get(call.id, CANCELLED_RESULT)
            # A call cut short ('cancelled') may have done its work; one that returned has its result.
            cut_short = result is CANCELLED_RESULT
            interrupted = interruption_of(self.agent, call, checkpoint.started_calls) if cut_short else None
            if interrupted == "ask":
                paused = await self.pause(checkpoint, call, kind="interrupted")
                await self.emit(FinishedEvent(finish_reason="aborted"))
                return RunResult.of(paused, "aborted")
            checkpoint = record_tool_result(
                checkpoint, call, interrupted_result(call.name) if interrupted == "fail" else result
            )
        checkpoint = await self.save(checkpoint.model_copy(update={"status": "in-progress"}))
        await self.emit(FinishedEvent(finish_reason="aborted"))
        return RunResult.of(checkpoint, "aborted")

    # -- approvals (the pause itself: pausing.py) ------------------------------

    async def pause(
        self,
        checkpoint: Checkpoint,
        call: ToolCall,
        child_approval_id: str | None = None,
        kind: ApprovalKind = "approval",
    ) -> Checkpoint:
        return await pause_for_approval(self, checkpoint, call, child_approval_id, kind)

    async def apply_decision(
        self, snapshot: ApprovalSnapshot, checkpoint: Checkpoint, source: ApprovalStore | None
    ) -> RunResult:
        """Record the paused call's result, then go on with the rest of the turn (reference: approvals, 1-3).

        `source` is the store the approval was decided in (later approvals may go elsewhere)."""
        resumed = await prepare_resume(self, snapshot, checkpoint, source)
        self.latest = resumed
        try:
            resumed = await self._record_decision(resumed, snapshot, source)
            return await self._loop(resumed)
        except RunAborted:
            return await self.abort(self.latest)

    async def _record_decision(
        self, checkpoint: Checkpoint, snapshot: ApprovalSnapshot, source: ApprovalStore | None
    ) -> Checkpoint:
        """Record the paused call's one result; then mark the approval applied."""
        call = snapshot.tool_call
        tool = self.agent.tools.get(call.name)
        if snapshot.child is not None and tool is not None and tool.sub_agent is not None:
            child = await self._resume_sub_agent(call, tool.sub_agent, snapshot)
            checkpoint = await self.record_sub_agent_result(checkpoint, call, child)
        elif snapshot.kind == "interrupted":  # run it again, or record what the human said it did (issue #17)
            rerun, result = decided_interrupted_result(snapshot)
            if rerun:
                plan = await plan_tool_call(call, self.agent, self.tool_context(call), skip_approval=True)
            else:
                plan = PlannedCall(call, result=result, preset=True)
            checkpoint = await self.run_calls(checkpoint, [plan])
        elif snapshot.status == "approved":
            plan = await plan_tool_call(call, self.agent, self.tool_context(call), skip_approval=True)
            checkpoint = await self.run_calls(checkpoint, [plan])
        else:
            checkpoint = await self.run_calls(checkpoint, [PlannedCall(call, result=rejection(snapshot), preset=True)])
        if source is not None:
            await maybe_await(source.save(snapshot.model_copy(update={"applied_at": utc_now()})))
        if snapshot.remaining_tool_calls is None and checkpoint.status == "in-progress":
            # A snapshot from before `remaining_tool_calls` existed: the calls after the paused one
            # do not run, but each gets a result so the transcript stays valid (reference: compatibility).
            skipped = [PlannedCall(c, result=NOT_RUN, preset=True) for c in checkpoint.pending_tool_calls()]
            checkpoint = await self.run_calls(checkpoint, skipped)
        return checkpoint

    # -- sub-agents (the tool that wraps an agent: subagents.py) ---------------

    async def record_sub_agent_result(self, checkpoint: Checkpoint, call: ToolCall, child: RunResult) -> Checkpoint:
        """A paused sub-agent pauses this run on its approval; a finished one's text is the call's result."""
        if child.finish_reason == "awaiting-approval" and child.approval_id:
            return await self.pause(checkpoint, call, child_approval_id=child.approval_id)
        if child.finish_reason == "aborted":
            if child.checkpoint.status == "awaiting-approval" and child.approval_id:
                # The abort cut short a sub-agent's 'ask' call: this run waits on its approval too (issue #17).
                self.latest = await self.pause(checkpoint, call, child_approval_id=child.approval_id)
            raise RunAborted(self.signal.reason)
        return await self.run_calls(checkpoint, [PlannedCall(call, result=child.text, preset=True)])

    async def run_sub_agent(self, call: ToolCall, args: SubAgentInput, agent: Agent) -> RunResult:
        """Run (or resume, or read the finished result of) the sub-agent for `call`, as `execute()` would."""
        session_id = validate_session_id(child_session_id(self.session_id or "run", call))
        stored = await load_stored(self.checkpoint_store, session_id)
        if stored is not None and stored.status == "finished":
            return RunResult.of(stored, "stop")  # it finished before the parent recorded the result
        messages = validate_input(args.input, stored)
        child = await self._child(agent, session_id, stored, self.checkpoint_store)
        return await child.start(stored, messages)

    async def _resume_sub_agent(self, call: ToolCall, agent: Agent, snapshot: ApprovalSnapshot) -> RunResult:
        """Apply this run's decision to the nested sub-agent snapshot, then let the sub-agent go on."""
        session_id = child_session_id(self.session_id or "run", call)
        decided = snapshot.for_session(session_id)  # the sub-agent's part, with the decision
        assert decided is not None and decided is not snapshot
        stored = await load_stored(self.checkpoint_store, session_id)
        checkpoint = stored if stored is not None else decided.checkpoint
        if checkpoint.status != "awaiting-approval" or checkpoint.approval_id != decided.id:
            return await self.run_sub_agent(call, SubAgentInput.model_validate(call.arguments), agent)
        child = await self._child(agent, session_id, checkpoint, self.checkpoint_store if stored is not None else None)
        return await child.apply_decision(decided, checkpoint, None)

    async def _child(
        self, agent: Agent, session_id: str, saved: Checkpoint | None, checkpoint_store: CheckpointStore | None
    ) -> Run:
        """The sub-agent's run: this run's provider, approvals and signal, under its own session.
        A resume compares only the top-level agent (reference), so the child ignores drift."""
        return Run(
            agent=await agent.resolve(saved.run_config if saved is not None else None),
            provider=self.provider,
            session_id=session_id,
            checkpoint_store=checkpoint_store,
            approval_store=self.approval_store,
            max_steps=agent.max_steps,
            signal=self.signal,
            on_agent_drift="ignore",
            parent_session_id=self.session_id,
        )
