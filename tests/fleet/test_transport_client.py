"""lousho's kombu channel keeps one redis-py client for its commands (lousho/fleet/transport.py, issue #30): kombu
made a client for every publish, ack and queue read, most of a small command's cost on a busy worker."""

from __future__ import annotations

import threading
import uuid

import redis
from celery import Celery

from lousho.fleet.transport import AMQP, Channel, Connection
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url


def test_a_channel_makes_one_client_for_its_commands_and_a_new_one_for_a_new_pool(redis_url: str) -> None:
    with Connection(broker_url(redis_url)) as connection:
        channel = connection.default_channel
        first = channel._create_client()
        assert channel._create_client() is first, "every publish and ack shares the channel's client"
        channel._pool = None  # kombu's reconnect drops the pool
        assert channel._create_client() is not first, "a new pool gets a new client"


def test_messages_published_from_many_threads_through_one_channel_all_arrive(
    redis_url: str, redis_client: redis.Redis
) -> None:
    queue = f"lousho-test-transport-{uuid.uuid4().hex[:8]}"
    with Connection(broker_url(redis_url)) as connection:
        channel = connection.default_channel
        sent = [f"{n}-{m}" for n in range(8) for m in range(50)]

        def publish(n: int) -> None:
            for m in range(50):
                channel._put(queue, {"body": f"{n}-{m}", "properties": {"delivery_tag": f"{n}-{m}"}})

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        try:
            received = [channel._get(queue)["body"] for _ in sent]
        finally:
            redis_client.delete(queue)
    assert sorted(received) == sorted(sent)


def test_celerys_producer_pool_publishes_through_the_same_channel_and_its_one_client(redis_url: str) -> None:
    """`send_task` and every task event take a connection from Celery's producer pool, which kombu filled with
    connections of its own transport (issue #29): a client's and a worker's publishes made a client each."""
    app = Celery("lousho-test-transport", set_as_current=False, amqp=AMQP)
    app.conf.broker_url = broker_url(redis_url)
    try:
        with app.producer_or_acquire() as producer:
            assert isinstance(producer.channel, Channel)
            first = producer.channel._create_client()
        with app.producer_or_acquire() as producer:
            assert producer.channel._create_client() is first, "the pooled connection's channel keeps its client"
    finally:
        app.close()


def test_a_client_enqueues_through_lousho_s_transport(redis_url: str, redis_store: RedisStore) -> None:
    client = Client(broker=broker_url(redis_url), store=redis_store, settings=FleetSettings(queue="q-transport"))
    with client.app.producer_or_acquire() as producer:
        assert isinstance(producer.channel, Channel)


def test_a_plain_celery_app_of_the_same_broker_in_the_process_changes_neither_apps_transport(redis_url: str) -> None:
    """kombu's process-wide connection pools are keyed by the broker's URL and transport name: a plain Celery app's
    pool, made first, was the lousho app's too (issue #33: the test above failed after another file's plain app)."""
    plain = Celery("lousho-test-plain-app", set_as_current=False)
    plain.conf.broker_url = broker_url(redis_url)
    ours = Celery("lousho-test-transport-after-plain", set_as_current=False, amqp=AMQP)
    ours.conf.broker_url = broker_url(redis_url)
    try:
        with plain.producer_or_acquire() as producer:
            assert not isinstance(producer.channel, Channel)
        with ours.producer_or_acquire() as producer:
            assert isinstance(producer.channel, Channel)
        with plain.producer_or_acquire() as producer:
            assert not isinstance(producer.channel, Channel), "kombu's app keeps kombu's transport"
    finally:
        plain.close()
        ours.close()
