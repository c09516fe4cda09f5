"""The waiting workload (issue #29), as the agents of a real fleet spend their time: a model turn that
answers after `LOUSHO_BENCH_MODEL_S` (default 1 s), one tool call that awaits `LOUSHO_BENCH_TOOL_S`
(default 0.5 s), and a final model turn. Three apps, served by `celery -A bench.waiting_app:<app> worker`:

- `app`: a lousho agent on a `ScriptedProvider(latency_s=...)`;
- `floor`: bare Celery tasks with the same sleeps chained the same way (model, tool, model), each
  enqueueing the next, on the same broker and Celery settings (`celery_config`), run on Celery's own
  pool for I/O (`-P threads`); time.sleep, as a bare Celery task of a sync codebase waits;
- `pooled`: the floor's tasks on lousho's pool (each awaits its sleep on the pool's loop): what the pool
  alone costs, so the bench tells it apart from what a lousho step adds.

Both push `{"session", "t"}` to `<prefix>bench:done` when a session ends. Configured like
`bench.fleet_app`: `LOUSHO_BENCH_REDIS`, `LOUSHO_BENCH_PREFIX`, `LOUSHO_BENCH_QUEUE`.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

import redis as redis_py
from celery import Celery, signals
from pydantic import BaseModel

from lousho import Agent, ToolContext, define_tool
from lousho.events import CheckpointSavedEvent, Event
from lousho.fleet.settings import celery_config
from lousho.providers import ScriptedProvider, tool_calls
from lousho.providers.base import ModelRequest
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url, create_app
from lousho.worker.pool import await_on_loop

URL = os.environ["LOUSHO_BENCH_REDIS"]
PREFIX = os.environ["LOUSHO_BENCH_PREFIX"]
QUEUE = os.environ["LOUSHO_BENCH_QUEUE"]
MODEL_S = float(os.environ.get("LOUSHO_BENCH_MODEL_S", "1.0"))
TOOL_S = float(os.environ.get("LOUSHO_BENCH_TOOL_S", "0.5"))
redis = redis_py.Redis.from_url(URL)
DONE = f"{PREFIX}bench:done"


def finished(session: str) -> None:
    redis.rpush(DONE, json.dumps({"session": session, "t": time.time()}))


# Calls in flight in this process, counted as its tasks start and end (the same on both sides): now, in the hash
# `in-flight` (the bench samples it beside the RSS), and the most, in `most-in-flight`. Counted in memory and
# published by a thread of the bench's own every 10 ms: a Redis write in the task's signal would be part of what is
# measured, and on lousho's pool it would hold the event loop of every step beside it.
_counted = {"now": 0, "most": 0}
_counting = threading.Lock()
_publisher: list[threading.Thread] = []


def _count(by: int) -> None:
    with _counting:
        _counted["now"] += by
        _counted["most"] = max(_counted["most"], _counted["now"])
        if not _publisher:
            _publisher.append(threading.Thread(target=_publish, name="bench-in-flight", daemon=True))
            _publisher[0].start()


def _publish() -> None:
    published = (-1, -1)
    while True:
        with _counting:
            now = (_counted["now"], _counted["most"])
        if now != published:
            pid = str(os.getpid())
            redis.hset(f"{PREFIX}bench:in-flight", pid, str(now[0]))
            if now[1] != published[1]:
                redis.hset(f"{PREFIX}bench:most-in-flight", pid, str(now[1]))
            published = now
        time.sleep(0.01)


@signals.task_prerun.connect  # type: ignore[untyped-decorator]
def _started(**_: Any) -> None:
    _count(1)


@signals.task_postrun.connect  # type: ignore[untyped-decorator]
def _ended(**_: Any) -> None:
    _count(-1)


# -- lousho -----------------------------------------------------------------------------------


class Wait(BaseModel):
    s: float


async def wait(args: Wait, ctx: ToolContext) -> dict[str, Any]:
    await asyncio.sleep(args.s)
    return {"waited_s": args.s}


def answer(request: ModelRequest) -> Any:
    if any(m.role == "tool" for m in request.messages):
        return "done"
    return tool_calls(("call_0", "wait", {"s": TOOL_S}))


def on_event(event: Event) -> None:
    if isinstance(event, CheckpointSavedEvent) and event.status == "finished":
        finished(event.session_id or "")


agent = Agent(
    name="waiting",
    model="scripted",
    instructions="You wait.",
    tools=[define_tool(name="wait", description="Waits", input=Wait, execute=wait)],
)
app = create_app(
    agents=[agent],
    store=RedisStore(URL, prefix=PREFIX),
    broker=broker_url(URL),
    provider=ScriptedProvider([answer] * 2, by_turn=True, latency_s=MODEL_S, record_calls=False),
    settings=FleetSettings(queue=QUEUE),
    on_event=on_event,
)

# -- the floor: bare Celery ---------------------------------------------------------------------

floor = Celery("lousho-waiting-floor", set_as_current=False)
floor.conf.update(celery_config(broker_url(URL), FleetSettings(queue=QUEUE), worker_pool="threads"))
FLOOR_STEP = "bench.waiting_step"
PLAN = (MODEL_S, TOOL_S, MODEL_S)
"""The floor session's steps: model, tool, model (each a task that sleeps, then sends the next)."""


def send_step(client_app: Celery, task: str, session: str, index: int) -> None:
    """Send step `index` of a bare session (the floor's, or the pool-alone side's `task`)."""
    client_app.send_task(
        task, args=[session, index], task_id=f"{session}/step/{index}", queue=client_app.conf.task_default_queue
    )


@floor.task(name=FLOOR_STEP)  # type: ignore[untyped-decorator]
def floor_step(session: str, index: int) -> None:
    time.sleep(PLAN[index])
    if index + 1 < len(PLAN):
        send_step(floor, FLOOR_STEP, session, index + 1)
    else:
        finished(session)


# -- the pool alone: the floor's tasks on lousho's pool ---------------------------------------------

pooled = Celery("lousho-waiting-pooled", set_as_current=False)
pooled.conf.update(celery_config(broker_url(URL), FleetSettings(queue=QUEUE)))  # lousho's pool: the default
POOLED_STEP = "bench.waiting_pooled_step"


@pooled.task(name=POOLED_STEP)  # type: ignore[untyped-decorator]
def pooled_step(session: str, index: int) -> None:
    await_on_loop(asyncio.sleep(PLAN[index]))
    if index + 1 < len(PLAN):
        send_step(pooled, POOLED_STEP, session, index + 1)
    else:
        finished(session)
