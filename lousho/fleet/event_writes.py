"""The process's event writer (issue #34): the writes of sessions' live events that a task need not wait for,
done by one thread in the order they were submitted, and the events a task holds back for its session's next
step in the process (`carry`). What is written and when is `lousho.fleet.events.EventWriter`'s."""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["WRITES", "Carried", "OrderedWrites"]

log = logging.getLogger("lousho.events")


@dataclass
class Carried:
    """A session's events held back by `OrderedWrites.carry`."""

    due: float
    events: list[dict[str, Any]]
    write: Callable[[list[dict[str, Any]]], None]


class OrderedWrites:
    """The process's event writes a task need not wait for (a timer's flush, a task's end), done by one writer
    thread in the order they were submitted. A write that rides with a task's save (`settled` first) comes after
    every write of its session submitted before it, so a session's events from one process reach its stream in the
    order they happened. The lock guards the queue, never a write: a task that submits never waits for Redis
    (issue #34's cost goal)."""

    def __init__(self) -> None:
        self._forked()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """A process (or a forked child) starts with no writes and a free lock (the parent's thread may have held
        it)."""
        self._queued: deque[tuple[str, Callable[[], None]]] = deque()
        self._lock = threading.Condition()
        self._pid = 0
        self._streams: dict[str, int] = {}
        """Stream key -> its writes queued or under way (`busy`): a session's, under its store's prefix."""
        self._carried: dict[str, Carried] = {}
        """Stream key -> events held back for its session's next write (`carry`)."""
        self._settling: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        """Stream key -> the loops' futures of `settled` calls waiting for its writes to be done."""

    def submit(self, write: Callable[[], None], stream: str) -> None:
        """Queue `write` for the writer thread."""
        with self._lock:
            self._queue(stream, write)

    def _queue(self, stream: str, write: Callable[[], None]) -> None:
        self._start()
        self._queued.append((stream, write))
        self._streams[stream] = self._streams.get(stream, 0) + 1
        self._lock.notify_all()

    def carry(
        self,
        stream: str,
        events: list[dict[str, Any]],
        write: Callable[[list[dict[str, Any]]], None],
        delay_s: float,
    ) -> None:
        """Hold `events` back for the session's next write in this process (`take_carried`); the writer thread
        writes them with `write` after `delay_s` if none took them."""
        with self._lock:
            self._start()
            held = self._carried.get(stream)
            if held is None:
                self._carried[stream] = Carried(time.monotonic() + delay_s, events, write)
            else:
                held.events.extend(events)
            self._lock.notify_all()

    def take_carried(self, stream: str) -> list[dict[str, Any]]:
        """The events held back for the session (none, mostly: a dict lookup without the lock first)."""
        if stream not in self._carried:
            return []
        with self._lock:
            held = self._carried.pop(stream, None)
        return held.events if held is not None else []

    def busy(self, stream: str) -> bool:
        """Whether a write of the session is queued or under way. Read without the lock: only the session's own
        task adds its writes, so a 'no' cannot turn stale, and a stale 'yes' costs a `settled`."""
        return stream in self._streams

    async def settled(self, stream: str, timeout_s: float = 10.0) -> None:
        """Until the writer thread has done the session's writes (at most `timeout_s`: a stuck write), awaited:
        the loop runs its other steps meanwhile. On lousho's pool one loop holds many sessions' steps, and a step
        that blocked its loop here held them all (issue #29; the suspect of a loaded chaos run in which a worker
        started none of 110 new sessions' calls in 60 s)."""
        if stream not in self._streams:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if stream not in self._streams:
                return
            self._settling.setdefault(stream, []).append((loop, done))
        try:
            await asyncio.wait_for(done, timeout_s)
        except TimeoutError:
            log.warning("lousho: the events of %r still not written after %.0f s; the save goes on", stream, timeout_s)

    def _wake_settling(self, stream: str) -> None:
        """The session's writes are done (the lock held): wake its `settled` callers, each on its own loop."""
        for loop, done in self._settling.pop(stream, []):
            try:
                loop.call_soon_threadsafe(_resolve, done)
            except RuntimeError:  # that loop is closed (its process stops): nobody waits any more
                continue

    def drain(self, timeout_s: float = 5.0) -> None:
        """Until every write, held back or queued, is done, at most `timeout_s` (a process that ends: `atexit`)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._release(float("inf"))
            while self._streams and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)

    def _release(self, now: float) -> float | None:
        """Queue the held-back events due by `now`; how long until the next is due (None: none held)."""
        for stream, held in list(self._carried.items()):
            if held.due <= now:
                del self._carried[stream]
                self._queue(stream, functools.partial(held.write, held.events))
        return min((held.due for held in self._carried.values()), default=None)

    def _start(self) -> None:
        if self._pid != os.getpid():  # after a fork the thread is the parent's: one of this process's own
            self._pid = os.getpid()
            threading.Thread(target=self._run, name="lousho-events", daemon=True).start()

    def _next(self) -> tuple[str, Callable[[], None]]:
        """The next write (the lock held): queued, or held back and due."""
        while not self._queued:
            next_due = self._release(time.monotonic())
            if not self._queued:
                self._lock.wait(None if next_due is None else max(0.0, next_due - time.monotonic()))
        return self._queued.popleft()

    def _run(self) -> None:
        while True:
            with self._lock:
                stream, write = self._next()
            try:
                write()
            except Exception:  # `_write` logs its own; anything else must not stop the thread
                log.exception("lousho: an event write failed")
            finally:
                with self._lock:
                    left = self._streams.pop(stream, 1) - 1
                    if left:
                        self._streams[stream] = left
                    else:
                        self._wake_settling(stream)
                    self._lock.notify_all()


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():  # a `settled` that timed out has cancelled it
        done.set_result(None)


WRITES = OrderedWrites()
atexit.register(WRITES.drain)
