"""`ScriptedProvider`: canned model answers for tests and demos.

It records every request it receives in `.calls`, so a test can prove a model
turn was never asked twice (`record_calls=False`: not, for a long-running fleet on it, as the benchmarks').
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from lousho.errors import ProviderError
from lousho.messages import Message, ToolCall, Usage
from lousho.providers.base import ModelRequest, ModelResponse

__all__ = ["Answer", "ScriptedProvider", "StreamingScriptedProvider", "split_text", "tool_calls"]

Answer = ModelResponse | Message | str | list[ToolCall] | Callable[[ModelRequest], Any]


def tool_calls(*calls: tuple[str, str, dict[str, Any]]) -> Message:
    """An assistant message asking for `(id, name, arguments)` calls, in order."""
    return Message.assistant(tool_calls=[ToolCall(id=i, name=n, arguments=a) for i, n, a in calls])


def _as_response(answer: Any) -> ModelResponse:
    if isinstance(answer, ModelResponse):
        return answer
    if isinstance(answer, str):
        message = Message.assistant(answer)
    elif isinstance(answer, Message):
        message = answer
    elif isinstance(answer, list):
        message = Message.assistant(tool_calls=answer)
    else:
        raise TypeError(f"a scripted answer must be a ModelResponse, Message, str or list of ToolCall, got {answer!r}")
    return ModelResponse(message=message, usage=Usage(input_tokens=10, output_tokens=5))


class ScriptedProvider:
    """Replays `answers` in order, one per model turn. A callable answer is given the request.

    With `by_turn=True` the answer is picked by the number of assistant turns already in
    the request's transcript, so a turn asked again (its answer was never checkpointed)
    gets the same answer, as a deterministic model would give.

    `record_calls=False` keeps `calls` empty: each request holds its transcript, so a worker process serving
    thousands of sessions on this provider would hold every one it was ever asked (issue #29: most of the waiting
    benchmark's memory a session in flight).
    """

    def __init__(
        self,
        answers: Sequence[Answer] = (),
        *,
        latency_s: float = 0.0,
        by_turn: bool = False,
        record_calls: bool = True,
    ) -> None:
        self.answers = list(answers)
        self.latency_s = latency_s
        self.by_turn = by_turn
        self.record_calls = record_calls
        self.calls: list[ModelRequest] = []
        """Every request received, in order (including ones whose answer was then lost); none with `record_calls`
        False."""
        self._next = 0

    @property
    def answered(self) -> int:
        """How many answers have been handed out."""
        return self._next

    async def generate(self, request: ModelRequest) -> ModelResponse:
        if self.record_calls:
            self.calls.append(request)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        index = sum(m.role == "assistant" for m in request.messages) if self.by_turn else self._next
        if index >= len(self.answers):
            raise ProviderError(
                f"ScriptedProvider has no answer {index + 1} (it holds {len(self.answers)})",
                retryable=False,
            )
        answer = self.answers[index]
        self._next += 1
        if callable(answer) and not isinstance(answer, (ModelResponse, Message)):
            answer = answer(request)
            if asyncio.iscoroutine(answer):
                answer = await answer
        return _as_response(answer)


def split_text(text: str, pieces: int) -> list[str]:
    """`text` cut into `pieces` consecutive parts (fewer when it is shorter), joined back equal to it."""
    pieces = max(1, min(pieces, len(text)))
    bounds = [round(i * len(text) / pieces) for i in range(pieces + 1)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


class StreamingScriptedProvider(ScriptedProvider):
    """A `ScriptedProvider` that streams (a `StreamingProvider`): each answer's text in `deltas` pieces, one
    every `delta_delay_s`, then the whole answer, as a vendor's streaming API does (issue #34)."""

    def __init__(
        self,
        answers: Sequence[Answer] = (),
        *,
        latency_s: float = 0.0,
        by_turn: bool = False,
        deltas: int = 10,
        delta_delay_s: float = 0.0,
        record_calls: bool = True,
    ) -> None:
        super().__init__(answers, latency_s=latency_s, by_turn=by_turn, record_calls=record_calls)
        self.deltas = deltas
        self.delta_delay_s = delta_delay_s

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        response = await self.generate(request)
        for piece in split_text(response.message.content or "", self.deltas):
            if self.delta_delay_s:
                await asyncio.sleep(self.delta_delay_s)
            yield piece
        yield response
