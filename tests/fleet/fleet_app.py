"""The app the fleet tests' worker processes serve, configured by environment variables.

Its provider reads each session's script from Redis and answers by turn (a deterministic
model), counting every request and flagging any turn asked after it was checkpointed.
Its tools count their runs in Redis. Crashes are injected by the test through a Redis
set of triggers: `tool:<call id>` (die while running that call) and
`turn-saved:<session>:<turn>` (die right after that model turn's answer is saved),
`model:<session>:<turn>` (die while the model is asked that turn); each
fires once, and the process dies by SIGKILL: no cleanup, no ack.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

from pydantic import BaseModel

from lousho import Agent, Message, ToolContext, define_tool
from lousho.events import CheckpointSavedEvent, Event
from lousho.providers.base import ModelRequest, ModelResponse
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url, create_app

URL = os.environ["LOUSHO_TEST_FLEET_REDIS"]
PREFIX = os.environ["LOUSHO_TEST_FLEET_PREFIX"]
SETTINGS = FleetSettings(
    lease_ttl_s=float(os.environ.get("LOUSHO_TEST_LEASE_TTL_S", "2")),
    reaper_interval_s=0.5,
    requeue_backoff_s=3.0,
    queue=os.environ["LOUSHO_TEST_FLEET_QUEUE"],
)
store = RedisStore(URL, prefix=PREFIX)
redis = store.client


def key(name: str) -> str:
    return f"{PREFIX}test:{name}"


def die_if_triggered(trigger: str) -> None:
    if redis.srem(key("kill"), trigger):
        os.kill(os.getpid(), signal.SIGKILL)


def assistant_turns(messages: list[Message]) -> int:
    return sum(m.role == "assistant" for m in messages)


class ScriptFromRedis:
    async def generate(self, request: ModelRequest) -> ModelResponse:
        session, turn = request.session_id or "", assistant_turns(request.messages) + 1
        redis.hincrby(key("asked"), f"{session}:{turn}", 1)
        die_if_triggered(f"model:{session}:{turn}")
        stored = store.checkpoints.load(session)
        if stored is not None and assistant_turns(stored.messages) >= turn:
            redis.rpush(key("violations"), f"{session}: turn {turn} asked after it was checkpointed")
        delay = redis.get(key(f"model-delay:{session}:{turn}"))
        if delay:
            await asyncio.sleep(float(delay))
        answers = json.loads(redis.get(key(f"script:{session}")) or "[]")
        return ModelResponse(message=Message.model_validate(answers[turn - 1]))


class Work(BaseModel):
    n: int
    sleep_s: float = 0.0


class Charge(BaseModel):
    amount: int


async def work(args: Work, ctx: ToolContext) -> dict[str, Any]:
    redis.hincrby(key("runs"), ctx.tool_call_id, 1)
    redis.hset(key("ran-on"), ctx.tool_call_id, os.getpid())
    die_if_triggered(f"tool:{ctx.tool_call_id}")
    await asyncio.sleep(args.sleep_s)
    return {"n": args.n, "square": args.n * args.n}


def charge(args: Charge, ctx: ToolContext) -> dict[str, Any]:
    redis.hincrby(key("runs"), ctx.tool_call_id, 1)
    return {"charged": args.amount, "idempotency_key": ctx.tool_call_id}


def on_event(event: Event) -> None:
    if isinstance(event, CheckpointSavedEvent) and event.status == "in-progress" and event.session_id:
        checkpoint = store.checkpoints.load(event.session_id)
        if checkpoint is not None and checkpoint.messages[-1].tool_calls:
            die_if_triggered(f"turn-saved:{event.session_id}:{assistant_turns(checkpoint.messages)}")


agent = Agent(
    name="jobs",
    model="scripted",
    instructions="You run jobs.",
    tools=[
        define_tool(name="work", description="Do some work", input=Work, execute=work),
        define_tool(name="charge", description="Charge money", input=Charge, execute=charge, needs_approval=True),
    ],
    tool_concurrency=int(os.environ.get("LOUSHO_TEST_TOOL_CONCURRENCY", "2")),
)
app = create_app(agents=[agent], store=store, broker=broker_url(URL), provider=ScriptFromRedis(), settings=SETTINGS, on_event=on_event)

if os.environ.get("LOUSHO_TEST_DELIVER_TWICE"):
    # Every task this worker sends is sent twice, with the same task id: duplicate delivery.
    send_once = app.send_task

    def send_twice(*args: Any, **kwargs: Any) -> Any:
        send_once(*args, **kwargs)
        return send_once(*args, **kwargs)

    app.send_task = send_twice  # type: ignore[method-assign]
