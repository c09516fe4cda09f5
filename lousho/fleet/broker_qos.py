"""A worker's bookkeeping of the messages it holds, in batches (issue #29).

kombu's Redis transport emulates acknowledgements: each message a worker takes is written to the hash
`unacked` (and its index) as it is delivered, and removed at its ack, a round trip each, on the worker's one
consumer thread, which also reads the queue one entry per `BRPOP`. With hundreds of steps in flight in one
process, those round trips, not the CPU, set how fast a worker took messages in: at 5,000 waiting sessions a
lousho worker spent 44 % of its consumer thread waiting on acks and records, its queue 4,000 entries deep
and its CPU at half a core.

`BatchedQoS` keeps kombu's records and their meaning, and writes them in batches:

- the entries one read takes in (`Channel._brpop_read`, up to `TAKEN_AT_ONCE`, within the prefetch) are taken off
  the queue and recorded in one script (`lua/take_in.lua`), so none is ever off the queue without its record;
  their delivery keeps them in memory only (`recorded_already`);
- the acks the event loop runs in one turn are removed in one pipeline at the end of that turn (`flush_acks`,
  on the loop's tick). A message leaves kombu's memory, and frees its prefetch slot, at its ack; its record in
  Redis goes a moment later. A worker killed in between leaves the record, and the message is delivered again
  after the visibility timeout, as after an ack that failed: a lousho step finds its work recorded;
- a lousho step whose end script removed its message's record already (`end_step.lua`, issue #30: the ack in the
  round trip that commits the step) is acknowledged in memory only (`removed_with_step`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis, virtual

__all__ = ["TAKEN_AT_ONCE", "BatchedQoS", "consumes_here", "removed_with_step"]

log = logging.getLogger("lousho.worker")

# kombu is untyped: its two QoS classes, called by name (in kombu's memory only: `_in_memory`; with its records in
# Redis, one round trip each: `_each_at_once`).
_in_memory: Any = virtual.QoS
_each_at_once: Any = redis.QoS

TAKEN_AT_ONCE = 64
"""The most entries a worker takes off a queue in one read (fewer when its prefetch has less room): enough to take
a deep queue in few round trips, few enough that other workers still find work in it."""


_consuming_pids: set[int] = set()
"""The processes that made a `BatchedQoS`: those whose tasks are acknowledged by this process's consumer."""
_removed: set[str] = set()
"""Delivery tags whose records a step's end removed already, until their ack (in this process)."""


def consumes_here() -> bool:
    """Whether this process's consumer acknowledges the tasks it runs (solo, threads, lousho's pool; not a prefork
    child, whose parent acks): only then can a step's end script take its message's ack over."""
    return os.getpid() in _consuming_pids


def removed_with_step(delivery_tag: str) -> None:
    """A step's end script removed the record of message `delivery_tag` (end_step.lua): its ack, which Celery runs
    as the task returns (acks_late), writes nothing more."""
    _removed.add(delivery_tag)


class BatchedQoS(redis.QoS):
    """kombu's Redis QoS, its records in Redis written and removed in batches (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _each_at_once.__init__(self, *args, **kwargs)
        _consuming_pids.add(os.getpid())
        self._recorded = False
        """Whether the messages delivered now have their records in Redis already (`recorded_already`)."""
        self._acked: list[str] = []
        """Delivery tags acknowledged this turn of the event loop, still recorded in Redis."""

    @contextmanager
    def recorded_already(self) -> Iterator[None]:
        """Messages delivered meanwhile were recorded in Redis as they were taken (`lua/take_in.lua`): kept in memory
        only, not written again."""
        self._recorded = True
        try:
            yield
        finally:
            self._recorded = False

    def append(self, message: Any, delivery_tag: str) -> None:
        if self._recorded:
            _in_memory.append(self, message, delivery_tag)
        else:
            _each_at_once.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if delivery_tag in _removed:  # its record went with its step's end (`removed_with_step`)
            _removed.discard(delivery_tag)
            _in_memory.ack(self, delivery_tag)
        elif getattr(self.channel.connection, "acks_on_tick", False):  # an event loop flushes them (transport.py)
            _in_memory.ack(self, delivery_tag)
            self._acked.append(delivery_tag)
        else:
            _each_at_once.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        _removed.discard(delivery_tag)  # kombu's reject frees the slot without `ack`: nothing left to remember
        _each_at_once.reject(self, delivery_tag, requeue=requeue)

    def restore_unacked(self, client: Any | None = None) -> None:
        """At shutdown: what was acknowledged leaves Redis, the rest goes back on its queue (kombu's)."""
        self.flush_acks()
        _each_at_once.restore_unacked(self, client)

    def forget_records(self, delivery_tags: list[str]) -> None:
        """Remove the records of messages taken and never delivered (moved aside): else the visibility timeout
        would put them back on the queue."""
        if delivery_tags:
            self._remove_records(delivery_tags)

    def flush_acks(self) -> None:
        """Remove this turn's acknowledged messages from Redis, in one pipeline."""
        if not self._acked:
            return
        tags, self._acked = self._acked, []
        try:
            self._remove_records(tags)
        except self.channel.connection_errors as exc:  # as Celery's `ack_log_error`: logged, the worker goes on
            log.error(
                "lousho: could not remove %d acknowledged messages from Redis (%r); they are delivered again "
                "after the visibility timeout, and each finds its step's work recorded",
                len(tags), exc,
            )  # fmt: skip

    def _remove_records(self, delivery_tags: list[str]) -> None:
        """Remove these messages' records from Redis (the hash and its index), in one pipeline."""
        with self.pipe_or_acquire() as pipe:
            pipe.zrem(self.unacked_index_key, *delivery_tags).hdel(self.unacked_key, *delivery_tags).execute()
