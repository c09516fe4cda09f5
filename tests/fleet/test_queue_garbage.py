"""A worker survives any bytes on its queue: what is no task message is moved to `<queue>:lousho-rejected`
and logged, and the same worker process runs the next job (lousho/fleet/transport.py, issue #21)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.transport import memory, redis

from lousho import Message
from lousho.fleet.transport import REJECTED_KEPT, Channel, Connection, Transport, rejected_key
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

RUN = uuid.uuid4().hex[:8]


def envelope(
    *, body: Any = "", headers: Any = None, tag: str, props: dict[str, Any] | None = None, **changes: Any
) -> bytes:
    """A message as kombu's Redis transport writes it, with `props` changed in its properties and
    `changes` to its top-level fields."""
    message = {
        "body": body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {} if headers is None else headers,
        "properties": {
            "delivery_tag": f"{RUN}-{tag}",
            "body_encoding": "base64",
            "delivery_info": {"exchange": "", "routing_key": "lousho"},
            "delivery_mode": 2,
            "priority": 0,
            **(props or {}),
        },
        **changes,
    }
    return json.dumps(message).encode()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


TASK_BODY = b64(json.dumps([["no-such-session", 1], {}, {}]))

MOVED_ASIDE = {
    "not JSON": b"not json",
    "empty": b"",
    "binary junk": bytes(range(256)),
    "a JSON list": b"[1, 2, 3]",
    "JSON null": b"null",
    "JSON nested past the parser's limit": b"[" * 100_000 + b"]" * 100_000,
    "an object that is no envelope": b'{"task": "lousho.model_turn"}',
    "no delivery tag": envelope(tag="x", properties={"body_encoding": "base64"}),
    "a body that is a number": envelope(tag="body", body=5),
    "a body encoding kombu has not": envelope(tag="rot13", body="abc", props={"body_encoding": "rot13"}),
    "properties that are a list": envelope(tag="x", properties=[1]),
    "headers that are a list": envelope(tag="hl", headers=[1]),
    "headers that are text": envelope(tag="ht", headers="task"),
    "delivery info that is text": envelope(tag="di", props={"delivery_info": "q"}),
    "a delivery tag that is a list": envelope(tag="tl", props={"delivery_tag": [1]}),
    # Envelopes kombu reads, on which Celery's handler raises (it used to stop the worker, or to loop it
    # through reconnects: kombu counts a KeyError as a lost connection and puts the message back).
    "a task without an id": envelope(tag="noid", body=TASK_BODY, headers={"task": "lousho.model_turn"}),
    "an unknown task without an id": envelope(tag="unk", body=TASK_BODY, headers={"task": "no.such.task"}),
    "a body of two parts": envelope(
        tag="two", body=b64("[5, 6]"), headers={"task": "lousho.model_turn", "id": f"{RUN}-two"}
    ),
}

REFUSED_BY_CELERY = {  # Celery reads these and refuses them itself, with a log line of its own
    "Received unregistered task of type 'no.such.task'": envelope(
        tag="reg", body=TASK_BODY, headers={"task": "no.such.task", "id": f"{RUN}-reg"}
    ),
    "Refusing to deserialize untrusted content of type pickle": envelope(
        tag="pickle",
        body=b64("x"),
        headers={"task": "lousho.model_turn", "id": f"{RUN}-pickle"},
        **{"content-type": "application/x-python-serialize"},
    ),
    "Can't decode message body": envelope(
        tag="json", body=b64("{{{"), headers={"task": "lousho.model_turn", "id": f"{RUN}-json"}
    ),
}


@pytest.fixture
def rejected(fleet: Fleet) -> Iterator[str]:
    key = rejected_key(fleet.queue)
    yield key
    fleet.redis.delete(key)


def test_each_raw_entry_is_moved_aside_and_logged_and_the_same_worker_runs_the_next_job(
    fleet: Fleet, rejected: str
) -> None:
    worker = fleet.start_worker()
    for entry in [*MOVED_ASIDE.values(), *REFUSED_BY_CELERY.values()]:
        fleet.redis.lpush(fleet.queue, entry)
    fleet.script("after", [tool_turn(("after-a", "work", {"n": 3})), Message.assistant("done")])

    fleet.client.enqueue("jobs", "go", session_id="after")
    fleet.wait_for(["after"], timeout_s=30)

    assert worker.alive() and fleet.workers == [worker]
    assert fleet.counts("runs") == {"after-a": 1}
    assert sorted(fleet.redis.lrange(rejected, 0, -1)) == sorted(MOVED_ASIDE.values())
    log = worker.log()
    for name, entry in MOVED_ASIDE.items():
        assert f"moved to {rejected!r}" in log and f"({len(entry)} bytes): {entry[:200]!r}" in log, name
    for line in REFUSED_BY_CELERY:
        assert line in log
    assert "Connection to broker lost" not in log and "Unrecoverable error" not in log
    assert fleet.redis.llen(fleet.queue) == 0

    worker.stop()  # a warm shutdown puts kombu's unacknowledged messages back: none may be a bad one
    assert fleet.redis.llen(fleet.queue) == 0


def test_a_flood_of_junk_keeps_only_the_newest_entries_aside(fleet: Fleet, rejected: str) -> None:
    worker = fleet.start_worker()
    pipe = fleet.redis.pipeline()
    for n in range(REJECTED_KEPT + 20):
        pipe.lpush(fleet.queue, f"junk {n}")
    pipe.execute()
    fleet.script("after-flood", [Message.assistant("fine")])

    fleet.client.enqueue("jobs", "go", session_id="after-flood")
    fleet.wait_for(["after-flood"], timeout_s=60)

    assert worker.alive()
    kept = fleet.redis.lrange(rejected, 0, -1)
    assert kept == [f"junk {n}".encode() for n in range(REJECTED_KEPT + 19, 19, -1)]


@pytest.mark.parametrize(
    "url",
    ["redis://localhost:6379/0", "rediss://localhost:6380/1", "redis+socket:///tmp/redis.sock?virtual_host=2"],
)
def test_a_lousho_connection_to_redis_uses_the_screening_transport_whatever_the_url(url: str) -> None:
    assert Connection(url).get_transport_cls() is Transport
    assert issubclass(Transport, redis.Transport)


def test_a_lousho_connection_through_sentinel_screens_its_queue_too() -> None:
    transport = Connection("sentinel://localhost:26379;sentinel://localhost:26380").get_transport_cls()
    assert issubclass(transport, redis.SentinelTransport)  # kombu's pool that follows the master (issue #18)
    assert issubclass(transport.Channel, redis.SentinelChannel)
    assert transport.Channel._take_in is Channel._take_in  # the screening's own method


@pytest.mark.parametrize(("url", "transport"), [("memory://", memory.Transport)])
def test_a_lousho_connection_to_another_broker_keeps_kombus_transport(url: str, transport: type) -> None:
    assert Connection(url).get_transport_cls() is transport
