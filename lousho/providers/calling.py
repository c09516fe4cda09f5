"""Asking a provider for one turn: streaming when someone listens, retrying what may succeed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from lousho.errors import InvalidProviderAnswerError, ProviderError
from lousho.messages import unencodable_text
from lousho.providers.base import LLMProvider, ModelRequest, ModelResponse, RetryPolicy, StreamingProvider, can_stream

__all__ = ["OnDelta", "OnRetry", "ask_model", "check_storable"]

OnDelta = Callable[[str], Awaitable[None]]
OnRetry = Callable[[int, float, ProviderError], Awaitable[None]]


async def _stream(provider: StreamingProvider, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
    response: ModelResponse | None = None
    async for chunk in provider.stream(request):
        if isinstance(chunk, ModelResponse):
            response = chunk
        elif chunk:
            await on_delta(chunk)
    if response is None:
        raise ProviderError("the provider's stream ended without a complete response", retryable=True)
    return response


def check_storable(response: ModelResponse) -> None:
    """`InvalidProviderAnswerError` (retryable) for an answer no store could save: asked again, like any
    provider failure, instead of failing the save after the turn began (issue #31)."""
    where = unencodable_text(response.message)
    if where is not None:
        raise InvalidProviderAnswerError(where)


async def ask_model(
    provider: LLMProvider,
    request: ModelRequest,
    *,
    retry: RetryPolicy,
    on_delta: OnDelta | None = None,
    on_retry: OnRetry | None = None,
) -> ModelResponse:
    """One model turn. Text streamed before a failure is not kept: the retry generates the turn anew."""
    attempt = 1
    while True:
        try:
            if on_delta is not None and can_stream(provider):
                response = await _stream(provider, request, on_delta)
            else:
                response = await provider.generate(request)
            check_storable(response)
            return response
        except ProviderError as exc:
            if not exc.retryable or attempt >= retry.max_attempts:
                raise
            delay = retry.delay_s(attempt, exc.retry_after_s)
            if on_retry is not None:
                await on_retry(attempt, delay, exc)
            await asyncio.sleep(delay)
            attempt += 1
