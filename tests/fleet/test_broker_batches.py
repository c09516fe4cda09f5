"""A worker takes its queue in and acknowledges in batches, with kombu's records kept (lousho/fleet/broker_qos.py,
issue #29): one read takes up to `TAKEN_AT_ONCE` entries the prefetch has room for, each recorded among kombu's
unacknowledged messages before it can be acknowledged; an event loop's acks leave Redis at the end of its turn."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from kombu import Consumer, Exchange, Producer, Queue
from kombu.utils import json as kombu_json

from lousho import Message
from lousho.fleet import broker_qos
from lousho.fleet.broker_qos import TAKEN_AT_ONCE, BatchedQoS, removed_with_step
from lousho.fleet.transport import Connection, decode_entry, rejected_key
from lousho.testing.redis_server import RedisServer
from lousho.worker import broker_url
from tests.fleet.conftest import Fleet

UNACKED, UNACKED_INDEX = "unacked", "unacked_index"  # kombu's Redis transport's default keys


class Taker:
    """A kombu consumer on lousho's transport, as a worker's: it keeps what it was delivered, read by read."""

    def __init__(self, connection: Connection, queue: str, prefetch: int, refuse: str | None = None) -> None:
        self.connection, self.refuse = connection, refuse
        self.delivered: list[Any] = []
        self.channel = connection.channel()
        declared = Queue(queue, Exchange(queue, type="direct"), routing_key=queue, channel=self.channel)
        declared.declare()
        self.consumer = Consumer(self.channel, [declared], callbacks=[self._receive], accept=["json"])
        self.consumer.qos(prefetch_count=prefetch)
        self.consumer.consume()

    def _receive(self, body: Any, message: Any) -> None:
        if body == self.refuse:  # as Celery's handler raising on a message it cannot read
            raise ValueError("cannot read this one")
        self.delivered.append(message)

    def read(self) -> list[Any]:
        """One read of the queue (one `BRPOP`, and what it takes in with it): the messages it delivered."""
        before = len(self.delivered)
        self.connection.drain_events(timeout=5)
        return self.delivered[before:]

    @property
    def transport(self) -> Any:
        return self.channel.connection

    @property
    def qos(self) -> BatchedQoS:
        qos = self.channel.qos
        assert isinstance(qos, BatchedQoS)
        return qos


@pytest.fixture
def queue(redis_client: redis.Redis) -> Iterator[str]:
    name = f"lousho-test-batches-{uuid.uuid4().hex[:8]}"
    yield name
    for key in redis_client.scan_iter(f"{name}*"):
        redis_client.delete(key)
    redis_client.delete(f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")  # kombu's records of it


@pytest.fixture
def connection(redis_url: str) -> Iterator[Connection]:
    with Connection(broker_url(redis_url)) as opened:
        yield opened


def publish(connection: Connection, queue: str, bodies: list[str]) -> None:
    with connection.channel() as channel:
        producer = Producer(channel, exchange=Exchange(queue, type="direct"), routing_key=queue)
        for body in bodies:
            producer.publish(body, serializer="json", declare=[Queue(queue, Exchange(queue, "direct"), queue)])


def body_of(entry: dict[str, Any]) -> Any:
    """The body of a queue entry as kombu's Redis transport wrote it (JSON, base64-encoded)."""
    return json.loads(base64.b64decode(entry["body"]))


def recorded(client: redis.Redis, messages: list[Any]) -> list[bool]:
    """Whether each message is among kombu's unacknowledged ones (its record, and its place in the index)."""
    return [
        bool(client.hexists(UNACKED, m.delivery_tag)) and client.zscore(UNACKED_INDEX, m.delivery_tag) is not None
        for m in messages
    ]


def test_one_read_takes_in_as_many_entries_as_the_prefetch_has_room_for(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, [f"m{n}" for n in range(10)])
    taker = Taker(connection, queue, prefetch=4)

    first = taker.read()

    assert [m.payload for m in first] == ["m0", "m1", "m2", "m3"], "in the order they were sent"
    assert redis_client.llen(queue) == 6
    assert recorded(redis_client, first) == [True] * 4


def test_a_read_takes_at_most_taken_at_once_entries(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, [f"m{n}" for n in range(TAKEN_AT_ONCE + 5)])
    taker = Taker(connection, queue, prefetch=1000)

    assert len(taker.read()) == TAKEN_AT_ONCE
    assert redis_client.llen(queue) == 5


def test_with_room_for_one_message_a_read_takes_one_as_kombu_does(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, ["a", "b"])
    taker = Taker(connection, queue, prefetch=1)

    taken = taker.read()

    assert [m.payload for m in taken] == ["a"] and redis_client.llen(queue) == 1
    assert recorded(redis_client, taken) == [True]


def test_without_an_event_loop_an_ack_leaves_redis_at_once(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, ["a", "b"])
    taker = Taker(connection, queue, prefetch=10)
    a, b = taker.read()

    a.ack()

    assert recorded(redis_client, [a, b]) == [False, True]


def test_the_acks_of_an_event_loops_turn_free_their_slots_at_once_and_leave_redis_at_its_end(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, ["a", "b", "c"])
    taker = Taker(connection, queue, prefetch=2)
    taker.transport.acks_on_tick = True  # as `register_with_event_loop` sets it for Celery's worker
    a, b = taker.read()
    assert not taker.qos.can_consume()

    a.ack()
    b.ack()

    assert taker.qos.can_consume(), "an acknowledged message's prefetch slot is free at its ack"
    assert recorded(redis_client, [a, b]) == [True, True], "its record leaves at the end of the turn"
    taker.transport.flush_acks()  # the loop's tick
    assert recorded(redis_client, [a, b]) == [False, False]
    assert [m.payload for m in taker.read()] == ["c"]


def test_a_message_refused_in_a_batch_is_moved_aside_and_leaves_no_record(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, ["a", "bad", "c"])
    taker = Taker(connection, queue, prefetch=10, refuse="bad")

    taken = taker.read()

    assert [m.payload for m in taken] == ["a", "c"]
    assert recorded(redis_client, taken) == [True, True]
    aside = [decode_entry(entry) for entry in redis_client.lrange(rejected_key(queue), 0, -1)]
    assert [body_of(entry) for entry in aside] == ["bad"]
    assert not redis_client.hexists(UNACKED, aside[0]["properties"]["delivery_tag"])


def test_entries_that_are_no_message_in_a_batch_are_moved_aside_and_leave_no_record(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, ["a"])
    # Tagged, with a delivery info the take-in script can record, but no kombu envelope (no body, no headers).
    no_envelope = json.dumps({"properties": {"delivery_tag": "no-envelope", "delivery_info": {"exchange": queue,
                                                                                            "routing_key": queue}}})  # fmt: skip
    redis_client.lpush(queue, no_envelope, b"\xff not json")
    publish(connection, queue, ["c"])
    taker = Taker(connection, queue, prefetch=10)

    taken = taker.read()

    assert [m.payload for m in taken] == ["a", "c"]
    assert recorded(redis_client, taken) == [True, True]
    assert len(redis_client.lrange(rejected_key(queue), 0, -1)) == 2
    assert not redis_client.hexists(UNACKED, "no-envelope")
    assert redis_client.zscore(UNACKED_INDEX, "no-envelope") is None


def test_at_shutdown_what_was_acknowledged_stays_off_the_queue_and_the_rest_goes_back(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, ["a", "b", "c"])
    taker = Taker(connection, queue, prefetch=10)
    taker.transport.acks_on_tick = True
    a, b, c = taker.read()
    a.ack()  # not yet removed from Redis: the turn has not ended

    taker.channel.close()  # kombu puts back what it holds unacknowledged

    assert sorted(body_of(decode_entry(e)) for e in redis_client.lrange(queue, 0, -1)) == ["b", "c"]
    assert recorded(redis_client, [a, b, c]) == [False, False, False]


@pytest.mark.workers
def test_a_worker_takes_a_deep_queue_in_batches_and_holds_nothing_after(fleet: Fleet) -> None:
    sessions = [f"deep-{n}" for n in range(40)]
    for session in sessions:
        fleet.script(session, [Message.assistant("done")])
        fleet.client.enqueue("jobs", "go", session_id=session, require_worker=False)
    assert fleet.redis.llen(fleet.queue) == len(sessions), "queued before any worker takes them"

    worker = fleet.start_worker(pool="lousho", concurrency=100)
    fleet.wait_for(sessions, timeout_s=60)

    assert worker.alive()
    assert fleet.redis.llen(fleet.queue) == 0
    assert _held_of(fleet.redis, fleet.queue) == [], "every message acknowledged in Redis too"
    worker.stop()
    assert fleet.redis.llen(fleet.queue) == 0, "a warm shutdown puts back nothing: nothing was held"


def _held_of(client: redis.Redis, queue: str) -> list[str]:
    held = []
    for tag, record in client.hgetall(UNACKED).items():
        _, _, routing_key = json.loads(record)
        if routing_key == queue:
            held.append(tag.decode())
    return held


def test_an_entry_reads_as_kombus_json_reads_it_with_or_without_tagged_values() -> None:
    plain = {"body": "", "content-encoding": "utf-8", "content-type": "application/json", "headers": {"n": 1},
             "properties": {"delivery_tag": "t", "delivery_info": {"exchange": "", "routing_key": "q"}}}  # fmt: skip
    tagged = {**plain, "headers": {"at": datetime(2026, 12, 7, tzinfo=UTC)}}
    for message in (plain, tagged):
        entry = kombu_json.dumps(message).encode()
        assert decode_entry(entry) == kombu_json.loads(entry.decode()) == message


def test_messages_taken_in_share_their_names_and_repeated_values_and_read_as_sent(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, ["a", "b"])
    sent = [json.loads(entry) for entry in reversed(redis_client.lrange(queue, 0, -1))]
    first, second = Taker(connection, queue, prefetch=10).read()

    assert [first.payload, second.payload] == ["a", "b"]
    assert [(m.headers, m.properties) for m in (first, second)] == [(e["headers"], e["properties"]) for e in sent]
    # One string per process for each name and each value that repeats (issue #29: a worker holds every message
    # it runs until its ack, seconds for a model turn): not a copy per message, as the JSON decoder makes them.
    for name_of_first, name_of_second in zip(first.properties, second.properties, strict=True):
        assert name_of_first is name_of_second
    assert first.content_type is second.content_type
    assert first.delivery_info["routing_key"] is second.delivery_info["routing_key"]
    assert first.delivery_tag is not second.delivery_tag


KILLED_WHILE_TAKING_IN = """
import os, signal, sys
from kombu import Consumer, Exchange, Queue
from lousho.fleet.transport import Connection
from lousho.worker import broker_url

url, queue = sys.argv[1], sys.argv[2]
delivered = []

def receive(body, message):
    delivered.append(body)
    if len(delivered) == 2:  # in the middle of the batch one read took in
        os.kill(os.getpid(), signal.SIGKILL)

with Connection(broker_url(url)) as connection:
    channel = connection.channel()
    declared = Queue(queue, Exchange(queue, type="direct"), routing_key=queue, channel=channel)
    consumer = Consumer(channel, [declared], callbacks=[receive], accept=["json"])
    consumer.qos(prefetch_count=100)
    consumer.consume()
    connection.drain_events(timeout=5)
"""


def test_a_worker_killed_while_it_takes_a_batch_in_loses_no_message(
    connection: Connection, queue: str, redis_client: redis.Redis, redis_url: str
) -> None:
    sent = [f"m{n}" for n in range(40)]
    publish(connection, queue, sent)

    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_TAKING_IN, redis_url, queue], timeout=60, check=False)

    assert killed.returncode == -signal.SIGKILL
    queued = [body_of(json.loads(entry)) for entry in redis_client.lrange(queue, 0, -1)]
    records = [json.loads(record)[0] for record in redis_client.hvals(UNACKED)]
    held = [body_of(message) for message in records if message["properties"]["delivery_info"]["routing_key"] == queue]
    assert sorted(queued + held) == sorted(sent), "each message is on the queue, or recorded to be put back on it"
    assert len(held) > 1, "the killed process had taken a batch in"
    for message in records:  # what kombu's restore puts back: this test's records only
        if message["properties"]["delivery_info"]["routing_key"] == queue:
            redis_client.hdel(UNACKED, message["properties"]["delivery_tag"])
            redis_client.zrem(UNACKED_INDEX, message["properties"]["delivery_tag"])


def test_a_message_put_back_between_reads_leaves_the_next_ones_recorded_as_they_are_taken(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    publish(connection, queue, ["a"])
    taker = Taker(connection, queue, prefetch=1)
    (first,) = taker.read()

    first.requeue()  # kombu puts it back from its record
    (again,) = taker.read()

    assert again.payload == "a"
    assert recorded(redis_client, [again]) == [True]


def test_acks_that_cannot_leave_redis_are_logged_and_the_worker_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer() as server, Connection(broker_url(server.url)) as connection:
        queue = "lousho-test-acks-lost"
        publish(connection, queue, ["a"])
        taker = Taker(connection, queue, prefetch=10)
        taker.transport.acks_on_tick = True
        (taken,) = taker.read()
        taken.ack()
        server.stop(kill=True)  # the broker gone between the ack and the end of the loop's turn

        taker.transport.flush_acks()

        assert "could not remove 1 acknowledged messages from Redis" in caplog.text
        assert taker.qos.can_consume(), "the ack freed its prefetch slot all the same"


def test_a_message_whose_step_removed_its_record_is_acknowledged_in_memory_only(
    connection: Connection, queue: str, redis_client: redis.Redis
) -> None:
    """Issue #30: the script that ends a step removed the record (`removed_with_step`); Celery's ack then frees the
    slot and writes nothing. Here the record is still there, so an ack that wrote would show."""
    publish(connection, queue, ["a", "b"])
    taker = Taker(connection, queue, prefetch=2)
    a, b = taker.read()
    removed_with_step(a.delivery_tag)
    removed_with_step(b.delivery_tag)

    a.ack()
    b.reject(requeue=False)  # kombu's reject frees the slot without `ack`: the tag is forgotten all the same

    assert recorded(redis_client, [a]) == [True], "the ack wrote nothing"
    assert taker.qos.can_consume() and not broker_qos._removed  # both slots free, no tag kept
