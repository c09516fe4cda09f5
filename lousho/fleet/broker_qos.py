"""A worker's bookkeeping of the messages it holds, in batches (issue #29).

kombu's Redis transport emulates acknowledgements: each message a worker takes is written to the hash
`unacked` (and its index) as it is delivered, and removed at its ack, a round trip each, on the worker's one
consumer thread, which also reads the queue one entry per `BRPOP`. With hundreds of steps in flight in one
process, those round trips, not the CPU, set how fast a worker took messages in: at 5,000 waiting sessions a
lousho worker spent 44 % of its consumer thread waiting on acks and records, its queue 4,000 entries deep
and its CPU at half a core.

`BatchedQoS` keeps kombu's records and their meaning, and writes them in batches:

- the entries one read takes in (`Channel._brpop_read`, up to `TAKEN_AT_ONCE`, within the prefetch) are
  recorded in one pipeline before the read returns, so before any of them can be acknowledged (Celery runs
  acks on the same thread, from its event loop);
- the acks the event loop runs in one turn are removed in one pipeline at the end of that turn (`flush_acks`,
  on the loop's tick). A message leaves kombu's memory, and frees its prefetch slot, at its ack; its record in
  Redis goes a moment later. A worker killed in between leaves the record, and the message is delivered again
  after the visibility timeout, as after an ack that failed: a lousho step finds its work recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kombu.transport import redis, virtual
from kombu.utils import json as kombu_json

__all__ = ["TAKEN_AT_ONCE", "BatchedQoS"]

log = logging.getLogger("lousho.worker")

# kombu is untyped: its two QoS classes, called by name (in kombu's memory only: `_in_memory`; with its records in
# Redis, one round trip each: `_each_at_once`), and its JSON encoder.
_in_memory: Any = virtual.QoS
_each_at_once: Any = redis.QoS
_dumps: Callable[[Any], str] = kombu_json.dumps

TAKEN_AT_ONCE = 64
"""The most entries a worker takes off a queue in one read (fewer when its prefetch has less room): enough to take
a deep queue in few round trips, few enough that other workers still find work in it."""


class BatchedQoS(redis.QoS):
    """kombu's Redis QoS, its records in Redis written and removed in batches (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _each_at_once.__init__(self, *args, **kwargs)
        self._unwritten: list[tuple[Any, str]] | None = None
        """Messages delivered by the read under way, not yet recorded in Redis (None: no read under way)."""
        self._acked: list[str] = []
        """Delivery tags acknowledged this turn of the event loop, still recorded in Redis."""

    def begin_taking_in(self) -> None:
        """From now until `write_taken`, a delivered message is recorded in memory only."""
        self._unwritten = []

    def write_taken(self, client: Any | None = None, *, then: tuple[Any, ...] = ()) -> list[Any]:
        """Record the messages delivered since `begin_taking_in` in Redis, in one pipeline, followed by the commands
        `then` (`(name, *args)`), whose replies it returns; the read goes on taking in."""
        taken = self._unwritten
        if taken:
            self._unwritten = []  # the read goes on (None, no read under way, stays None)
        if not taken and not then:
            return []
        with self.pipe_or_acquire(client=client) as pipe:
            if taken:
                now = time.time()
                pipe.zadd(self.unacked_index_key, {tag: now for _, tag in taken})
                pipe.hset(self.unacked_key, mapping={tag: _record(message) for message, tag in taken})
            if then:
                pipe.execute_command(*then)
            replies: list[Any] = pipe.execute()
        return replies[2:] if taken else replies

    def end_taking_in(self) -> None:
        """Record what is still unwritten, and deliver as kombu does again."""
        try:
            self.write_taken()
        finally:
            self._unwritten = None

    def append(self, message: Any, delivery_tag: str) -> None:
        if self._unwritten is None:
            _each_at_once.append(self, message, delivery_tag)
            return
        _in_memory.append(self, message, delivery_tag)
        self._unwritten.append((message, delivery_tag))

    def ack(self, delivery_tag: str) -> None:
        if self._forget_unwritten(delivery_tag):
            _in_memory.ack(self, delivery_tag)
        elif getattr(self.channel.connection, "acks_on_tick", False):  # an event loop flushes them (transport.py)
            _in_memory.ack(self, delivery_tag)
            self._acked.append(delivery_tag)
        else:
            _each_at_once.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:  # kombu restores it from its record: write it first
            self.write_taken()
        elif self._forget_unwritten(delivery_tag):
            _in_memory.ack(self, delivery_tag)
            return
        _each_at_once.reject(self, delivery_tag, requeue=requeue)

    def restore_unacked(self, client: Any | None = None) -> None:
        """At shutdown: what was acknowledged leaves Redis, the rest goes back on its queue (kombu's)."""
        self.flush_acks()
        self.write_taken(client)
        _each_at_once.restore_unacked(self, client)

    def flush_acks(self) -> None:
        """Remove this turn's acknowledged messages from Redis, in one pipeline."""
        if not self._acked:
            return
        tags, self._acked = self._acked, []
        try:
            with self.pipe_or_acquire() as pipe:
                pipe.zrem(self.unacked_index_key, *tags).hdel(self.unacked_key, *tags).execute()
        except self.channel.connection_errors as exc:  # as Celery's `ack_log_error`: logged, the worker goes on
            log.error(
                "lousho: could not remove %d acknowledged messages from Redis (%r); they are delivered again "
                "after the visibility timeout, and each finds its step's work recorded",
                len(tags), exc,
            )  # fmt: skip

    def _forget_unwritten(self, delivery_tag: str) -> bool:
        """Drop a message of the read under way from what it will record: whether it was there."""
        unwritten = self._unwritten
        if not unwritten:
            return False
        for index, (_, tag) in enumerate(unwritten):
            if tag == delivery_tag:
                del unwritten[index]
                return True
        return False


def _record(message: Any) -> str:
    """What kombu records of a message it holds (`QoS.append`): the message, its exchange and routing key."""
    delivery = message.delivery_info
    return _dumps([message._raw, delivery["exchange"], delivery["routing_key"]])  # noqa: SLF001
