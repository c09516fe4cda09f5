"""`AnthropicProvider`: the messages API with tool use, through the official `anthropic` SDK (`AsyncAnthropic`).

Install with `pip install 'lousho[anthropic]'`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lousho.errors import ConfigurationError, ProviderError
from lousho.messages import Message, ToolCall, Usage
from lousho.providers._wire import (
    INVALID_JSON_KEY,
    NO_KEY,
    OwnedClient,
    decode_arguments,
    import_sdk,
    is_error_result,
    provider_error,
    transport_errors,
)
from lousho.providers.base import ModelRequest, ModelResponse, ToolSpec

__all__ = ["AnthropicProvider", "to_anthropic_messages", "to_anthropic_tools"]

_NAME = "AnthropicProvider"


def to_anthropic_messages(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """Our transcript as `(system, messages)`: system messages go to the `system` parameter; an assistant
    turn's calls are `tool_use` blocks; tool results are `tool_result` blocks of one user message
    (consecutive results, and a user message right after them, are merged into that one message)."""
    system: list[str] = []
    wire: list[dict[str, Any]] = []
    pending_user: list[dict[str, Any]] = []

    def flush_user() -> None:
        if not pending_user:
            return
        if len(pending_user) == 1 and pending_user[0]["type"] == "text":
            wire.append({"role": "user", "content": pending_user[0]["text"]})
        else:
            wire.append({"role": "user", "content": list(pending_user)})
        pending_user.clear()

    for message in messages:
        if message.role == "system":
            if message.content:
                system.append(message.content)
        elif message.role == "user":
            pending_user.append({"type": "text", "text": message.content or ""})
        elif message.role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content or "",
            }
            if is_error_result(message.content):
                block["is_error"] = True
            pending_user.append(block)
        else:
            flush_user()
            content: list[dict[str, Any]] = []
            if message.content:
                content.append({"type": "text", "text": message.content})
            content.extend(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
                for call in message.tool_calls
            )
            if content:  # the API refuses an empty assistant turn
                wire.append({"role": "assistant", "content": content})
    flush_user()
    return ("\n\n".join(system) if system else None), wire


def to_anthropic_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs with `input_schema` = the tool input model's JSON schema."""
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    cached = int(getattr(usage, "cache_creation_input_tokens", 0) or 0) + int(
        getattr(usage, "cache_read_input_tokens", 0) or 0
    )
    return Usage(
        input_tokens=int(getattr(usage, "input_tokens", 0) or 0) + cached,
        output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
    )


def _input_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    return {INVALID_JSON_KEY: str(value)}


@dataclass
class _Block:
    type: str
    text: list[str] = field(default_factory=list)
    id: str = ""
    name: str = ""
    json: list[str] = field(default_factory=list)
    input: Any = None


class AnthropicProvider(OwnedClient):
    """An `LLMProvider` (and `StreamingProvider`) on the messages API.

    `model` is the default model id: `create_agent()` gives it to the agent when no `model`
    is passed, and it is what the agent fingerprint records. Each request sends the agent's
    model (`ModelRequest.model`, which a dynamic agent may choose per run).

    Pass a ready `client` (an `anthropic.AsyncAnthropic`), or `base_url`/`api_key`/other
    `AsyncAnthropic` options. The SDK's own retries are turned off (`max_retries=0`): lousho
    retries rate limits, overload, timeouts, lost connections and 5xx itself, bounded by the
    agent's `RetryPolicy`. `max_tokens` is sent with every request, as are `request_options`
    (temperature, ...).
    """

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 1024,
        request_options: Mapping[str, Any] | None = None,
        **client_options: Any,
    ) -> None:
        if not model:
            raise ConfigurationError(f"{_NAME} needs a model id, for example AnthropicProvider('claude-sonnet-4-5')")
        if max_tokens < 1:
            raise ConfigurationError(f"{_NAME}: max_tokens must be at least 1, got {max_tokens}")
        self.model = model
        self.max_tokens = max_tokens
        self.request_options = dict(request_options or {})
        self._sdk = import_sdk("anthropic", "anthropic", _NAME)
        if client is not None:
            if base_url is not None or api_key is not None or client_options:
                raise ConfigurationError(
                    f"{_NAME}: pass either client= or base_url/api_key/client options, not both "
                    "(configure the client you pass instead)"
                )
            self.client: Any = client.with_options(max_retries=0)
            self._owns_client = False
            return
        if api_key is None and base_url is not None and not os.environ.get("ANTHROPIC_API_KEY"):
            api_key = NO_KEY
        client_options.setdefault("max_retries", 0)
        try:
            self.client = self._sdk.AsyncAnthropic(api_key=api_key, base_url=base_url, **client_options)
        except self._sdk.AnthropicError as exc:
            raise ConfigurationError(f"{_NAME}: the Anthropic client could not be created: {exc}") from exc
        self._owns_client = True

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r}, base_url={str(self.client.base_url)!r})"

    # -- requests ---------------------------------------------------------------

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        system, messages = to_anthropic_messages(request.messages)
        params: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            **self.request_options,
            "model": request.model if request.model and request.model != "default" else self.model,
            "messages": messages,
        }
        if system is not None:
            params["system"] = system
        if request.tools:
            params["tools"] = to_anthropic_tools(request.tools)
        return params

    def _error(self, exc: BaseException, request: ModelRequest) -> ProviderError:
        model = request.model or self.model
        return provider_error(exc, sdk=self._sdk, provider="Anthropic", model=model, api_key_env="ANTHROPIC_API_KEY")

    def _catchable(self) -> tuple[type[BaseException], ...]:
        return (self._sdk.APIError, *transport_errors())

    async def generate(self, request: ModelRequest) -> ModelResponse:
        try:
            reply = await self.client.messages.create(**self._params(request))
        except self._catchable() as exc:
            raise self._error(exc, request) from exc
        text: list[str] = []
        calls: list[ToolCall] = []
        for block in reply.content or []:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "tool_use":
                calls.append(ToolCall(id=block.id, name=block.name, arguments=_input_dict(block.input)))
        return ModelResponse(message=Message.assistant("".join(text) or None, calls), usage=_usage(reply.usage))

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """Text deltas as they arrive, then the whole turn (`tool_use` input put together from its
        `input_json_delta` fragments; usage from `message_start` and `message_delta`)."""
        params = self._params(request)
        params["stream"] = True
        blocks: dict[int, _Block] = {}
        input_tokens = output_tokens = 0
        stopped = False
        try:
            stream = await self.client.messages.create(**params)
            async with stream:
                async for event in stream:
                    kind = event.type
                    if kind == "message_start":
                        usage = _usage(getattr(event.message, "usage", None))
                        input_tokens, output_tokens = usage.input_tokens, usage.output_tokens
                    elif kind == "content_block_start":
                        start = event.content_block
                        block = blocks[event.index] = _Block(type=start.type)
                        if start.type == "text" and getattr(start, "text", ""):
                            block.text.append(start.text)
                            yield start.text
                        elif start.type == "tool_use":
                            block.id, block.name, block.input = start.id, start.name, start.input
                    elif kind == "content_block_delta":
                        block = blocks.setdefault(event.index, _Block(type="text"))
                        delta = event.delta
                        if delta.type == "text_delta" and delta.text:
                            block.text.append(delta.text)
                            yield delta.text
                        elif delta.type == "input_json_delta":
                            block.json.append(delta.partial_json or "")
                    elif kind == "message_delta":
                        counts = getattr(event, "usage", None)
                        if counts is not None:  # cumulative counts; input may be repeated here
                            final = _usage(counts)
                            output_tokens = final.output_tokens or output_tokens
                            input_tokens = final.input_tokens or input_tokens
                    elif kind == "message_stop":
                        stopped = True
        except self._catchable() as exc:
            raise self._error(exc, request) from exc
        if not stopped:
            raise ProviderError(
                f"Anthropic (model {params['model']!r}): the stream ended before the turn was complete",
                retryable=True,
            )
        text: list[str] = []
        calls: list[ToolCall] = []
        for _, block in sorted(blocks.items()):
            if block.type == "text":
                text.extend(block.text)
            elif block.type == "tool_use":
                arguments = decode_arguments("".join(block.json)) if block.json else _input_dict(block.input or {})
                calls.append(ToolCall(id=block.id, name=block.name, arguments=arguments))
        usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens)
        yield ModelResponse(message=Message.assistant("".join(text) or None, calls), usage=usage)
