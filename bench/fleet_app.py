"""The Celery app the fleet benchmarks' worker processes serve (`celery -A bench.fleet_app worker`).

Configured by environment variables (set by `bench.fleet`): `LOUSHO_BENCH_REDIS`,
`LOUSHO_BENCH_PREFIX`, `LOUSHO_BENCH_QUEUE`, and optionally `LOUSHO_BENCH_LEASE_TTL_S` /
`LOUSHO_BENCH_REAPER_S` (default: `FleetSettings()`'s), `LOUSHO_BENCH_OUTBOX=0` (every step sent
through `app.send_task`, for the latency benchmark's reference row) and `LOUSHO_BENCH_TRACE=1`
(record every task start, for the recovery benchmark), `LOUSHO_BENCH_BROKER` (a broker other than
the store's Redis: RabbitMQ, `bench.broker`), `LOUSHO_BENCH_STREAM_DELTAS=<n>` (each model turn also writes a text
of 500 tokens, streamed in n deltas: `bench.events`) and `LOUSHO_BENCH_EVENTS=0` (the agent's `stream_events` off:
no event stream written, issue #34).

The model is a `ScriptedProvider(by_turn=True)` with zero latency: a session's first user
message says how many tool turns it runs (`turns=<n>`), and optionally that its first tool
call sleeps (`sleep=<seconds>`: the call a recovery benchmark kills its worker in). Each turn
asks for one trivial `step` tool call; then a final text answer. A finished session pushes
`{"session", "t"}` to `<prefix>bench:done` (the benchmark waits on that list with BLPOP).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from typing import Any

from celery import signals
from pydantic import BaseModel

from bench.common import profile_between_signals
from lousho import Agent, Message, ToolContext, define_tool
from lousho.events import CheckpointSavedEvent, Event
from lousho.providers import ScriptedProvider, StreamingScriptedProvider, tool_calls
from lousho.providers.base import ModelRequest
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url, create_app

URL = os.environ["LOUSHO_BENCH_REDIS"]
PREFIX = os.environ["LOUSHO_BENCH_PREFIX"]
MAX_TURNS = 1000
_defaults = FleetSettings()
SETTINGS = FleetSettings(
    lease_ttl_s=float(os.environ.get("LOUSHO_BENCH_LEASE_TTL_S") or _defaults.lease_ttl_s),
    reaper_interval_s=float(os.environ.get("LOUSHO_BENCH_REAPER_S") or _defaults.reaper_interval_s),
    outbox=os.environ.get("LOUSHO_BENCH_OUTBOX", "1") == "1",
    queue=os.environ["LOUSHO_BENCH_QUEUE"],
)
STREAM_DELTAS = int(os.environ.get("LOUSHO_BENCH_STREAM_DELTAS") or 0)
TEXT = " ".join(f"token{i}" for i in range(500))
"""What each model turn writes when it streams (`bench.events`): 500 tokens, give or take the tokenizer."""
store = RedisStore(URL, prefix=PREFIX)
profile_between_signals()  # bench.profile_hop (issue #20)
redis = store.client


def key(name: str) -> str:
    return f"{PREFIX}bench:{name}"


class Step(BaseModel):
    n: int
    sleep_s: float = 0.0


async def step(args: Step, ctx: ToolContext) -> dict[str, Any]:
    if args.sleep_s:  # the recovery benchmark's call: every start recorded; only the first attempt sleeps
        attempt = redis.hincrby(key("attempts"), f"{ctx.session_id}/{ctx.tool_call_id}", 1)
        redis.rpush(
            key(f"starts:{ctx.session_id}"), json.dumps({"pid": os.getpid(), "t": time.time(), "attempt": attempt})
        )
        if attempt == 1:
            await asyncio.sleep(args.sleep_s)
    return {"n": args.n}


def answer(request: ModelRequest) -> Any:
    """Turn k of a session whose first user message says `turns=<n> [sleep=<s>]`."""
    spec = next(m.content for m in request.messages if m.role == "user")
    turns = int(re.search(r"turns=(\d+)", spec).group(1))  # type: ignore[union-attr]
    sleep = re.search(r"sleep=([\d.]+)", spec)
    turn = sum(m.role == "assistant" for m in request.messages)
    if turn >= turns:
        return TEXT if STREAM_DELTAS else "done"
    arguments: dict[str, Any] = {"n": turn}
    if sleep and turn == 0:
        arguments["sleep_s"] = float(sleep.group(1))
    calls = tool_calls((f"call_{turn}", "step", arguments))
    return Message.assistant(TEXT, calls.tool_calls) if STREAM_DELTAS else calls


def on_event(event: Event) -> None:
    if isinstance(event, CheckpointSavedEvent) and event.status == "finished":
        redis.rpush(key("done"), json.dumps({"session": event.session_id, "t": time.time()}))


agent = Agent(
    name="bench",
    model="scripted",
    instructions="You run a benchmark.",
    max_steps=MAX_TURNS,
    tools=[define_tool(name="step", description="A trivial step", input=Step, execute=step)],
    stream_events=os.environ.get("LOUSHO_BENCH_EVENTS", "1") == "1",
)
provider = (
    StreamingScriptedProvider([answer] * (MAX_TURNS + 1), by_turn=True, deltas=STREAM_DELTAS, record_calls=False)
    if STREAM_DELTAS
    else ScriptedProvider([answer] * (MAX_TURNS + 1), by_turn=True, record_calls=False)
)
app = create_app(
    agents=[agent],
    store=store,
    broker=os.environ.get("LOUSHO_BENCH_BROKER") or broker_url(URL),
    provider=provider,
    settings=SETTINGS,
    on_event=on_event,
)

if os.environ.get("LOUSHO_BENCH_TRACE"):

    @signals.task_prerun.connect
    def _record_start(task_id: str | None = None, task: Any = None, args: Any = None, **_: Any) -> None:
        session = (task_id or "").split("/", 1)[0]
        redis.rpush(key(f"tasks:{session}"), json.dumps({"task": task_id, "t": time.time(), "pid": os.getpid()}))
