"""lousho's Celery pool: hundreds of steps in flight in one worker process (issue #29).

A fleet mostly waits: a model answers in seconds, a tool awaits a network call. Celery's prefork pool
holds one task per process, and its threads pool a thread per task. This pool holds every task of the
process on a few event loops (`LOOPS`), each in a thread of its own:

- a lousho task gives its work as a coroutine (`coroutine_body`): `on_apply` hands it to one of the loops (the
  least busy), where `tracer.py` does what Celery's tracer does (accept, prerun, the work awaited, the outcome,
  postrun, then the callback that acks the message), while the loop runs the other steps;
- any other task runs through Celery's own tracer (`apply_target`) in a greenlet driven by a coroutine on a loop:
  its body may hand a coroutine to the loop with `await_on_loop`, and its greenlet sleeps until that is done;
- so the callback, and the message's ack, comes only after the step committed (acks_late), exactly as on the
  prefork pool, and a worker killed mid-step leaves every unacked message to be delivered again.

A lousho step in flight costs a coroutine and Celery's request, not a thread's stack, nor a greenlet's (about 6 KB
more: Python gives each greenlet a stack of its own for its frames, a page at least; issue #29). Redis calls inside
a step are blocking and short; they hold only their loop, between the waits. Sync tools run on the loop's default
executor, sized to the pool's slots, so a sync tool never blocks the loop.

Celery keeps its per-task state (`task.request`, `current_task`) in locals keyed by greenlet when the
greenlet package is installed (`celery.utils.threads`), so interleaved tasks of the greenlet kind do not see each
other's; a coroutine task gets its request as an argument (`tracer.py`).

`create_app` makes it the app's default (`worker_pool`): `celery -A app worker -c 200` runs 200 slots in
one process. `-P prefork`/`-P threads`/`-P solo` still work (each thread then runs its own loop).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import greenlet
from celery.app.trace import fast_trace_task, trace_task_ret
from celery.concurrency.base import BasePool, apply_target

from lousho.fleet.settings import DEFAULT_SLOTS
from lousho.worker.tracer import apply_coroutine, coroutine_args

__all__ = ["AsyncioPool", "await_on_loop", "on_pool_loop"]

log = logging.getLogger("lousho.worker")

T = TypeVar("T")

_CELERY_TRACERS = (trace_task_ret, fast_trace_task)
"""What a Celery worker hands its pool to run a task (`Request.execute_using_pool`)."""

LOOPS = int(os.environ.get("LOUSHO_POOL_LOOPS", "4"))
"""Event loops per process (issue #29): a step's blocking Redis calls wait on one loop, not on all."""


class _StepGreenlet(greenlet.greenlet):  # type: ignore[misc]
    """A task's tracer, run by `_drive`: its `await_on_loop` switches back to the driver with a coroutine."""


def on_pool_loop() -> bool:
    """Whether this code runs in a task of an `AsyncioPool` (so it may `await_on_loop`)."""
    return isinstance(greenlet.getcurrent(), _StepGreenlet)


def await_on_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the pool's loop and return its result, from a task's (synchronous) body: this task's
    greenlet sleeps meanwhile and the loop runs the others. Only inside an `AsyncioPool` task."""
    current = greenlet.getcurrent()
    if not isinstance(current, _StepGreenlet):
        coro.close()
        raise RuntimeError("await_on_loop is for tasks of lousho's AsyncioPool (see FleetRuntime.run)")
    result: T = current.parent.switch(coro)
    return result


async def _drive(fn: Callable[..., Any], *args: Any) -> Any:
    """Run `fn(*args)` in a greenlet; await each coroutine it hands over, and give it back the result."""
    driver = greenlet.getcurrent()
    step = _StepGreenlet(fn, driver)
    # One context for the task: what the tracer sets in it (a trace span, Celery's request) is what the step's
    # coroutine sees, as when a task runs its coroutine in its own thread (SQLAlchemy's asyncio bridge does the same).
    step.gr_context = driver.gr_context
    handed = step.switch(*args)
    while not step.dead:
        try:
            value = await handed
        except BaseException:  # the step's coroutine raised: raise it where the task awaited it
            handed = step.throw(*sys.exc_info())
        else:
            handed = step.switch(value)
    return handed


class _Applied:
    """What `on_apply` returns: the task's outcome, once it is over (Celery keeps a weak reference to it and
    reads it only for `get`/`wait`). Plain fields, and an event made only for a caller that waits: the pool
    holds one for every task in flight, hundreds a process (issue #29)."""

    __slots__ = ("__weakref__", "_done", "_error", "_lock", "_result", "_waiter")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._waiter: threading.Event | None = None

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            self._done, self._result, self._error = True, result, error
            waiter = self._waiter
        if waiter is not None:
            waiter.set()

    def wait(self, timeout: float | None = None) -> None:
        with self._lock:
            if self._done:
                return
            if self._waiter is None:
                self._waiter = threading.Event()
            waiter = self._waiter
        waiter.wait(timeout)

    def get(self, timeout: float | None = None) -> Any:
        self.wait(timeout)
        if not self._done:
            raise TimeoutError("the task is still running")
        if self._error is not None:
            raise self._error
        return self._result


class _LoopThread:
    """One event loop running in a thread of its own."""

    def __init__(self, index: int, executor: ThreadPoolExecutor) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(executor)
        self.in_flight = 0
        """Tasks handed to this loop and not done (how busy it is: the pool hands a task to the least busy)."""
        self._thread = threading.Thread(target=self._run, name=f"lousho-pool-loop-{index}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:  # stopped (`stop`): what was in flight is unacked, delivered again; the loop's resources go now
            self.loop.close()

    def submit(
        self, work: Callable[[], Coroutine[Any, Any, Any]], on_done: Callable[[asyncio.Task[Any]], None]
    ) -> None:
        """Run `work()` (a task's trace) on this loop; `on_done(task)` in the loop's thread once it is over.
        A task made on the loop, not `run_coroutine_threadsafe`'s future beside it (issue #29: one object less
        a step in flight)."""
        self.in_flight += 1
        self.loop.call_soon_threadsafe(self._spawn, work, on_done)

    def _spawn(
        self, work: Callable[[], Coroutine[Any, Any, Any]], on_done: Callable[[asyncio.Task[Any]], None]
    ) -> None:
        task = self.loop.create_task(work())
        task.add_done_callback(self._done)
        task.add_done_callback(on_done)

    def _done(self, _task: asyncio.Task[Any]) -> None:
        self.in_flight -= 1

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


def _outcome(task: asyncio.Task[Any]) -> tuple[Any, BaseException | None]:
    if task.cancelled():
        return None, asyncio.CancelledError()
    error = task.exception()
    return (None, error) if error is not None else (task.result(), None)


class AsyncioPool(BasePool):  # type: ignore[misc]
    """Event loops in threads of one worker process, every task of the process on one of them (see the module's
    docstring). A step's Redis calls are blocking: on one loop they would wait one after the other, so a process
    runs `LOOPS` loops and hands each task to the least busy (the GIL is free while a thread waits on a socket).

    The slots (`-c N`) are the process's, not a loop's: a task past them waits for the first slot freed on any loop.
    Slots split among the loops let a task wait on a loop whose share was full of calls held for minutes while
    another loop had room (a loaded CI run: one of 120 sessions started two minutes late; issue #33)."""

    body_can_be_buffer = True
    signal_safe = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit: int = int(self.limit or DEFAULT_SLOTS)
        self.loops: list[_LoopThread] = []
        self.most_in_flight = 0
        """The most tasks this process held at once (counted, for `celery inspect stats` and the bench)."""
        self._slots = threading.Lock()
        self._running = 0
        """Tasks on a loop now: at most `limit`."""
        self._held = 0
        """Tasks applied and not over: those running and those waiting for a slot."""
        self._all_over = threading.Condition(self._slots)
        self._waiting: collections.deque[tuple[tuple[Any, ...], _Applied]] = collections.deque()
        """Tasks taken past the slots, oldest first: for a moment, a task acknowledged and not yet over; or the
        prefetch of `worker_prefetch_multiplier` above 1."""

    def on_start(self) -> None:
        # Sync tools (`asyncio.to_thread`) get a thread each up to the slots, not the default 5 + cores.
        executor = ThreadPoolExecutor(max_workers=self.limit, thread_name_prefix="lousho-tool")
        count = max(1, min(LOOPS, self.limit))
        self.loops = [_LoopThread(n, executor) for n in range(count)]
        log.info("lousho's pool: %d slots on %d event loops in process %d", self.limit, count, os.getpid())

    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **_: Any,
    ) -> _Applied:
        outcome = _Applied(self._slots)
        applied = (target, args, kwargs, callback, accept_callback)
        with self._slots:
            self._held += 1
            self.most_in_flight = max(self.most_in_flight, self._held)
            free = self._running < self.limit
            if free:
                self._running += 1
            else:
                self._waiting.append((applied, outcome))
        if free:
            self._start(applied, outcome)
        return outcome

    def _start(self, applied: tuple[Any, ...], outcome: _Applied) -> None:
        loop = min(self.loops, key=lambda candidate: candidate.in_flight)
        loop.submit(functools.partial(self._trace, *applied), functools.partial(self._finished, outcome))

    def _trace(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None,
        kwargs: dict[str, Any] | None,
        callback: Callable[..., Any] | None,
        accept_callback: Callable[..., Any] | None,
    ) -> Coroutine[Any, Any, Any]:
        """A task's trace, on its loop: a task whose work is a coroutine (lousho's) awaited by `tracer.py`; any other
        through Celery's own tracer, in a greenlet (`_drive`)."""
        if target in _CELERY_TRACERS and args and not kwargs and self.app is not None:
            task = self.app.tasks.get(args[0])
            decoded = coroutine_args(self.app, task, args) if task is not None else None
            if decoded is not None:
                return apply_coroutine(self.app, task, args, decoded, callback, accept_callback)
        return _drive(apply_target, target, args, kwargs, callback, accept_callback)

    def _finished(self, outcome: _Applied, task: asyncio.Task[Any]) -> None:
        """A task is over (in its loop's thread): its slot goes to the task that waited longest, or is free."""
        result, error = _outcome(task)
        if error is not None:  # Celery's tracer reports a task's own errors: this is the pool's, or a stop
            log.error("lousho's pool: a task's run ended with %r", error, exc_info=error)
        with self._slots:
            waited = self._waiting.popleft() if self._waiting else None
            if waited is None:
                self._running -= 1
            self._held -= 1
            if not self._held:
                self._all_over.notify_all()
        outcome.settle(result, error)
        if waited is not None:
            self._start(*waited)

    def on_stop(self) -> None:
        """Warm shutdown: let every task in flight finish (and ack), then stop the loops."""
        with self._slots:
            self._all_over.wait_for(lambda: not self._held)
        self.on_terminate()

    def on_terminate(self) -> None:
        """Cold shutdown: stop now; what was in flight is unacked, and delivered again."""
        for loop in self.loops:
            loop.stop()

    def _get_info(self) -> dict[str, Any]:
        info: dict[str, Any] = super()._get_info()
        info.update({"max-concurrency": self.limit, "in-flight": self._held, "loops": len(self.loops)})
        info["most-in-flight"] = self.most_in_flight
        return info
