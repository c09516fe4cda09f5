"""The provider contract: one model turn in, one model response out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from lousho.backoff import exponential_s, jittered_s
from lousho.compact import CompactModel
from lousho.messages import Message, Usage

__all__ = [
    "LLMProvider",
    "ModelRequest",
    "ModelResponse",
    "RetryPolicy",
    "StreamingProvider",
    "ToolSpec",
    "can_stream",
]


class ToolSpec(BaseModel):
    """A tool as the model sees it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments (from the tool's pydantic input model)."""


class ModelRequest(CompactModel):
    """What the engine asks of a provider for one model turn."""

    model_config = ConfigDict(frozen=True)

    model: str
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    session_id: str | None = None
    step: int = 1
    """Which model turn of the run this is (1-based)."""


class ModelResponse(CompactModel):
    """One model turn's answer."""

    model_config = ConfigDict(frozen=True)

    message: Message
    usage: Usage = Field(default_factory=Usage)


@runtime_checkable
class LLMProvider(Protocol):
    """Anything with `async generate(request) -> ModelResponse`."""

    async def generate(self, request: ModelRequest) -> ModelResponse: ...


@runtime_checkable
class StreamingProvider(Protocol):
    """A provider that can also stream: `stream(request)` yields text deltas (str) as they
    arrive, then exactly one `ModelResponse` with the whole turn (tool calls complete, usage)."""

    async def generate(self, request: ModelRequest) -> ModelResponse: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]: ...


def can_stream(provider: object) -> TypeGuard[StreamingProvider]:
    """`isinstance(provider, StreamingProvider)`, the members checked as typing does, without typing's walk of the
    protocol's members on every call: 3-5% of a busy worker's CPU on the waiting workload, where every model turn
    asks (issue #29)."""
    return getattr(provider, "generate", None) is not None and getattr(provider, "stream", None) is not None


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Bounded retries for provider errors that say a retry may help (rate limits, timeouts, server errors);
    others fail the turn at once. The wait before each retry is `lousho.backoff.jittered_s`: an exponential
    step from `base_delay_s` up to `max_delay_s`, at least a server's `Retry-After` (up to `max_delay_s`),
    with jitter, so the turns that failed together do not retry together."""

    max_attempts: int = 3
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0

    def delay_s(self, attempt: int, retry_after_s: float | None = None) -> float:
        """The wait before attempt `attempt + 1`: at least the server's Retry-After (when it gave a usable one,
        up to `max_delay_s`) and at least half the exponential step, plus jitter."""
        step_s = exponential_s(attempt, base_s=self.base_delay_s, cap_s=self.max_delay_s)
        return jittered_s(floor_s=min(retry_after_s or 0.0, self.max_delay_s), step_s=step_s)
