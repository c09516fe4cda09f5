"""`AgentExecutor.execute()` and `resume_after_approval()`: durable runs in this process.

Both load the session's checkpoint and hand it to a `Run`, which decides from its
status what the call means (`Run.start`; reference: 'What happens when you call
execute() again').
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from lousho.abort import AbortSignal
from lousho.approvals import ApprovalDecision, ApprovalStore, decide, parse_decision
from lousho.checkpoint import CheckpointStore, maybe_await, validate_session_id
from lousho.definition import Agent
from lousho.errors import ConfigurationError, InvalidDecisionError
from lousho.events import EventSink
from lousho.fork import ForkPatch, ForkResult
from lousho.fork import fork as _fork
from lousho.inputs import validate_business_state, validate_input
from lousho.messages import Message
from lousho.pausing import check_stored_calls_unchanged
from lousho.providers.base import LLMProvider
from lousho.run import DriftPolicy, Run, RunResult
from lousho.run_context import load_stored
from lousho.tools import Tool

__all__ = ["AgentExecutor", "InvalidDecisionError", "ResumeOptions", "resume_after_approval"]

InputLike = str | Message | dict[str, Any] | Sequence[Any] | None


class ResumeOptions(BaseModel):
    """Options of `resume_after_approval()`; everything is optional."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    max_steps: int | None = None
    signal: AbortSignal | None = None
    on_agent_drift: DriftPolicy = "warn"
    approval_store: Any = None
    """Where later approvals of the resumed run go (default: the same store)."""
    on_event: Any = None
    context: dict[str, Any] | None = None


class AgentExecutor:
    """Runs agents durably in this process. All methods are static."""

    @staticmethod
    async def execute(
        *,
        agent: Agent,
        input: InputLike = None,
        provider: LLMProvider,
        session_id: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        approval_store: ApprovalStore | None = None,
        signal: AbortSignal | None = None,
        max_steps: int | None = None,
        on_agent_drift: DriftPolicy = "warn",
        business_state: Any = None,
        context: dict[str, Any] | None = None,
        on_event: EventSink | None = None,
    ) -> RunResult:
        """Run `agent` on `input`; with `session_id` and `checkpoint_store` the run survives crashes.

        Input that would give the provider an invalid transcript raises `InvalidInputError`, and nothing
        is written (`validate_input`)."""
        if checkpoint_store is not None and session_id is None:
            raise ConfigurationError("a checkpoint_store needs a session_id to save under: pass session_id=")
        if session_id is not None:
            validate_session_id(session_id)
        stored = await load_stored(checkpoint_store, session_id)
        messages = validate_input(input, stored)
        validate_business_state(business_state)
        resuming = stored is not None and stored.status != "finished"
        resolved = await agent.resolve(stored.run_config if resuming and stored else None, ctx=context)
        run = Run(
            agent=resolved,
            provider=provider,
            session_id=session_id,
            checkpoint_store=checkpoint_store,
            approval_store=approval_store,
            max_steps=max_steps or agent.max_steps,
            signal=signal or AbortSignal(),
            on_event=on_event,
            on_agent_drift=on_agent_drift,
            metadata=context,  # None: the saved context, on a resume (issue #16)
        )
        return await run.start(stored, messages, business_state)

    @staticmethod
    async def fork(
        *,
        session_id: str,
        from_step: int | None = None,
        checkpoint_store: CheckpointStore,
        patch: ForkPatch | dict[str, Any] | None = None,
        new_session_id: str | None = None,
        from_save: int | None = None,
    ) -> ForkResult:
        """Start a new session from a step (its newest save) or one save of another session's history
        (reference: 'Fork and replay'; saves as `lousho history` numbers them, issue #15)."""
        return await _fork(
            session_id=session_id,
            from_step=from_step,
            checkpoint_store=checkpoint_store,
            patch=patch,
            new_session_id=new_session_id,
            from_save=from_save,
        )


async def resume_after_approval(
    decision: ApprovalDecision | dict[str, Any],
    approval_store: ApprovalStore,
    tool_registry: Agent | Sequence[Tool[Any]],
    provider: LLMProvider,
    options: ResumeOptions | dict[str, Any] | None = None,
    checkpoint_store: CheckpointStore | None = None,
) -> RunResult:
    """Record a human's decision and continue the paused run (reference: 'Approvals in the middle of a tool batch').

    Without `checkpoint_store` the run continues in memory and the stored session keeps
    its 'awaiting-approval' mark (reference: 'Limits').
    """
    parsed = parse_decision(decision)
    opts = options if isinstance(options, ResumeOptions) else ResumeOptions(**(options or {}))
    await check_stored_calls_unchanged(approval_store, checkpoint_store, parsed.id)  # before deciding (issue #17)
    snapshot = await maybe_await(decide(approval_store, parsed))
    agent = (
        tool_registry
        if isinstance(tool_registry, Agent)
        else Agent(
            name=snapshot.agent_name or "agent",
            model=snapshot.fingerprint.model if snapshot.fingerprint else "unknown",
            tools=list(tool_registry),
        )
    )
    stored = await load_stored(checkpoint_store, snapshot.session_id)
    checkpoint = stored or snapshot.checkpoint
    run = Run(
        agent=await agent.resolve(checkpoint.run_config, ctx=opts.context),
        provider=provider,
        session_id=snapshot.session_id,
        checkpoint_store=checkpoint_store if stored is not None else None,
        approval_store=opts.approval_store or approval_store,
        max_steps=opts.max_steps or snapshot.max_steps or agent.max_steps,
        signal=opts.signal or AbortSignal(),
        on_event=opts.on_event,
        on_agent_drift=opts.on_agent_drift,
        metadata=opts.context,  # None: the context the run saved (issue #16)
    )
    return await run.apply_decision(snapshot, checkpoint, approval_store)
