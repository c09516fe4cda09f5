"""Events a run emits as it goes: what `agent.stream()` yields and hooks can watch."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lousho.checkpoint import Status
from lousho.fingerprint import Drift
from lousho.messages import ToolCall

__all__ = [
    "ApprovalRequestedEvent",
    "CheckpointSavedEvent",
    "DriftEvent",
    "Event",
    "EventSink",
    "FinishedEvent",
    "ProviderRetryEvent",
    "TextEvent",
    "ToolCallEvent",
    "ToolResultEvent",
]


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)
    session_id: str | None = None


class TextEvent(_Event):
    type: Literal["text"] = "text"
    text: str
    delta: bool = False
    """True for a streamed piece of a turn that is not checkpointed yet."""


class ToolCallEvent(_Event):
    type: Literal["tool-call"] = "tool-call"
    call: ToolCall


class ToolResultEvent(_Event):
    type: Literal["tool-result"] = "tool-result"
    call: ToolCall
    result: Any


class CheckpointSavedEvent(_Event):
    type: Literal["checkpoint-saved"] = "checkpoint-saved"
    step: int
    status: Status
    version: int


class ApprovalRequestedEvent(_Event):
    type: Literal["approval-requested"] = "approval-requested"
    approval_id: str
    call: ToolCall


class DriftEvent(_Event):
    type: Literal["drift"] = "drift"
    drift: Drift


class ProviderRetryEvent(_Event):
    type: Literal["provider-retry"] = "provider-retry"
    attempt: int
    """The attempt that failed (1-based); the next one starts after `delay_s`."""
    delay_s: float
    error: str
    status: int | None = None


class FinishedEvent(_Event):
    type: Literal["finished"] = "finished"
    finish_reason: str
    text: str | None = None


Event = (
    TextEvent
    | ToolCallEvent
    | ToolResultEvent
    | CheckpointSavedEvent
    | ApprovalRequestedEvent
    | DriftEvent
    | ProviderRetryEvent
    | FinishedEvent
)
EventSink = Callable[[Event], Awaitable[None] | None]
