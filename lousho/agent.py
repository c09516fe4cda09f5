"""`create_agent()`: one object that sends, streams, resumes, forks and resolves approvals.

With a `store` (a `StoreBundle`: `.checkpoints`, `.approvals`, `sessions()`, `prune()`, `delete()`;
every built-in store is one), passing a `session_id`
checkpoints the run in `store.checkpoints`; `resume(session_id)` finishes an
interrupted run; `approvals.resolve()` continues a paused one and keeps checkpointing
it under its session. Without a `session_id` a run is not saved (approvals still
go to `store.approvals`, so a paused plain run can be resolved).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from lousho.abort import AbortSignal
from lousho.approvals import ApprovalSnapshot, ApprovalStore, InterruptedAction
from lousho.checkpoint import Checkpoint, CheckpointStore, HistoryEntry, get_checkpoint_history, maybe_await
from lousho.definition import Agent, Hook
from lousho.errors import ConfigurationError
from lousho.events import Event, EventSink, FinishedEvent
from lousho.executor import AgentExecutor, InputLike, ResumeOptions, resume_after_approval
from lousho.fork import ForkPatch, ForkResult, fork
from lousho.providers.base import LLMProvider
from lousho.run import DriftPolicy, RunResult
from lousho.store_bundle import StoreBundle
from lousho.tools import Tool
from lousho.trajectory import TrajectoryComparison, compare_trajectories

__all__ = ["AgentApprovals", "AgentSession", "DurableAgent", "EventStream", "create_agent"]

HOOKS = ("before_model", "after_model", "before_tool", "after_tool")


def create_agent(
    *,
    provider: LLMProvider,
    store: StoreBundle | None = None,
    name: str = "agent",
    model: str | Any = None,
    instructions: str | Any = "",
    tools: Sequence[Tool[Any]] | Any = (),
    max_steps: int = 20,
    tool_concurrency: int = 1,
    on_agent_drift: DriftPolicy = "warn",
    agent: Agent | None = None,
    **hooks: Hook,
) -> DurableAgent:
    """An agent bound to a provider and (optionally) a store.

    Give either an existing `Agent` definition (`agent=`) or its fields; `model` defaults
    to the provider's `model` attribute when it has one, else "default". Hooks are
    `before_model`, `after_model`, `before_tool`, `after_tool` (sync or async).
    """
    unknown = sorted(set(hooks) - set(HOOKS))
    if unknown:
        raise ConfigurationError(
            f"create_agent() got unknown options {', '.join(unknown)}; hooks are {', '.join(HOOKS)}"
        )
    if store is not None and not isinstance(store, StoreBundle):  # the protocol, not a probe (issue #16)
        missing = [
            part for part in ("checkpoints", "approvals", "sessions", "prune", "delete") if not hasattr(store, part)
        ]
        raise ConfigurationError(
            f"store must be a store bundle (lousho.StoreBundle: .checkpoints, .approvals, sessions(), prune(), "
            f"delete()), for example memory_store() or mapping_store(a_dict); got {type(store).__name__}, "
            f"which has no {', '.join(missing)}"
        )
    if agent is not None:
        fields = name != "agent" or model is not None or instructions or tools or max_steps != 20
        if fields or tool_concurrency != 1 or hooks:
            raise ConfigurationError(
                "create_agent(agent=...) takes the agent's fields from the definition; "
                "pass either agent= or name/model/instructions/tools/limits/hooks, not both"
            )
        definition = agent
    else:
        default_model = getattr(provider, "model", None)
        definition = Agent(
            name=name,
            model=model if model is not None else default_model if isinstance(default_model, str) else "default",
            instructions=instructions,
            tools=tools,
            max_steps=max_steps,
            tool_concurrency=tool_concurrency,
            before_model=hooks.get("before_model"),
            after_model=hooks.get("after_model"),
            before_tool=hooks.get("before_tool"),
            after_tool=hooks.get("after_tool"),
        )
    return DurableAgent(definition=definition, provider=provider, store=store, on_agent_drift=on_agent_drift)


@dataclass(kw_only=True)
class DurableAgent:
    """What `create_agent()` returns."""

    definition: Agent
    provider: LLMProvider
    store: StoreBundle | None = None
    """The store bundle, or None for runs that are never saved."""
    on_agent_drift: DriftPolicy = "warn"
    approvals: AgentApprovals = field(init=False)

    def __post_init__(self) -> None:
        self.approvals = AgentApprovals(self)

    @property
    def checkpoints(self) -> CheckpointStore | None:
        return None if self.store is None else self.store.checkpoints

    @property
    def approval_store(self) -> ApprovalStore | None:
        return None if self.store is None else self.store.approvals

    def _require_checkpoints(self, what: str) -> CheckpointStore:
        checkpoints = self.checkpoints
        if checkpoints is None:
            raise ConfigurationError(f"{what} needs a store: create_agent(..., store=memory_store()) or another store")
        return checkpoints

    # -- runs -------------------------------------------------------------------

    async def send(
        self,
        input: InputLike,
        *,
        session_id: str | None = None,
        signal: AbortSignal | None = None,
        business_state: Any = None,
        context: dict[str, Any] | None = None,
        max_steps: int | None = None,
        on_event: EventSink | None = None,
    ) -> RunResult:
        """Run the agent on `input`. With a store and a `session_id` the run is checkpointed and the
        session continues as a conversation (reference: 'What happens when you call execute() again')."""
        return await AgentExecutor.execute(
            agent=self.definition,
            input=input,
            provider=self.provider,
            session_id=session_id,
            checkpoint_store=self.checkpoints if session_id is not None else None,
            approval_store=self.approval_store,
            signal=signal,
            max_steps=max_steps,
            on_agent_drift=self.on_agent_drift,
            business_state=business_state,
            context=context,
            on_event=on_event,
        )

    def stream(
        self,
        input: InputLike,
        *,
        session_id: str | None = None,
        signal: AbortSignal | None = None,
        business_state: Any = None,
        context: dict[str, Any] | None = None,
        max_steps: int | None = None,
    ) -> EventStream:
        """`send()`, yielding its events as they happen; the last one is always a `FinishedEvent`.

        A run's exception is raised to the consumer after the events before it. Stopping
        early (`break`, `aclose()`, leaving `async with`) cancels the run; a durable run keeps its
        last checkpoint, so `resume()` can finish it. `stream.result` is the `RunResult` once done.
        """
        return EventStream(
            lambda sink: self.send(
                input,
                session_id=session_id,
                signal=signal,
                business_state=business_state,
                context=context,
                max_steps=max_steps,
                on_event=sink,
            ),
            session_id,
        )

    async def resume(
        self,
        session_id: str,
        *,
        signal: AbortSignal | None = None,
        context: dict[str, Any] | None = None,
        on_event: EventSink | None = None,
    ) -> RunResult | None:
        """Finish the session's interrupted run; None when nothing is pending (unknown or finished session).

        Raises `SessionAwaitingApprovalError` while the session waits on a pending approval
        (resolve it with `approvals.resolve()`); a decided approval whose run died before
        applying it is applied now.
        """
        checkpoints = self._require_checkpoints("resume()")
        stored: Checkpoint | None = await maybe_await(checkpoints.load(session_id))
        if stored is None or stored.status == "finished":
            return None
        return await self.send(None, session_id=session_id, signal=signal, context=context, on_event=on_event)

    def stream_resume(self, session_id: str, *, signal: AbortSignal | None = None) -> EventStream:
        """`resume()` as a stream; a session with nothing pending yields nothing and `result` stays None."""
        return EventStream(lambda sink: self.resume(session_id, signal=signal, on_event=sink), session_id)

    # -- sessions, history, forks -----------------------------------------------

    def session(self, id: str | None = None) -> AgentSession:
        """A conversation checkpointed under `id` (a new id when omitted); needs a store."""
        self._require_checkpoints("session()")
        return AgentSession(agent=self, id=id or f"session-{uuid.uuid4().hex}")

    async def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry] | None:
        """The session's saves, newest first; None when the store keeps no history."""
        return await get_checkpoint_history(self._require_checkpoints("history()"), session_id, limit=limit)

    async def fork(
        self,
        session_id: str,
        *,
        from_step: int | None = None,
        patch: ForkPatch | dict[str, Any] | None = None,
        new_session_id: str | None = None,
        from_save: int | None = None,
    ) -> ForkResult:
        """A new session from step `from_step` (its newest save) or save `from_save` of `session_id`'s
        history (`lousho history` numbers the saves); `resume()` it to run it."""
        return await fork(
            session_id=session_id,
            from_step=from_step,
            checkpoint_store=self._require_checkpoints("fork()"),
            patch=patch,
            new_session_id=new_session_id,
            from_save=from_save,
        )

    async def compare(self, session_a: str, session_b: str) -> TrajectoryComparison:
        """`compare_trajectories()` of two stored sessions' latest checkpoints."""
        checkpoints = self._require_checkpoints("compare()")
        loaded: list[Checkpoint] = []
        for session_id in (session_a, session_b):
            checkpoint: Checkpoint | None = await maybe_await(checkpoints.load(session_id))
            if checkpoint is None:
                raise ConfigurationError(f"session {session_id!r} has no checkpoint to compare")
            loaded.append(checkpoint)
        return compare_trajectories(loaded[0], loaded[1])


@dataclass
class AgentSession:
    """One conversation of one agent: `send`, `stream`, `resume`, `fork` under a fixed id."""

    agent: DurableAgent
    id: str

    async def send(self, input: InputLike, **options: Any) -> RunResult:
        return await self.agent.send(input, session_id=self.id, **options)

    def stream(self, input: InputLike, **options: Any) -> EventStream:
        return self.agent.stream(input, session_id=self.id, **options)

    async def resume(self, **options: Any) -> RunResult | None:
        return await self.agent.resume(self.id, **options)

    async def fork(
        self,
        *,
        from_step: int | None = None,
        patch: ForkPatch | dict[str, Any] | None = None,
        new_session_id: str | None = None,
        from_save: int | None = None,
    ) -> AgentSession:
        """Fork this conversation (from a step's newest save, or from one save); a session of the same agent."""
        forked = await self.agent.fork(
            self.id, from_step=from_step, patch=patch, new_session_id=new_session_id, from_save=from_save
        )
        return AgentSession(agent=self.agent, id=forked.session_id)

    async def checkpoint(self) -> Checkpoint | None:
        loaded: Checkpoint | None = await maybe_await(self.agent._require_checkpoints("checkpoint()").load(self.id))  # noqa: SLF001 -- AgentSession is this module's
        return loaded

    async def history(self, limit: int | None = None) -> list[HistoryEntry] | None:
        return await self.agent.history(self.id, limit=limit)

    async def pending_approvals(self) -> list[ApprovalSnapshot]:
        return await self.agent.approvals.pending(self.id)


class AgentApprovals:
    """`agent.approvals`: the pauses in `store.approvals`, and how to resolve them."""

    def __init__(self, agent: DurableAgent) -> None:
        self._agent = agent

    def _store(self) -> ApprovalStore:
        store = self._agent.approval_store
        if store is None:
            raise ConfigurationError("approvals need a store with .approvals: create_agent(..., store=memory_store())")
        return store

    async def resolve(
        self,
        approval_id: str,
        *,
        approved: bool,
        note: str | None = None,
        action: InterruptedAction | None = None,
        result: Any = None,
        signal: AbortSignal | None = None,
        context: dict[str, Any] | None = None,
        on_event: EventSink | None = None,
    ) -> RunResult:
        """Record the decision and continue the run, checkpointing it under its session.

        The result's `finish_reason` may be 'awaiting-approval' again (the next gated call of the turn).
        An interrupted-call approval (`kind='interrupted'`) also takes `action`: 'rerun' or 'record'
        (with `result`) and approved=True, or 'fail' and approved=False (docs/interrupted-calls.md).
        """
        options = ResumeOptions(
            signal=signal, on_agent_drift=self._agent.on_agent_drift, on_event=on_event, context=context
        )
        return await resume_after_approval(
            {"id": approval_id, "approved": approved, "note": note, "action": action, "result": result},
            self._store(),
            self._agent.definition,
            self._agent.provider,
            options,
            self._agent.checkpoints,
        )

    def stream_resolve(self, approval_id: str, *, approved: bool, note: str | None = None) -> EventStream:
        """`resolve()` as a stream of events."""
        return EventStream(lambda sink: self.resolve(approval_id, approved=approved, note=note, on_event=sink), None)

    async def pending(self, session_id: str | None = None) -> list[ApprovalSnapshot]:
        """Approvals still waiting for a decision (of one session, or all), oldest first."""
        snapshots: list[ApprovalSnapshot] = await maybe_await(self._store().pending(session_id))
        return snapshots


class EventStream:
    """An async iterator of a run's events, backed by a task and a queue.

    Iterate it (`async for event in stream`), optionally inside `async with stream:`. The run
    starts on the first `__anext__`. Closing it early cancels the run.
    """

    def __init__(self, start: Any, session_id: str | None) -> None:
        self._start = start
        self._session_id = session_id
        self.result: RunResult | None = None
        """The run's result once the stream is exhausted."""
        self._events = self._generate()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _generate(self) -> AsyncGenerator[Event, None]:
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        task: asyncio.Task[RunResult | None] = asyncio.ensure_future(self._start(queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        finished = False
        try:
            while (event := await queue.get()) is not None:
                finished = isinstance(event, FinishedEvent)
                yield event
            self.result = task.result()  # the run's exception, if any, is raised here
            if self.result is not None and not finished:
                yield FinishedEvent(
                    session_id=self._session_id, finish_reason=self.result.finish_reason, text=self.result.text
                )
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
