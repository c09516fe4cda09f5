"""The agents the web app's fleet serves (the workers import this; the web app never does).

    LOUSHO_REDIS_URL=redis://localhost:6379/0 lousho worker --app examples.webapp.agents:app

`booker` finds a table, then books it; booking needs a human's approval. `writer` answers in a few
sentences, streamed as it writes them: the page at `/` shows its answer growing (issue #34). Their models are
stand-ins (`BookerModel`, `WriterModel`), so the example runs without an API key; put a real provider
(`lousho.providers.openai`, `...anthropic`: both stream) in their place.

`WRITER_DELTA_DELAY_S` (default 0.15): the stand-in writer's pause between two pieces of its answer.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from pydantic import BaseModel

from lousho import Agent, Message, ModelRequest, ModelResponse, ToolContext, create_agent, define_tool
from lousho.providers import tool_calls
from lousho.providers.scripted import split_text
from lousho.settings import LoushoSettings
from lousho.worker import create_app


class Search(BaseModel):
    people: int


class Booking(BaseModel):
    restaurant: str
    people: int


def find_table(args: Search, ctx: ToolContext) -> dict[str, Any]:
    return {"restaurant": "Casa Lisboa", "free_at": "20:00", "people": args.people}


def book_table(args: Booking, ctx: ToolContext) -> dict[str, Any]:
    # ctx.tool_call_id is stable across retries: pass it to the booking system as an idempotency key
    return {"booked": args.restaurant, "people": args.people, "reference": f"BK-{ctx.tool_call_id}"}


booker = Agent(
    name="booker",
    model="scripted",
    instructions="You book tables.",
    tools=[
        define_tool(name="find_table", description="Find a free table", input=Search, execute=find_table),
        define_tool(
            name="book_table", description="Book a table", input=Booking, execute=book_table, needs_approval=True
        ),
    ],
)


class BookerModel:
    """A stand-in model: for each user message, find a table, book it, then say so."""

    answers: ClassVar[list[Message]] = [
        tool_calls(("find-{n}", "find_table", {"people": 2})),
        tool_calls(("book-{n}", "book_table", {"restaurant": "Casa Lisboa", "people": 2})),
        Message.assistant("Booked: Casa Lisboa at 20:00 for 2."),
    ]

    async def generate(self, request: ModelRequest) -> ModelResponse:
        users = [i for i, m in enumerate(request.messages) if m.role == "user"]
        turn = sum(m.role == "assistant" for m in request.messages[users[-1] :])
        message = self.answers[min(turn, 2)]
        calls = [c.model_copy(update={"id": c.id.format(n=len(users))}) for c in message.tool_calls]
        return ModelResponse(message=message.model_copy(update={"tool_calls": calls}))


class WriterModel:
    """A stand-in model that streams (a `StreamingProvider`): its answer to the last user message, a few words
    at a time."""

    def __init__(self, deltas: int = 24) -> None:
        self.deltas = deltas
        self.delta_delay_s = float(os.environ.get("WRITER_DELTA_DELAY_S", "0.15"))

    @staticmethod
    def answer(request: ModelRequest) -> str:
        asked = next(m.content for m in reversed(request.messages) if m.role == "user")
        return (
            f"You asked: {asked}. Here is the answer, written a few words at a time as a model streams it. "
            "Each piece reaches the page through the fleet's event stream before the turn is saved, "
            "and the saved checkpoint stays the truth."
        )

    async def generate(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(message=Message.assistant(self.answer(request)))

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        for piece in split_text(self.answer(request), self.deltas):
            await asyncio.sleep(self.delta_delay_s)
            yield piece
        yield await self.generate(request)


writer = create_agent(
    name="writer", model="scripted", instructions="You answer in a few sentences.", provider=WriterModel()
)

settings = LoushoSettings()
app = create_app(
    agents=[booker, writer],
    store=settings.redis_store(),
    broker=settings.broker(),
    provider=BookerModel(),
    settings=settings.fleet,
    name="booker",
)
