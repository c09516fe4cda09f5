"""lousho's pool (lousho/worker/pool.py): its slots (`-c N`) are the process's, not a share per event loop. With a
share per loop, a task was handed to a loop whose share was full of calls held for minutes while another loop had
room, and waited there (a loaded CI run: one of 120 sessions started its model turn two minutes late; issue #33).
In process: the pool's own loops, no worker."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import wait as wait_futures

import pytest

from lousho.worker.pool import AsyncioPool, await_on_loop

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


def test_a_task_runs_while_any_slot_is_free_whichever_loop_the_held_ones_are_on(pool: AsyncioPool) -> None:
    released, ran = threading.Event(), threading.Event()
    held = [pool.on_apply(hold_until, args=(released,), kwargs={}) for _ in range(SLOTS - 1)]
    try:
        pool.on_apply(ran.set, args=(), kwargs={})
        assert ran.wait(timeout=30), "the last slot's task waited behind the held ones"
    finally:
        released.set()
        wait_futures([h.future for h in held], timeout=30)


def test_a_task_past_the_slots_waits_for_the_first_slot_freed_on_any_loop(pool: AsyncioPool) -> None:
    released, first_done, ran = threading.Event(), threading.Event(), threading.Event()
    held = [pool.on_apply(hold_until, args=(released,), kwargs={}) for _ in range(SLOTS - 1)]
    short = pool.on_apply(hold_until, args=(first_done,), kwargs={})
    try:
        late = pool.on_apply(ran.set, args=(), kwargs={})
        assert not ran.wait(timeout=0.5), "a task ran past the slots"
        first_done.set()  # one slot frees, on whichever loop the short task was
        assert ran.wait(timeout=30), "the waiting task did not take the freed slot"
        # Its future is settled after its body returns, on the loop's thread: waited for, not read at once (a
        # loaded run read it a moment too early; issue #33)
        assert wait_futures([short.future, late.future], timeout=30).not_done == set()
    finally:
        released.set()
        wait_futures([h.future for h in held], timeout=30)
