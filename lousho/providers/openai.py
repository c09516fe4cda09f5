"""`OpenAIProvider`: chat completions with tools, through the official `openai` SDK (`AsyncOpenAI`).

Works with OpenAI and with any OpenAI-compatible server (vLLM, Ollama, llama.cpp, LiteLLM, ...)
through `base_url`. Install with `pip install 'lousho[openai]'`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lousho.errors import ConfigurationError, ProviderError
from lousho.messages import Message, ToolCall, Usage
from lousho.providers._wire import (
    NO_KEY,
    OwnedClient,
    decode_arguments,
    encode_arguments,
    import_sdk,
    provider_error,
    transport_errors,
)
from lousho.providers.base import ModelRequest, ModelResponse, ToolSpec

__all__ = ["OpenAIProvider", "to_openai_messages", "to_openai_tools"]

_NAME = "OpenAIProvider"


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our transcript in the chat completions format: tool calls on assistant messages, results as `tool` messages."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": encode_arguments(call.arguments)},
                    }
                    for call in message.tool_calls
                ]
            wire.append(entry)
        elif message.role == "tool":
            wire.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content or ""})
        else:
            wire.append({"role": message.role, "content": message.content or ""})
    return wire


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs as `function` tools; `parameters` is the tool input model's JSON schema."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    return Usage(
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
    )


@dataclass
class _CallFragments:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIProvider(OwnedClient):
    """An `LLMProvider` (and `StreamingProvider`) on the chat completions API.

    `model` is the default model id: `create_agent()` gives it to the agent when no `model`
    is passed, and it is what the agent fingerprint records. Each request sends the agent's
    model (`ModelRequest.model`, which a dynamic agent may choose per run).

    Pass a ready `client` (an `openai.AsyncOpenAI`), or `base_url`/`api_key`/other `AsyncOpenAI`
    options. The SDK's own retries are turned off (`max_retries=0`): lousho retries rate limits,
    timeouts, lost connections and 5xx itself, bounded by the agent's `RetryPolicy`, and each retry
    is a `ProviderRetryEvent`. `request_options` are sent with every request (temperature, ...).
    """

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        request_options: Mapping[str, Any] | None = None,
        **client_options: Any,
    ) -> None:
        if not model:
            raise ConfigurationError(f"{_NAME} needs a model id, for example OpenAIProvider('gpt-4o-mini')")
        self.model = model
        self.request_options = dict(request_options or {})
        self._sdk = import_sdk("openai", "openai", _NAME)
        if client is not None:
            if base_url is not None or api_key is not None or client_options:
                raise ConfigurationError(
                    f"{_NAME}: pass either client= or base_url/api_key/client options, not both "
                    "(configure the client you pass instead)"
                )
            self.client: Any = client.with_options(max_retries=0)
            self._owns_client = False
            return
        if api_key is None and not os.environ.get("OPENAI_API_KEY"):
            if base_url is None:
                raise ConfigurationError(
                    f"{_NAME} needs an API key: pass api_key= or set OPENAI_API_KEY "
                    "(a local OpenAI-compatible server only needs base_url=)"
                )
            api_key = NO_KEY
        client_options.setdefault("max_retries", 0)
        try:
            self.client = self._sdk.AsyncOpenAI(api_key=api_key, base_url=base_url, **client_options)
        except self._sdk.OpenAIError as exc:
            raise ConfigurationError(f"{_NAME}: the OpenAI client could not be created: {exc}") from exc
        self._owns_client = True

    def __repr__(self) -> str:
        return f"OpenAIProvider(model={self.model!r}, base_url={str(self.client.base_url)!r})"

    # -- requests ---------------------------------------------------------------

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            **self.request_options,
            "model": request.model if request.model and request.model != "default" else self.model,
            "messages": to_openai_messages(request.messages),
        }
        if request.tools:
            params["tools"] = to_openai_tools(request.tools)
        return params

    def _error(self, exc: BaseException, request: ModelRequest) -> ProviderError:
        model = request.model or self.model
        return provider_error(exc, sdk=self._sdk, provider="OpenAI", model=model, api_key_env="OPENAI_API_KEY")

    def _catchable(self) -> tuple[type[BaseException], ...]:
        return (self._sdk.APIError, *transport_errors())

    async def generate(self, request: ModelRequest) -> ModelResponse:
        try:
            completion = await self.client.chat.completions.create(**self._params(request))
        except self._catchable() as exc:
            raise self._error(exc, request) from exc
        if not completion.choices:
            raise ProviderError(f"OpenAI (model {self.model!r}) answered with no choices", retryable=True)
        message = completion.choices[0].message
        calls = [
            ToolCall(id=c.id or "", name=c.function.name, arguments=decode_arguments(c.function.arguments))
            for c in (message.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        return ModelResponse(
            message=Message.assistant(message.content, calls),
            usage=_usage(completion.usage),
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """Text deltas as they arrive, then the whole turn (tool calls put together from their fragments;
        usage from the final chunk, asked for with `stream_options={"include_usage": True}`)."""
        params = self._params(request)
        params.update(stream=True, stream_options={"include_usage": True})
        text: list[str] = []
        calls: dict[int, _CallFragments] = {}
        usage = Usage()
        finished = False
        try:
            stream = await self.client.chat.completions.create(**params)
            async with stream:
                async for chunk in stream:
                    if getattr(chunk, "usage", None) is not None:
                        usage = _usage(chunk.usage)
                    for choice in chunk.choices or []:
                        if choice.index not in (0, None):
                            continue
                        delta = choice.delta
                        if delta is not None and delta.content:
                            text.append(delta.content)
                            yield delta.content
                        for position, fragment in enumerate((delta.tool_calls if delta else None) or []):
                            index = fragment.index if fragment.index is not None else position
                            parts = calls.setdefault(index, _CallFragments())
                            parts.id = fragment.id or parts.id
                            function = fragment.function
                            if function is not None:
                                parts.name = function.name or parts.name
                                if function.arguments:
                                    parts.arguments.append(function.arguments)
                        if choice.finish_reason is not None:
                            finished = True
        except self._catchable() as exc:
            raise self._error(exc, request) from exc
        if not finished:
            raise ProviderError(
                f"OpenAI (model {params['model']!r}): the stream ended before the turn was complete",
                retryable=True,
            )
        tool_calls = [
            ToolCall(id=parts.id, name=parts.name, arguments=decode_arguments("".join(parts.arguments)))
            for _, parts in sorted(calls.items())
        ]
        yield ModelResponse(message=Message.assistant("".join(text) or None, tool_calls), usage=usage)
