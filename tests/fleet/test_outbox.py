"""The outbox: a worker pushes a step's next task from the script that ends the step (lousho/worker/outbox.py)."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery, signals

from lousho import Message
from lousho.fleet.dispatch import model_turn_task, send, tool_call_task
from lousho.fleet.protocol import PROTOCOL_HEADER
from lousho.fleet.settings import celery_config
from lousho.fleet.transport import decode_entry
from lousho.formats import MESSAGE_PROTOCOL
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url
from lousho.worker import outbox as outbox_module
from lousho.worker.outbox import Outbox
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def other_db(broker: str) -> str:
    """The same broker URL on database 1 (the tests' Redis is on database 0)."""
    if broker.startswith("redis+socket://"):
        return re.sub(r"virtual_host=\d+", "virtual_host=1", broker)
    return re.sub(r"/\d+$", "", broker.rstrip("/")) + "/1"


def celery_app(broker: str, settings: FleetSettings) -> Celery:
    app = Celery("outbox-test", set_as_current=False)
    app.conf.update(celery_config(broker, settings))
    return app


@pytest.fixture
def queue(redis_client: redis.Redis) -> Iterator[str]:
    name = f"lousho-test-outbox-{uuid.uuid4().hex[:12]}"
    yield name
    redis_client.delete(name)


def unpushed(message: dict[str, Any]) -> dict[str, Any]:
    """A message without what differs between any two pushes of it (kombu's random delivery tag)."""
    return {**message, "properties": {k: v for k, v in message["properties"].items() if k != "delivery_tag"}}


@pytest.mark.parametrize("task", [model_turn_task("s1", 4), tool_call_task("s1", "call_0", "work", 4)])
def test_the_outbox_pushes_the_message_celery_would_send(
    task: Any, redis_url: str, redis_client: redis.Redis, redis_prefix: str, queue: str
) -> None:
    settings = FleetSettings(queue=queue)
    app = celery_app(broker_url(redis_url), settings)
    outbox = Outbox(app, RedisStore(redis_client, prefix=redis_prefix), settings)
    assert outbox.direct and outbox.queue_key == queue

    pushed = json.loads(outbox.encode(task))
    send(app, task)
    sent = json.loads(redis_client.lpop(queue))  # type: ignore[arg-type]

    assert unpushed(pushed) == unpushed(sent)
    assert sent["headers"][PROTOCOL_HEADER] == MESSAGE_PROTOCOL  # both say the message's protocol (issue #35)


def drop_the_id(headers: dict[str, Any], **_: Any) -> None:
    headers.pop("id", None)


def rename_the_task(headers: dict[str, Any], **_: Any) -> None:
    headers["task"] = "lousho.something_else"


@pytest.mark.parametrize("tamper", [drop_the_id, rename_the_task])
def test_a_message_that_does_not_read_back_as_its_task_is_never_pushed(
    tamper: Any,
    redis_url: str,
    redis_client: redis.Redis,
    redis_prefix: str,
    queue: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A `before_task_publish` receiver (say a buggy tracer) broke the headers: the outbox gives '' (the
    step's end sends that task through Celery) and says why, rather than push what no worker can run."""
    settings = FleetSettings(queue=queue)
    app = celery_app(broker_url(redis_url), settings)
    outbox = Outbox(app, RedisStore(redis_client, prefix=redis_prefix), settings)
    assert outbox.direct and outbox.encode(model_turn_task("s1", 4))

    signals.before_task_publish.connect(tamper, weak=False)
    try:
        message = outbox.encode(model_turn_task("s1", 4))
    finally:
        signals.before_task_publish.disconnect(tamper)

    assert message == ""
    assert "the outbox's message for s1/turn/4 reads back wrong" in caplog.text


def test_the_outbox_is_off_when_the_broker_is_another_redis_database(
    redis_url: str, redis_client: redis.Redis, redis_prefix: str, queue: str
) -> None:
    settings = FleetSettings(queue=queue)
    app = celery_app(other_db(broker_url(redis_url)), settings)
    assert not Outbox(app, RedisStore(redis_client, prefix=redis_prefix), settings).direct


def test_the_outbox_is_off_when_the_fleet_settings_say_so(
    redis_url: str, redis_client: redis.Redis, redis_prefix: str, queue: str
) -> None:
    settings = FleetSettings(queue=queue, outbox=False)
    app = celery_app(broker_url(redis_url), settings)
    assert not Outbox(app, RedisStore(redis_client, prefix=redis_prefix), settings).direct


def test_the_outbox_is_off_for_messages_it_does_not_make(
    redis_url: str, redis_client: redis.Redis, redis_prefix: str, queue: str
) -> None:
    settings = FleetSettings(queue=queue)
    app = celery_app(broker_url(redis_url), settings)
    app.conf.task_compression = "gzip"  # send_task would compress the body; the outbox does not
    assert not Outbox(app, RedisStore(redis_client, prefix=redis_prefix), settings).direct


def two_turn_job(fleet: Fleet, session: str) -> None:
    fleet.script(session, [tool_turn((f"{session}-a", "work", {"n": 1})), tool_turn((f"{session}-b", "work", {"n": 2})),
                           Message.assistant("done")])  # fmt: skip


def test_a_worker_pushes_each_next_step_from_the_script_that_ends_the_step(fleet: Fleet) -> None:
    two_turn_job(fleet, "pushed")
    fleet.start_worker()

    fleet.client.enqueue("jobs", "go", session_id="pushed")
    fleet.wait_for(["pushed"], timeout_s=30)

    assert fleet.counts("runs") == {"pushed-a": 1, "pushed-b": 1}
    assert fleet.counts("sends") == {}  # 4 steps handed on, none through app.send_task


def test_without_the_outbox_every_step_is_sent_through_celery(fleet: Fleet) -> None:
    two_turn_job(fleet, "sent")
    fleet.start_worker(LOUSHO_TEST_OUTBOX="0")

    fleet.client.enqueue("jobs", "go", session_id="sent")
    fleet.wait_for(["sent"], timeout_s=30)

    assert fleet.counts("runs") == {"sent-a": 1, "sent-b": 1}
    assert fleet.counts("sends") == {"lousho.tool_call": 2, "lousho.model_turn": 2}


def test_a_broker_on_another_redis_database_gets_every_step_through_celery(fleet: Fleet, redis_url: str) -> None:
    broker = other_db(broker_url(redis_url))
    client = Client(broker=broker, store=fleet.store, settings=FleetSettings(queue=fleet.queue, lease_ttl_s=2.0))
    two_turn_job(fleet, "elsewhere")
    fleet.start_worker(LOUSHO_TEST_FLEET_BROKER=broker)
    try:
        client.enqueue("jobs", "go", session_id="elsewhere")
        fleet.wait_for(["elsewhere"], timeout_s=30)
    finally:
        fleet.stop_all()
        with client.app.connection_for_write() as connection:
            connection.default_channel.client.delete(fleet.queue)

    assert fleet.counts("runs") == {"elsewhere-a": 1, "elsewhere-b": 1}
    assert fleet.counts("sends") == {"lousho.tool_call": 2, "lousho.model_turn": 2}


def test_the_outbox_reads_a_message_back_once_per_task_and_set_of_receivers(
    redis_url: str, redis_client: redis.Redis, redis_prefix: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The format check (the message read back as a worker reads it) runs once per process for each task name
    and set of `before_task_publish` receivers, not once per message (issue #30); each message is still the task
    it means, and a receiver connected later is read back again."""
    settings = FleetSettings(queue=queue)
    app = celery_app(broker_url(redis_url), settings)
    outbox = Outbox(app, RedisStore(redis_client, prefix=redis_prefix), settings)
    assert outbox.direct
    read_back: list[str] = []
    monkeypatch.setattr(outbox_module, "decode_entry", lambda entry: read_back.append(entry) or decode_entry(entry))

    turns = [outbox.encode(model_turn_task("s1", turn)) for turn in (1, 2, 3)]
    calls = [outbox.encode(tool_call_task("s1", f"call_{n}", "work", 3)) for n in range(2)]
    assert len(read_back) == 2  # one model turn's message, one tool call's
    assert [json.loads(m)["headers"]["id"] for m in turns] == ["s1/turn/1", "s1/turn/2", "s1/turn/3"]
    assert all(calls)

    def traced(headers: dict[str, Any], **_: Any) -> None:
        headers["traceparent"] = "00-trace"

    signals.before_task_publish.connect(traced, weak=False)
    try:
        traced_turn = outbox.encode(model_turn_task("s1", 4))
    finally:
        signals.before_task_publish.disconnect(traced)
    assert len(read_back) == 3 and json.loads(traced_turn)["headers"]["traceparent"] == "00-trace"


def removals_of_records(fleet: Fleet, run: Callable[[], None]) -> dict[str, str]:
    """While `run()` runs: per delivery tag of a message of the fleet's queue, who removed its record from kombu's
    `unacked` hash ('lua': a script; else the client's address), from Redis's MONITOR. Markers (ECHO) tell when
    MONITOR is on and when it has seen everything before the end: no sleep to guess either on a loaded machine."""
    recorded: set[str] = set()
    removed: dict[str, str] = {}
    on = threading.Event()
    begin, end = (f"lousho-test-monitor-{uuid.uuid4().hex}-{part}" for part in ("begin", "end"))

    def watch() -> None:
        with redis.Redis(connection_pool=fleet.redis.connection_pool).monitor() as monitor:  # type: ignore[no-untyped-call]
            while (line := monitor.next_command())["command"] != f"ECHO {end}":
                words = line["command"].split(" ", 3)
                if line["command"] == f"ECHO {begin}":
                    on.set()
                elif words[:2] == ["HSET", "unacked"] and fleet.queue in words[3]:
                    recorded.add(words[2])
                elif words[:2] == ["HDEL", "unacked"]:
                    removed.setdefault(words[2], line["client_type"] or line["client_address"])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    while not on.is_set():
        assert watcher.is_alive()
        fleet.redis.echo(begin)
        on.wait(0.1)
    try:
        run()
        deadline = time.monotonic() + 30  # Celery's own ack (prefork's parent) comes just after the step
        while any(tag not in removed for tag in list(recorded)) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        fleet.redis.echo(end)
        watcher.join(timeout=10)
    return {tag: removed.get(tag, "") for tag in recorded}


@pytest.mark.parametrize(
    ("pool", "remover"), [("solo", "lua"), ("threads", "lua"), ("lousho", "lua"), ("prefork", "a client")]
)
def test_each_steps_message_is_acknowledged_by_the_script_that_ends_the_step(
    fleet: Fleet, pool: str, remover: str
) -> None:
    """Issue #30: the script that commits a step's end also removes its message's record, as kombu's ack would: no
    ack round trip after it. A prefork child's messages are acknowledged by its parent, as before."""
    two_turn_job(fleet, "acked")
    fleet.start_worker(pool=pool, concurrency=1)

    def run() -> None:
        fleet.client.enqueue("jobs", "go", session_id="acked")
        fleet.wait_for(["acked"], timeout_s=30)

    removals = removals_of_records(fleet, run)
    assert len(removals) == 5  # the three model turns and the two tool calls, each its own message
    assert {"lua" if who == "lua" else "a client" for who in removals.values()} == {remover}, removals
    assert fleet.redis.hmget("unacked", list(removals)) == [None] * 5  # and nothing is delivered again


@pytest.mark.parametrize("read_elsewhere", [False, True])
def test_a_step_acknowledges_its_message_only_where_the_worker_reads_it(
    redis_url: str, redis_client: redis.Redis, redis_prefix: str, queue: str, read_elsewhere: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A worker that reads its messages from another broker (`broker_read_url`) keeps kombu's records there: the
    step's end script, which writes where the outbox pushes, leaves the ack to Celery."""
    monkeypatch.setattr(outbox_module, "consumes_here", lambda: True)  # as in a worker process (solo, threads, lousho)
    settings = FleetSettings(queue=queue)
    app = celery_app(broker_url(redis_url), settings)
    if read_elsewhere:
        app.conf.broker_read_url = other_db(broker_url(redis_url))
    outbox = Outbox(app, RedisStore(redis_client, prefix=redis_prefix), settings)
    try:
        assert outbox.direct
        assert outbox.ack_keys() == (None if read_elsewhere else ("unacked", "unacked_index"))
    finally:
        outbox.close()
