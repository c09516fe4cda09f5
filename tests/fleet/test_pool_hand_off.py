"""lousho's pool (lousho/worker/pool.py): its slots (`-c N`) are the process's, not a share per event loop. With a
share per loop, a task was handed to a loop whose share was full of calls held for minutes while another loop had
room, and waited there (a loaded CI run: one of 120 sessions started its model turn two minutes late; issue #33).
In process: the pool's own loops, no worker."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from lousho.worker.pool import AsyncioPool, _Applied, await_on_loop

SLOTS = 8


@pytest.fixture
def pool() -> Iterator[AsyncioPool]:
    pool = AsyncioPool(limit=SLOTS)
    pool.on_start()
    yield pool
    pool.on_stop()


def hold_until(released: threading.Event) -> None:
    """A task that waits on its loop (as a step awaits its model), not holding the loop."""

    async def until() -> None:
        while not released.is_set():  # noqa: ASYNC110 -- a threading.Event, set from the test's thread
            await asyncio.sleep(0.01)

    await_on_loop(until())


def apply(pool: AsyncioPool, fn: Callable[..., None], *args: object) -> _Applied:
    """Hand `fn(*args)` to the pool as Celery's consumer does (Celery's tracer passes its result to `callback`)."""
    return pool.on_apply(fn, args=args, kwargs={}, callback=lambda _result: None)


def settled(*applied: _Applied) -> None:
    """Each task is over, without an error (`get` raises TimeoutError for one still running)."""
    for outcome in applied:
        assert outcome.get(timeout=30) is None


def test_a_task_runs_while_any_slot_is_free_whichever_loop_the_held_ones_are_on(pool: AsyncioPool) -> None:
    released, ran = threading.Event(), threading.Event()
    held = [apply(pool, hold_until, released) for _ in range(SLOTS - 1)]
    try:
        apply(pool, ran.set)
        assert ran.wait(timeout=30), "the last slot's task waited behind the held ones"
    finally:
        released.set()
        settled(*held)


def test_a_task_past_the_slots_waits_for_the_first_slot_freed_on_any_loop(pool: AsyncioPool) -> None:
    released, first_done, ran = threading.Event(), threading.Event(), threading.Event()
    held = [apply(pool, hold_until, released) for _ in range(SLOTS - 1)]
    short = apply(pool, hold_until, first_done)
    try:
        late = apply(pool, ran.set)
        assert not ran.wait(timeout=0.5), "a task ran past the slots"
        first_done.set()  # one slot frees, on whichever loop the short task was
        assert ran.wait(timeout=30), "the waiting task did not take the freed slot"
        # Its outcome is settled after its body returns, on the loop's thread: waited for, not read at once (a
        # loaded run read it a moment too early; issue #33)
        settled(short, late)
    finally:
        released.set()
        settled(*held)


def test_an_error_of_the_pool_s_own_is_logged_and_raised_by_get(pool: AsyncioPool, caplog: pytest.LogCaptureFixture) -> None:
    # Celery's tracer reports a task's own errors to its callbacks; one outside them (here, no callback to call)
    # was kept in a future nobody read.
    outcome = pool.on_apply(lambda: None, args=(), kwargs={})
    with pytest.raises(TypeError):
        outcome.get(timeout=30)
    assert "lousho's pool: a task's run ended with TypeError" in caplog.text
