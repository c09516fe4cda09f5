"""The run context: what a run of one agent over one session needs, whoever drives its steps.

The in-process loop (`run.py`) and the fleet's steps (`worker/steps.py`, `worker/tool_task.py`)
both drive a run through this API: the agent and its provider, the stores, stamping and
saving checkpoints, events, the tool context of a call, and the resume checks. Neither
reaches into the other's private members (issue #14).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lousho.abort import AbortSignal
from lousho.approvals import ApprovalStore
from lousho.checkpoint import Checkpoint, CheckpointStore, maybe_await
from lousho.definition import ResolvedAgent
from lousho.engine import take_model_turn, tool_context
from lousho.errors import AgentDriftError, ConfigurationError, ProviderError, ResumeToolMissingError
from lousho.events import (
    CheckpointSavedEvent,
    DriftEvent,
    Event,
    EventSink,
    ProviderRetryEvent,
    TextEvent,
    ToolCallEvent,
)
from lousho.fingerprint import AgentFingerprint, diff_fingerprints
from lousho.messages import Message, ToolCall, Usage
from lousho.providers.base import LLMProvider
from lousho.tools import ToolContext

__all__ = ["AgentDriftWarning", "DriftPolicy", "FinishReason", "RunContext", "RunResult", "load_stored"]

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


async def load_stored(store: CheckpointStore | None, session_id: str | None) -> Checkpoint | None:
    """The session's stored checkpoint; None without a store or a session, or when it has none."""
    if store is None or session_id is None:
        return None
    loaded: Checkpoint | None = await maybe_await(store.load(session_id))
    return loaded


@dataclass(kw_only=True)
class RunContext:
    """One run of one agent over one session: its agent, provider and stores, and how it saves."""

    agent: ResolvedAgent
    provider: LLMProvider
    session_id: str | None
    checkpoint_store: CheckpointStore | None
    approval_store: ApprovalStore | None
    max_steps: int
    signal: AbortSignal = field(default_factory=AbortSignal)
    on_event: EventSink | None = None
    on_agent_drift: DriftPolicy = "warn"
    metadata: dict[str, Any] | None = None
    """The run context its tools see (`ctx.metadata`): the `context=` the caller passed, else (None) the
    one the run saved (`run_config['ctx']`), so a resume of any kind, in process or on the fleet, gives
    tools the saved context unless the caller passes a new one (issue #16)."""
    parent_session_id: str | None = None
    """A sub-agent's run: the session whose tool call it runs (recorded in its checkpoint)."""
    latest: Checkpoint = field(init=False)
    """The newest checkpoint of this run, saved or not: what an abort starts from. Whoever
    drives the steps sets it after each one."""

    def __post_init__(self) -> None:
        # An 'ask' tool pauses on an interrupted-call approval after a crash or an abort (issue #17).
        gated = [
            t.name for t in self.agent.tools.values() if t.needs_approval is not False or t.on_interrupted == "ask"
        ]
        if gated and self.approval_store is None:
            raise ConfigurationError(
                f"tools {', '.join(gated)} may need approval: pass approval_store= (for example memory_store().approvals)"
            )
        if self.metadata is None:
            saved = (self.agent.run_config or {}).get("ctx")
            self.metadata = dict(saved) if isinstance(saved, dict) else {}

    # -- saving -----------------------------------------------------------------

    def stamp(self, checkpoint: Checkpoint, **update: Any) -> Checkpoint:
        """The next version of the checkpoint, with this agent's identity recorded (not saved)."""
        update.update(
            version=checkpoint.version + 1,
            agent_name=self.agent.name,
            fingerprint=self.fingerprint(checkpoint),
            run_config=self.agent.run_config,
        )
        return checkpoint.model_copy(update=update)

    async def write(self, checkpoint: Checkpoint) -> Checkpoint:
        """Save a checkpoint stamped already (`stamp`), when the run has a store and a session."""
        if self.checkpoint_store is not None and self.session_id is not None:
            await maybe_await(self.checkpoint_store.save(self.session_id, checkpoint))
            if self.on_event is not None:  # no event built (a pydantic validation) when nobody listens (issue #20)
                await self.emit(
                    CheckpointSavedEvent(
                        step=checkpoint.step_index, status=checkpoint.status, version=checkpoint.version
                    )
                )
        return checkpoint

    async def save(self, checkpoint: Checkpoint) -> Checkpoint:
        """Stamp and write the checkpoint: the saved version."""
        return await self.write(self.stamp(checkpoint))

    def fingerprint(self, checkpoint: Checkpoint) -> AgentFingerprint:
        """A run keeps the instructions it started with (its transcript's system message)."""
        system = next((m.content for m in checkpoint.messages if m.role == "system"), None)
        return self.agent.fingerprint(system if system is not None else None)

    async def emit(self, event: Event) -> None:
        if self.on_event is not None:
            await maybe_await(self.on_event(event.model_copy(update={"session_id": self.session_id})))

    def tool_context(self, call: ToolCall) -> ToolContext:
        """What a tool (and its approval rule) sees of this run when it handles `call`."""
        return tool_context(call, self.agent, self.session_id, self.signal, self.metadata or {})

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

    # -- a model turn -----------------------------------------------------------

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
