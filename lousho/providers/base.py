"""The provider contract: one model turn in, one model response out."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from lousho.messages import Message, Usage

__all__ = ["LLMProvider", "ModelRequest", "ModelResponse", "ToolSpec"]


class ToolSpec(BaseModel):
    """A tool as the model sees it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments (from the tool's pydantic input model)."""


class ModelRequest(BaseModel):
    """What the engine asks of a provider for one model turn."""

    model_config = ConfigDict(frozen=True)

    model: str
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    session_id: str | None = None
    step: int = 1
    """Which model turn of the run this is (1-based)."""


class ModelResponse(BaseModel):
    """One model turn's answer."""

    model_config = ConfigDict(frozen=True)

    message: Message
    usage: Usage = Field(default_factory=Usage)


@runtime_checkable
class LLMProvider(Protocol):
    """Anything with `async generate(request) -> ModelResponse`."""

    async def generate(self, request: ModelRequest) -> ModelResponse: ...
