"""The fleet's steps: one session advanced under its lease, from its checkpoint alone.

`advance()` is what the `lousho.model_turn` and `lousho.advance` tasks do: take the
session's lease, read the checkpoint, and do what the step machine says is next (a
model turn; dispatching tool calls as their own tasks; pausing on an approval;
finishing). Each of a hop's round trips to Redis is one script, called from the module of its
transition (issue #30; docs/fleet.md, 'The path of a hop', walks them in order):

- `begin.py`: the session's lease taken and everything the step needs read;
- `commit.py`: a tool call's result committed once (`tool_task.py` runs the call);
- `fold.py`: committed results recorded into the checkpoint, one save each;
- `ending.py`: the calls marked and sent, a completed turn's state dropped, the lease released and
  the next tasks pushed, usually inside the step's last save.

Every save goes through `FencedCheckpoints`, so a worker whose lease was taken
over cannot overwrite newer progress (DESIGN.md: 'The fleet').
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from lousho.abort import AbortSignal, RunAborted
from lousho.approvals import ApprovalSnapshot
from lousho.checkpoint import Checkpoint
from lousho.engine import (
    AwaitApproval,
    Finish,
    ModelTurn,
    RunTools,
    SendPendingInput,
    append_pending_input,
    finish,
    next_step,
    plan_tool_call,
)
from lousho.errors import PropagatingToolError, ProviderError, SessionSupersededError
from lousho.fleet.dispatch import send_advance, tool_turn, turn_number
from lousho.fleet.events import EventWriter
from lousho.fleet.keys import result_field
from lousho.inputs import materialize_accepted
from lousho.messages import ToolCall
from lousho.run import Run
from lousho.stores.redis_common import redis_errors
from lousho.worker.approving import apply_decided_approval, pause_on_call
from lousho.worker.begin import Begun, begin_step, begin_when_free
from lousho.worker.commit import commit_result, committed_results, turn_results
from lousho.worker.ending import FencedCheckpoints, StepEnd
from lousho.worker.fold import fold
from lousho.worker.heartbeat import heartbeat
from lousho.worker.interrupted import commit_abort_results, is_marked_interrupted
from lousho.worker.leases import Lease
from lousho.worker.limits import fleet_provider, note_session, settle_slot, take_slot, wait_for_slot
from lousho.worker.runtime import FleetRuntime
from lousho.worker.sub_agents import ChildProgress, abort_children, sub_agent_call, sub_agent_of, tell_parent

__all__ = ["FencedCheckpoints", "SessionSteps"]

log = logging.getLogger("lousho.worker")


class SessionSteps:
    """Advancing one session on the fleet."""

    def __init__(self, runtime: FleetRuntime, session_id: str) -> None:
        self.runtime = runtime
        self.session_id = session_id
        self.keys = runtime.keys
        self.scripts = runtime.scripts
        self.client = runtime.store.client
        self.signal = AbortSignal()
        self.abort_flag = False
        """The session's abort flag as the step read it when it took its lease."""
        self.epoch: str | None = None
        """The session's incarnation as the step read it (lua/lib/epoch.lua): every write checks it.
        None until the step has read it."""
        self.step_end = StepEnd(runtime, session_id)
        """What the step's end must do (`ending.py`)."""
        self.parent_session_id: str | None = None
        """A sub-agent's session: its parent's, told when the step ends it (`sub_agents.py`)."""
        self.agent_name: str | None = None
        """The session's agent, once read: whose sessions in flight it counts among (issue #29)."""
        settings = runtime.settings
        self.events = EventWriter(
            runtime.store,
            session_id,
            maxlen=settings.events_maxlen,
            flush_interval_s=settings.events_flush_interval_s,
            hook=runtime.on_event,
        )
        """The session's live event stream, as this task writes it (issue #34)."""

    # -- plumbing ----------------------------------------------------------------------

    def session_lease(self) -> Lease:
        return Lease(self.client, self.keys.lease(self.session_id), self.runtime.settings.lease_ttl_ms)

    async def make_run(self, checkpoint: Checkpoint, lease: Lease) -> Run:
        agent, provider = self.runtime.agent(checkpoint.agent_name)
        self.agent_name = agent.name
        note_session(self)  # this step's heartbeats refresh the session's slot (issue #29)
        fenced = self.step_end.fenced = FencedCheckpoints(self.runtime.store.checkpoints, lease)
        self.events.enabled = agent.stream_events  # off: no sink, so the provider is not streamed (issue #34)
        fenced.before = self.events.ride_with_save if agent.stream_events else None
        return Run(
            agent=await self.runtime.resolve(agent, checkpoint.run_config),
            provider=fleet_provider(self.runtime, provider, self.session_id),  # fleet-wide rate limits (issue #29)
            session_id=self.session_id,
            checkpoint_store=fenced,
            approval_store=self.runtime.store.approvals,
            max_steps=agent.max_steps,
            signal=self.signal,
            on_event=self.events.sink if agent.stream_events else self.runtime.on_event,
        )

    def results(self, checkpoint: Checkpoint) -> dict[str, Any]:
        """The committed results of the checkpoint's newest turn, by call id, as they are now."""
        return turn_results(committed_results(self.scripts, self.session_id), tool_turn(checkpoint))

    def commit_result(self, checkpoint: Checkpoint, call_id: str, result: Any) -> bool:
        """Commit a call's one result: the first writer wins, later ones are dropped."""
        field = result_field(tool_turn(checkpoint), call_id)
        return commit_result(self.scripts, self.session_id, self.epoch or "", field, result)

    def count_attempt(self, what: str, by: int = 1) -> int:
        counted = self.scripts.count(self.session_id, self.epoch or "", what, by)
        if counted < 0 and by > 0:
            raise SessionSupersededError(self.session_id, f"a start of {what!r}")
        return counted

    def aborted(self) -> bool:
        """The session's abort flag, as the step read it with its lease, or as the heartbeat saw it since."""
        return self.abort_flag or self.signal.aborted

    def park(self, reason: str) -> None:
        """Stop advancing the session until someone resumes it by hand (`Client.resume`)."""
        if self.scripts.park(self.session_id, self.epoch, reason):
            log.error("parked session %s: %s", self.session_id, reason)
            self.events.add("parked", data={"reason": reason})
        settle_slot(self, "parked")

    def provider_failed(self, turn: int, error: ProviderError) -> bool:
        """A model turn whose provider failed (after its own retries, `RetryPolicy`): the worker lived to see
        it, so it is no start that crashed: the start is given back and the failure counted apart. True when
        that was the `max_attempts`th: the session is parked, with the provider's error (issue #31)."""
        self.count_attempt(f"turn:{turn}", -1)
        failed = self.count_attempt(f"provider:{turn}")
        if failed < self.runtime.settings.max_attempts:
            return False
        self.park(f"the provider failed model turn {turn} {failed} times, each after its retries: {error}")
        return True

    # -- advance -----------------------------------------------------------------------

    async def advance(
        self, expected_turn: int | None = None, redispatch: bool = False, requeue: bool = False, abort: bool = False
    ) -> str:
        """Do what is next for the session, under its lease; a busy lease means someone else is on it.
        A `model_turn` task counts its turn's start as it takes the lease (poison detection).
        `requeue`: this is the reaper's `advance`, taken now: the reaper may send another (keys.requeued).
        `abort`: `Client.abort`'s wake-up, which waits for a busy lease instead of leaving: the holder may
        have read the abort flag before it was set and end without acting on it (a fold), and a call cut
        short by the abort leaves its pause to this step (issue #29: found on lousho's pool)."""
        if requeue:
            with redis_errors(self.client, f"take the requeue mark of session {self.session_id!r}"):
                self.client.delete(self.keys.requeued(self.session_id))
            self.events.add("requeued")
        lease = self.session_lease()
        attempt = f"turn:{expected_turn}" if expected_turn is not None else ""
        begun = begin_step(self.scripts, self.session_id, lease, attempt)
        if begun is None and abort:
            begun = await begin_when_free(self.scripts, self.session_id, lease, self.runtime.settings.lock_wait_s)
            if begun is None:
                send_advance(self.runtime.app, self.session_id, "abort")
                return "abort-deferred"
        if begun is None:
            return "busy"
        self.step_end.redispatch = redispatch
        try:
            async with heartbeat(self.runtime, self.session_id, lease, self.signal):
                step = self._advance_locked(lease, begun, expected_turn)
                del begun  # the step drops the checkpoint it read once it has made its own (issue #29)
                outcome = await step
        except BaseException:
            self.step_end.forget()
            settle_slot(self, None)  # failed: the reaper sends it again, and it takes a slot again (issue #29)
            raise
        finally:
            self.step_end.finish(lease)
        settle_slot(self, outcome)
        tell_parent(self, outcome)
        return outcome

    async def _advance_locked(self, lease: Lease, begun: Begun, expected_turn: int | None) -> str:
        self.epoch = self.step_end.epoch = begun.epoch
        if begun.checkpoint is None:  # deleted, or expired with the store's TTL: nothing to requeue (issue #16)
            self.runtime.inflight.drop(self.session_id)
            return "unknown-session"
        if begun.parked:
            return "parked"
        self.abort_flag = begun.aborted
        self.parent_session_id = begun.checkpoint.parent_session_id
        run = await self.make_run(begun.checkpoint, lease)
        checkpoint = materialize_accepted(begun.checkpoint, run.agent.instructions)
        # A first turn's checkpoint is made from the accepted record; the step holds that one alone while it waits
        # on the model, not the record too (issue #29: memory per call in flight).
        begun = replace(begun, checkpoint=None)
        try:
            return await self._step(run, checkpoint, expected_turn, begun, lease)
        except RunAborted:
            await run.abort(run.latest)
            self.runtime.inflight.drop(self.session_id)
            return "aborted"
        except PropagatingToolError as exc:
            self.park(f"a tool raised PropagatingToolError: {exc}")
            return "parked"

    async def _step(
        self, run: Run, checkpoint: Checkpoint, expected_turn: int | None, begun: Begun, lease: Lease
    ) -> str:
        run.latest = checkpoint
        while True:
            if self.aborted() and checkpoint.status == "in-progress":
                return await self.abort(run, checkpoint)
            step = next_step(checkpoint, run.max_steps)
            if isinstance(step, SendPendingInput):
                checkpoint = append_pending_input(checkpoint)
            elif isinstance(step, ModelTurn):
                turn = step.turn
                if expected_turn is not None and turn != expected_turn:
                    return "stale"
                counted = turn == expected_turn  # the start was counted as the lease was taken
                if not take_slot(self):  # the agent's sessions in flight are at their maximum (issue #29)
                    return wait_for_slot(self, turn, counted)
                if not lease.fresh() and not lease.extend():
                    # Paused (or partitioned) past the lease: another worker may have recorded this
                    # turn already; asking the model now would only cost a generation never saved.
                    # A zombie that stands down does not use up an attempt of the turn.
                    if counted:
                        self.count_attempt(f"turn:{turn}", -1)
                    return "lease-lost"
                started = begun.attempts if counted else self.count_attempt(f"turn:{turn}")
                if started > self.runtime.settings.max_attempts:
                    self.park(
                        f"model turn {turn} was started {self.runtime.settings.max_attempts} times without finishing"
                    )
                    return "parked"
                self.events.turn_started(turn, started)  # a new attempt: a reader drops the turn's partial text
                try:
                    checkpoint = await self.model_turn(run, checkpoint)
                except ProviderError as exc:
                    if self.provider_failed(turn, exc):
                        return "parked"
                    raise
                if self.step_end.done:
                    return "finished" if checkpoint.status == "finished" else "tools-dispatched"
                expected_turn = None
            elif isinstance(step, RunTools):
                return await self.dispatch(run, checkpoint, begun.results)
            elif isinstance(step, AwaitApproval):
                return await apply_decided_approval(self, run, checkpoint)
            elif isinstance(step, Finish):
                self.step_end.complete_turn(None)
                if not step.already_saved:
                    await run.save(finish(checkpoint, step.reason))
                else:  # saved finished already: a late heartbeat or requeue may have put it back in the index
                    self.runtime.inflight.drop(self.session_id)
                return "finished"
            run.latest = checkpoint

    async def model_turn(self, run: Run, checkpoint: Checkpoint) -> Checkpoint:
        """Ask the model, then save its answer. When nothing else is written after that save (the run
        finishes, or every call it asked for is simply sent), the save ends the step too."""
        answered = await run.answer(checkpoint)
        if answered.status == "finished":
            self.step_end.complete_turn(None)
            self.step_end.in_next_save()
        else:
            window = await self.simple_window(run, answered)
            if window is not None:
                self.step_end.send_calls(tool_turn(answered), window)
                self.step_end.in_next_save()
        return await run.record_answer(answered)

    async def simple_window(self, run: Run, checkpoint: Checkpoint) -> list[ToolCall] | None:
        """The calls to send for a turn none of whose results are in, up to `tool_concurrency`;
        None when one needs approval or has its result already (`dispatch` handles those)."""
        window: list[ToolCall] = []
        for call in checkpoint.pending_tool_calls()[: run.agent.definition.tool_concurrency]:
            plan = await plan_tool_call(call, run.agent, run.tool_context(call))
            if plan.preset or plan.needs_approval or sub_agent_of(run, call) is not None:
                return None
            window.append(call)
        return window

    # -- tool calls ----------------------------------------------------------------------

    async def dispatch(self, run: Run, checkpoint: Checkpoint, known: dict[str, bytes] | None = None) -> str:
        """Fold committed results, then send tool tasks for the next calls, up to `tool_concurrency`.
        `known`: the results hash as the step read it when it took the lease (None: read it now)."""
        for _ in range(len(checkpoint.messages) + 2):
            results = self.results(checkpoint) if known is None else turn_results(known, tool_turn(checkpoint))
            known = None
            checkpoint = await fold(self, run, checkpoint, results, may_end=True)
            if self.step_end.done:
                return "turn-enqueued"
            if checkpoint.status == "awaiting-approval":
                return "awaiting-approval"
            pending = checkpoint.pending_tool_calls()
            if not pending:
                self.step_end.complete_turn(turn_number(checkpoint))
                return "turn-enqueued"
            window, children, settled = [], 0, False
            for call in [c for c in pending if c.id not in results]:
                if is_marked_interrupted(self, run, checkpoint, call):  # it may have run (issue #17)
                    if call.id == pending[0].id:
                        return await pause_on_call(self, run, checkpoint, call, kind="interrupted")
                    break
                plan = await plan_tool_call(call, run.agent, run.tool_context(call))
                if plan.preset:  # committed here, folded on the next pass
                    settled = self.commit_result(checkpoint, call.id, plan.result) or settled
                    continue
                if plan.needs_approval:
                    if call.id == pending[0].id:
                        return await pause_on_call(self, run, checkpoint, call)
                    break
                if sub_agent_of(run, call) is not None:  # a session of its own (sub_agents.py)
                    progress = await sub_agent_call(self, run, checkpoint, call, plan.args, call.id == pending[0].id)
                    if progress in (ChildProgress.PAUSED, ChildProgress.PARKED):
                        return "awaiting-approval" if progress is ChildProgress.PAUSED else "parked"
                    if progress is ChildProgress.BLOCKED:
                        break
                    settled = settled or progress is ChildProgress.SETTLED
                    children += progress is ChildProgress.RUNNING
                else:
                    window.append(call)
                if len(window) + children >= run.agent.definition.tool_concurrency:
                    break
            if not settled:
                self.send_tools(checkpoint, window)
                return "tools-dispatched"
        return "tools-dispatched"

    def send_tools(self, checkpoint: Checkpoint, calls: list[ToolCall], redispatch: bool = False) -> None:
        """Send each call's task once, when the step ends."""
        self.step_end.send_calls(tool_turn(checkpoint), calls, redispatch)

    def approval(self, checkpoint: Checkpoint) -> ApprovalSnapshot | None:
        """The approval the checkpoint waits on, as stored now (None when it waits on none): this
        session's part of it, with the decision, when a parent's snapshot nests it (a sub-agent's)."""
        if checkpoint.approval_id is None:
            return None
        snapshot: ApprovalSnapshot | None = self.runtime.store.approvals.load(checkpoint.approval_id)
        return snapshot.for_session(self.session_id) if snapshot is not None else None

    async def abort(self, run: Run, checkpoint: Checkpoint) -> str:
        """Every unfinished call gets its committed result or 'cancelled'; the run stays 'in-progress'
        and idle (out of the in-flight index) until new input or `Client.resume`."""
        checkpoint = await fold(self, run, checkpoint)
        abort_children(self, run, checkpoint)
        ask = commit_abort_results(self, run, checkpoint)  # a call that may have run is not 'cancelled' (issue #17)
        checkpoint = await fold(self, run, checkpoint)
        if ask is not None and checkpoint.status == "in-progress" and checkpoint.pending_tool_calls()[:1] == [ask]:
            checkpoint = await run.pause(checkpoint, ask, kind="interrupted")
        elif checkpoint.status == "in-progress":
            await run.save(checkpoint)
        self.runtime.inflight.drop(self.session_id)
        if not checkpoint.pending_tool_calls():
            self.step_end.complete_turn(None)
        return "aborted"
