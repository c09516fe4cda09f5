"""Fork a finished run at step 1 with a different tool result, replay it, and compare the two runs.

    python examples/trip_planner_fork.py

A scripted "model" plans a day out: it asks for the weather, books an activity that
suits it, then answers. The fork asks "what if the forecast had been rain?" without
calling the weather tool again.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from pydantic import BaseModel

from lousho import Message, ModelRequest, ToolCall, ToolContext, define_tool, memory_store
from lousho.agent import create_agent
from lousho.providers import ScriptedProvider

runs: Counter[str] = Counter()


class CityArgs(BaseModel):
    city: str


class BookingArgs(BaseModel):
    city: str
    activity: str


def weather(args: CityArgs, ctx: ToolContext) -> dict[str, str]:
    runs["weather"] += 1
    return {"city": args.city, "forecast": "sun"}


def book_activity(args: BookingArgs, ctx: ToolContext) -> dict[str, str]:
    runs["book_activity"] += 1
    return {"booked": args.activity, "city": args.city, "reference": f"BK-{ctx.tool_call_id}"}


def planner_model(request: ModelRequest) -> Message:
    """A deterministic stand-in for an LLM: it reads the transcript and picks the next move."""
    results = {m.name: m.result() for m in request.messages if m.role == "tool"}
    if "weather" not in results:
        return Message.assistant(tool_calls=[ToolCall(id="call_weather", name="weather", arguments={"city": "Lisbon"})])
    forecast = results["weather"]["forecast"]
    if "book_activity" not in results:
        activity = "picnic at Belém" if forecast == "sun" else "Gulbenkian museum"
        return Message.assistant(
            f"The forecast is {forecast}.",
            tool_calls=[
                ToolCall(id="call_book", name="book_activity", arguments={"city": "Lisbon", "activity": activity})
            ],
        )
    return Message.assistant(f"Booked: {results['book_activity']['booked']} ({forecast} expected).")


async def main() -> None:
    store = memory_store()
    agent = create_agent(
        provider=ScriptedProvider([planner_model] * 6),
        store=store,
        name="trip-planner",
        model="scripted-planner",
        instructions="You plan day trips.",
        tools=[
            define_tool(name="weather", description="Forecast for a city", input=CityArgs, execute=weather),
            define_tool(name="book_activity", description="Book an activity", input=BookingArgs, execute=book_activity),
        ],
    )

    original = await agent.send("Plan a day in Lisbon", session_id="trip")
    print(f"original run: {original.finish_reason}, {original.steps} steps: {original.text}")
    history = await agent.history("trip") or []
    print("history of 'trip' (newest first):", ", ".join(f"step {e.step} {e.status}" for e in history))

    fork = await agent.fork(
        "trip",
        from_step=1,
        patch={"tool_result": {"tool_call_id": "call_weather", "result": {"city": "Lisbon", "forecast": "rain"}}},
    )
    print(
        f"forked {fork.session_id!r} from step {fork.step}: weather result is now {fork.checkpoint.messages[3].content}"
    )
    replayed = await agent.resume(fork.session_id)
    assert replayed is not None
    print(f"replayed run: {replayed.finish_reason}, {replayed.steps} steps: {replayed.text}")
    print(f"tool runs: {json.dumps(dict(runs), sort_keys=True)} (the fork did not call the weather tool)")

    comparison = await agent.compare("trip", fork.session_id)
    print()
    print(comparison.describe())
    diverged_at, a, b, drift = comparison  # it also unpacks like the reference's tuple
    print()
    print(
        f"diverged_at={diverged_at}, steps: a={len(a)} b={len(b)}, drift: {len(drift.arguments)} argument(s), "
        f"{len(drift.tool_order)} tool-order, step count {drift.step_count or 'same'}, "
        f"finish reason {drift.finish_reason or 'same'}"
    )


if __name__ == "__main__":
    asyncio.run(main())
