"""The app the fleet tests' worker processes serve, configured by environment variables.

Its provider reads each session's script from Redis and answers by turn (a deterministic
model), counting every request and flagging any turn asked after it was checkpointed.
Its tools count their runs in Redis. Crashes are injected by the test through a Redis
set of triggers: `tool:<call id>` (die while running that call) and
`turn-saved:<session>:<turn>` (die right after that model turn's answer is saved),
`model:<session>:<turn>` (die while the model is asked that turn); each
fires once, and the process dies by SIGKILL: no cleanup, no ack.

Knobs for the chaos suite (tests/chaos), all off unless set:
`LOUSHO_TEST_MAX_ATTEMPTS` (poison threshold), `LOUSHO_TEST_TRACK=1` (each tool run adds its
call id to the set `started:<pid>` and `<pid>@<time>` to the list `runlog:<call id>`), `LOUSHO_TEST_SAVE_LOG=<folder>` (every acknowledged save is
appended to `<folder>/saves-<pid>.log`, outside Redis, so a Redis crash cannot erase the record; every acknowledged
commit of a call's result to `<folder>/commits-<pid>.log`),
`LOUSHO_TEST_SEND_FAULTS=drop=0.1,dup=0.2,seed=7` (each task this worker sends is dropped or
sent twice at random; counted in the hash `send-faults`), `LOUSHO_TEST_CELERY_CONF=<json>`
(Celery settings on top of lousho's, e.g. `{"broker_transport_options": {...}}`),
`LOUSHO_TEST_STORE_OPTIONS=<json>` (RedisStore client options, e.g. `{"socket_timeout": 5}`),
`LOUSHO_TEST_PROBE_REDIS=<url>` (where the test's own counters and scripts live, when the store's
Redis is behind a fault proxy: the probes must see the faults' effects without suffering them),
`LOUSHO_TEST_OUTBOX=0` (every step sent through `app.send_task`; each call counted in the hash
`sends` by task name), `LOUSHO_TEST_FLEET_BROKER=<url>` (a broker other than the store's Redis),
`LOUSHO_TEST_QUORUM_QUEUES=1` (`FleetSettings(quorum_queues=True)`: RabbitMQ quorum queues),
`LOUSHO_TEST_MESSAGE_PROTOCOL=<n>` (the worker runs and sends step messages of protocol up to n: a stand-in for
a worker of a later release, issue #35).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from typing import Any

import redis as redis_py
from pydantic import BaseModel

from lousho import Agent, Message, ToolContext, agent_tool, define_tool
from lousho.approvals import ApprovalSnapshot
from lousho.events import CheckpointSavedEvent, Event
from lousho.providers.base import ModelRequest, ModelResponse
from lousho.stores.codec import PayloadCodec
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url, create_app

if os.environ.get("LOUSHO_TEST_MESSAGE_PROTOCOL"):  # a stand-in for a later release's worker (issue #35)
    import lousho.fleet.protocol

    lousho.fleet.protocol.MESSAGE_PROTOCOL = int(os.environ["LOUSHO_TEST_MESSAGE_PROTOCOL"])

URL = os.environ["LOUSHO_TEST_FLEET_REDIS"]
PREFIX = os.environ["LOUSHO_TEST_FLEET_PREFIX"]
SETTINGS = FleetSettings(
    lease_ttl_s=float(os.environ.get("LOUSHO_TEST_LEASE_TTL_S", "2")),
    reaper_interval_s=0.5,
    requeue_backoff_s=3.0,
    queue=os.environ["LOUSHO_TEST_FLEET_QUEUE"],
    max_attempts=int(os.environ.get("LOUSHO_TEST_MAX_ATTEMPTS", "3")),
    # Faults injected into `app.send_task` need every step sent through it: the outbox (a step's
    # script pushing its next task) is off for those workers, on otherwise.
    outbox=os.environ.get("LOUSHO_TEST_OUTBOX", "1") == "1"
    and not (os.environ.get("LOUSHO_TEST_DELIVER_TWICE") or os.environ.get("LOUSHO_TEST_SEND_FAULTS")),
    quorum_queues=os.environ.get("LOUSHO_TEST_QUORUM_QUEUES") == "1",  # RabbitMQ's (issue #18)
)
TRACK = bool(os.environ.get("LOUSHO_TEST_TRACK"))
SAVE_LOG = os.environ.get("LOUSHO_TEST_SAVE_LOG")
# The payload codec from LOUSHO_PAYLOAD_KEYS / LOUSHO_PAYLOAD_COMPRESS, as a deployment's app turns it on (issue #17).
store = RedisStore(URL, prefix=PREFIX, codec=PayloadCodec.from_env(), **json.loads(os.environ.get("LOUSHO_TEST_STORE_OPTIONS") or "{}"))
redis = redis_py.Redis.from_url(os.environ["LOUSHO_TEST_PROBE_REDIS"]) if os.environ.get("LOUSHO_TEST_PROBE_REDIS") else store.client


def key(name: str) -> str:
    return f"{PREFIX}test:{name}"


def count_run(call_id: str) -> None:
    """One MULTI: the run count, the pid it ran on and (tracked) the run log agree after any Redis fault. Separate
    commands did not: a count whose run-log entry a Redis kill lost read as a second run the faults never allowed."""
    pipe = redis.pipeline().hincrby(key("runs"), call_id, 1).hset(key("ran-on"), call_id, os.getpid())
    if TRACK:
        pipe.sadd(key(f"started:{os.getpid()}"), call_id)
        pipe.rpush(key(f"runlog:{call_id}"), f"{os.getpid()}@{time.time():.3f}")
    pipe.execute()


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
            redis.rpush(key("violations"), f"{session}: turn {turn} asked after it was checkpointed (pid {os.getpid()})")
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


class Echo(BaseModel):
    text: str


def echo(args: Echo, ctx: ToolContext) -> dict[str, Any]:
    """A tool whose result carries its argument: what the payload codec must keep out of Redis (issue #17)."""
    redis.hincrby(key("runs"), ctx.tool_call_id, 1)
    return {"said": args.text}


async def work(args: Work, ctx: ToolContext) -> dict[str, Any]:
    count_run(ctx.tool_call_id)  # a test that sees the new run count reads this run's pid, never a dead one's
    die_if_triggered(f"tool:{ctx.tool_call_id}")
    await asyncio.sleep(args.sleep_s)
    return {"n": args.n, "square": args.n * args.n}


class Hold(BaseModel):
    calls: int
    """How many calls of the test must be in flight at once before this one returns."""


async def hold(args: Hold, ctx: ToolContext) -> dict[str, Any]:
    """Many calls in flight in one process (issue #29): each returns only once `calls` calls have started and,
    on its first run, while the test holds them (key `hold`). A worker that held one call at a time would keep
    the first waiting (until 120 s): so every result that says `seen >= calls` proves they were all in flight."""
    count_run(ctx.tool_call_id)
    first_run = int(redis.hget(key("runs"), ctx.tool_call_id) or 0) == 1
    redis.incr(key("gathered"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ctx.signal.aborted:
        seen = int(redis.get(key("gathered")) or 0)
        if seen >= args.calls and not (first_run and redis.exists(key("hold"))):
            break
        await asyncio.sleep(0.05)
    redis.incr(key("returned"))
    return {"seen": int(redis.get(key("gathered")) or 0), "pid": os.getpid()}


class Gate(BaseModel):
    n: int


async def gate(args: Gate, ctx: ToolContext) -> dict[str, Any]:
    """A call that runs until the test opens its gate (key `open:<call id>`), its start marked (`count_run`: the
    hash `ran-on`) and its end (the hash `returned`: its pid). The test's `stubborn:<call id>` makes it ignore
    an abort (it swallows the cancellation and goes on), as a tool deaf to its signal does."""
    count_run(ctx.tool_call_id)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not redis.exists(key(f"open:{ctx.tool_call_id}")):
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if not redis.exists(key(f"stubborn:{ctx.tool_call_id}")):
                raise
    redis.hset(key("returned"), ctx.tool_call_id, os.getpid())
    return {"n": args.n, "gated": True}


def charge(args: Charge, ctx: ToolContext) -> dict[str, Any]:
    count_run(ctx.tool_call_id)
    return {"charged": args.amount, "idempotency_key": ctx.tool_call_id}


def log_save(event: CheckpointSavedEvent) -> None:
    """One line per acknowledged save, written straight to the kernel (it survives SIGKILL of this process)."""
    if SAVE_LOG:
        _append_to_log("saves", f"{event.session_id}\t{event.version}\t{event.status}\t{os.getpid()}\t{time.time():.6f}\n")


def _append_to_log(name: str, line: str) -> None:
    """A line appended to `<SAVE_LOG>/<name>-<pid>.log`, written straight to the kernel (it survives SIGKILL)."""
    fd = os.open(os.path.join(SAVE_LOG or "", f"{name}-{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _log_commit(session_id: str, field: str) -> None:
    _append_to_log("commits", f"{session_id}\t{field}\t{os.getpid()}\t{time.time():.6f}\n")


def _logging_commits(commit: Any) -> Any:
    """`commit` (a worker's commit of a call's result), logging each the server acknowledged: with replication
    asynchronous, a failover may lose one, as it may lose a save, and that call then runs again (issue #18)."""

    def logged(scripts: Any, session_id: str, *args: Any, **kwargs: Any) -> Any:
        reply = commit(scripts, session_id, *args, **kwargs)
        field = args[0][0] if commit.__name__ == "commit_call" else args[1]  # (field, json, lease) or epoch, field
        if reply is not False:  # `commit_result` says False when another result was there first: nothing written
            _log_commit(session_id, field)
        return reply

    return logged


def _logging_folds(fold_last_result: Any) -> Any:
    """`fold_last_result` (a turn's last result committed with its fold's save, commit_fold.lua), logging the commit
    once it returned: it commits the result whether the fold is saved or left to the usual fold (None), unless the
    session is another incarnation now (logged all the same: a test may then allow a run that did not happen)."""

    async def logged(steps: Any, checkpoint: Any, call: Any, running: Any, leased: Any) -> Any:
        outcome = await fold_last_result(steps, checkpoint, call, running, leased)
        _log_commit(steps.session_id, running.field)
        return outcome

    return logged


if SAVE_LOG:  # the three places a worker commits a call's result
    import lousho.worker.fold as _fold
    import lousho.worker.steps as _steps
    import lousho.worker.tool_task as _tool_task

    _fold.commit_call = _logging_commits(_fold.commit_call)  # type: ignore[assignment]
    _steps.commit_result = _logging_commits(_steps.commit_result)  # type: ignore[assignment]
    _tool_task.fold_last_result = _logging_folds(_tool_task.fold_last_result)  # type: ignore[assignment]


def on_event(event: Event) -> None:
    if isinstance(event, CheckpointSavedEvent):
        log_save(event)
    if isinstance(event, CheckpointSavedEvent) and event.status == "in-progress" and event.session_id:
        checkpoint = store.checkpoints.load(event.session_id)
        if checkpoint is not None and checkpoint.messages[-1].tool_calls:
            die_if_triggered(f"turn-saved:{event.session_id}:{assistant_turns(checkpoint.messages)}")


_save_approval = store.approvals.save


def save_approval(snapshot: ApprovalSnapshot) -> None:
    """An approval's write, after which a test can kill the worker (trigger `approval-saved:<session>`): the
    moment between a pause's two writes, the approval's and the paused checkpoint's (issue #33's chaos run)."""
    _save_approval(snapshot)
    if snapshot.status == "pending" and snapshot.session_id:
        die_if_triggered(f"approval-saved:{snapshot.session_id}")
        if redis.srem(key("hold-pause"), snapshot.session_id):  # until a human decides, and the wake-up is taken
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not redis.exists(key(f"woken:{snapshot.session_id}")):
                time.sleep(0.05)


store.approvals.save = save_approval  # type: ignore[method-assign]

agent = Agent(
    name="jobs",
    model="scripted",
    instructions="You run jobs.",
    tools=[
        define_tool(name="work", description="Do some work", input=Work, execute=work),
        define_tool(name="charge", description="Charge money", input=Charge, execute=charge, needs_approval=True),
        # `work` whose interrupted calls are not re-run (issue #17: tests/fleet/test_interrupted_calls_fleet.py)
        define_tool(name="mail_ask", description="Send mail", input=Work, execute=work, on_interrupted="ask"),
        define_tool(name="mail_fail", description="Send mail", input=Work, execute=work, on_interrupted="fail"),
        define_tool(name="echo", description="Say it back", input=Echo, execute=echo),
        define_tool(name="hold", description="Wait for the others", input=Hold, execute=hold),
        define_tool(name="gate", description="Wait for the test", input=Gate, execute=gate),
    ],
    tool_concurrency=int(os.environ.get("LOUSHO_TEST_TOOL_CONCURRENCY", "2")),
)
# Sub-agents on the fleet (issue #14): `planner` hands work to `cashier`, a session of its own whose `work`
# can be killed like any (trigger `tool:<call id>`) and whose `charge` needs approval.
cashier = Agent(
    name="cashier",
    model="scripted",
    instructions="You take payments.",
    tools=[
        define_tool(name="work", description="Do some work", input=Work, execute=work),
        define_tool(name="charge", description="Charge money", input=Charge, execute=charge, needs_approval=True),
    ],
)
planner = Agent(
    name="planner",
    model="scripted",
    instructions="You plan trips.",
    tools=[agent_tool(cashier, name="pay"), define_tool(name="work", description="Do some work", input=Work, execute=work)],
)
app = create_app(agents=[agent, planner], store=store, broker=os.environ.get("LOUSHO_TEST_FLEET_BROKER") or broker_url(URL),
                 provider=ScriptFromRedis(), settings=SETTINGS,
                 on_event=on_event, **json.loads(os.environ.get("LOUSHO_TEST_CELERY_CONF") or "{}"))

_send_task = app.send_task


def count_sends(*args: Any, **kwargs: Any) -> Any:
    redis.hincrby(key("sends"), args[0] if args else kwargs.get("name", "?"), 1)
    return _send_task(*args, **kwargs)


app.send_task = count_sends  # type: ignore[method-assign]

if os.environ.get("LOUSHO_TEST_DELIVER_TWICE"):
    # Every task this worker sends is sent twice, with the same task id: duplicate delivery.
    send_once = app.send_task

    def send_twice(*args: Any, **kwargs: Any) -> Any:
        send_once(*args, **kwargs)
        return send_once(*args, **kwargs)

    app.send_task = send_twice  # type: ignore[method-assign]

if os.environ.get("LOUSHO_TEST_SEND_FAULTS"):
    # A lossy, stuttering broker: each task this worker sends is dropped, or sent twice, at random.
    faults = dict(part.split("=", 1) for part in os.environ["LOUSHO_TEST_SEND_FAULTS"].split(","))
    chance = random.Random(f"{faults.get('seed', '0')}-{os.getpid()}")
    send_reliably = app.send_task

    def send_unreliably(*args: Any, **kwargs: Any) -> Any:
        roll = chance.random()
        if roll < float(faults.get("drop", 0)):
            redis.hincrby(key("send-faults"), "drop", 1)
            return None
        if roll < float(faults.get("drop", 0)) + float(faults.get("dup", 0)):
            redis.hincrby(key("send-faults"), "dup", 1)
            send_reliably(*args, **kwargs)
        return send_reliably(*args, **kwargs)

    app.send_task = send_unreliably  # type: ignore[method-assign]
