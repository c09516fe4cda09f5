"""Asking a provider for one turn: streaming when someone listens, retrying what may succeed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from lousho.errors import ProviderError
from lousho.providers.base import LLMProvider, ModelRequest, ModelResponse, RetryPolicy, StreamingProvider

__all__ = ["OnDelta", "OnRetry", "ask_model"]

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
            if on_delta is not None and isinstance(provider, StreamingProvider):
                return await _stream(provider, request, on_delta)
            return await provider.generate(request)
        except ProviderError as exc:
            if not exc.retryable or attempt >= retry.max_attempts:
                raise
            delay = retry.delay_s(attempt, exc.retry_after_s)
            if on_retry is not None:
                await on_retry(attempt, delay, exc)
            await asyncio.sleep(delay)
            attempt += 1
