"""The demo's agent: a trip planner with a scripted model, tools that take a moment, and a
booking that needs a human's approval. Deterministic, so every run of the demo tells the same story.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from pydantic import BaseModel

from lousho.definition import Agent
from lousho.messages import Message, ToolCall
from lousho.providers.scripted import ScriptedProvider
from lousho.tools import Tool, ToolContext, define_tool

__all__ = ["CRASH_ENV", "TRIP_REQUESTS", "trip_planner", "trip_provider"]

CRASH_ENV = "LOUSHO_DEMO_CRASH_IN"
"""When set to a tool call id, the process kills itself (SIGKILL) while running that call."""

TRIP_REQUESTS = {
    "trip-lisbon": "Plan a day in Lisbon and book the best restaurant.",
    "trip-oslo": "Plan a day in Oslo and book the best restaurant.",
    "trip-rome": "Plan a day in Rome and book the best restaurant.",
}
TOOL_DELAY_S = float(os.environ.get("LOUSHO_DEMO_TOOL_DELAY_S", "0.4"))


class City(BaseModel):
    city: str


class Booking(BaseModel):
    restaurant: str
    people: int


async def _pause(ctx: ToolContext) -> None:
    if os.environ.get(CRASH_ENV) == ctx.tool_call_id:
        os.kill(os.getpid(), signal.SIGKILL)  # the demo's crash: no cleanup, no goodbye
    await asyncio.sleep(TOOL_DELAY_S)


async def get_weather(args: City, ctx: ToolContext) -> dict[str, Any]:
    await _pause(ctx)
    return {"city": args.city, "forecast": "sunny, 24°C"}


async def find_restaurants(args: City, ctx: ToolContext) -> dict[str, Any]:
    await _pause(ctx)
    return {"city": args.city, "restaurants": [f"Casa {args.city}", f"{args.city} Grill"]}


async def book_table(args: Booking, ctx: ToolContext) -> dict[str, Any]:
    await _pause(ctx)
    return {"booked": args.restaurant, "people": args.people, "confirmation": f"BK-{ctx.tool_call_id[-6:]}"}


def trip_planner() -> Agent:
    tools: list[Tool[Any]] = [
        define_tool(name="get_weather", description="Weather for a city", input=City, execute=get_weather),
        define_tool(name="find_restaurants", description="Restaurants in a city", input=City, execute=find_restaurants),
        define_tool(
            name="book_table", description="Book a table", input=Booking, execute=book_table, needs_approval=True
        ),
    ]
    return Agent(name="trip_planner", model="scripted-planner", instructions="You plan day trips.", tools=tools)


def _city_of(request_messages: list[Message]) -> str:
    """The city the user asked about: the word after ' in ' in their first message."""
    first = next((m.content or "" for m in request_messages if m.role == "user"), "")
    after = first.split(" in ", 1)[1] if " in " in first else "Lisbon"
    return after.split()[0].strip(".,")


def _answer(turn: int) -> Any:
    def answer(request: Any) -> Message:
        city = _city_of(request.messages)
        key = city.lower()
        if turn == 0:
            return Message.assistant(
                f"Checking the weather and restaurants in {city}.",
                [
                    ToolCall(id=f"{key}_weather", name="get_weather", arguments={"city": city}),
                    ToolCall(id=f"{key}_food", name="find_restaurants", arguments={"city": city}),
                ],
            )
        if turn == 1:
            return Message.assistant(
                f"Booking Casa {city} for 2.",
                [ToolCall(id=f"{key}_book", name="book_table", arguments={"restaurant": f"Casa {city}", "people": 2})],
            )
        return Message.assistant(f"Your day in {city}: sunny, lunch at Casa {city} (booked for 2).")

    return answer


def trip_provider() -> ScriptedProvider:
    """Answers by turn, so a turn asked again after a crash gets the same answer."""
    return ScriptedProvider([_answer(0), _answer(1), _answer(2)], by_turn=True)
