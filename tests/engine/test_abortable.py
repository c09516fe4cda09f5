"""`engine.abortable`, what every model turn and tool call awaits under (issue #29: it cancels its own task where it
awaits, with no task of its own): the signal stops the work and says so; a cancel that is not the signal's stays a
cancel; a signal that fires after the work is over touches nothing after it; nothing of it outlives the task."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest

from lousho.abort import AbortSignal, RunAborted
from lousho.engine import abortable


async def test_the_signal_stops_the_awaited_work_and_raises_run_aborted() -> None:
    signal = AbortSignal()
    stopped: list[str] = []

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.append("cancelled")
            raise
        return "never"

    asyncio.get_running_loop().call_later(0.02, signal.abort, "user pressed stop")
    with pytest.raises(RunAborted):
        await abortable(work(), signal)
    assert stopped == ["cancelled"]


async def test_a_signal_fired_from_another_thread_stops_the_work_too() -> None:
    signal = AbortSignal()
    threading.Timer(0.02, signal.abort, args=("from a heartbeat thread",)).start()
    with pytest.raises(RunAborted):
        await abortable(asyncio.sleep(30), signal)


async def test_a_signal_that_fired_before_raises_without_starting_the_work() -> None:
    signal = AbortSignal()
    signal.abort("already")
    started: list[bool] = []

    async def work() -> None:
        started.append(True)

    coroutine = work()
    with pytest.raises(RunAborted):
        await abortable(coroutine, signal)
    coroutine.close()
    assert started == []


async def test_a_cancel_that_is_not_the_signals_stays_a_cancel() -> None:
    signal = AbortSignal()
    task = asyncio.create_task(abortable(asyncio.sleep(30), signal))
    await asyncio.sleep(0.01)

    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert not signal.aborted


async def test_a_signal_that_fires_as_the_work_returns_keeps_its_result_and_cancels_nothing_after_it() -> None:
    signal = AbortSignal()

    async def work() -> str:
        signal.abort("late")  # the cancel it schedules runs on the loop only after the work has returned
        return "answer"

    async def step() -> str:
        answer = await abortable(work(), signal)
        await asyncio.sleep(0.05)  # what follows the work in the same task: the loop runs the scheduled cancel now
        return answer

    assert await step() == "answer"


async def test_a_task_that_awaited_under_the_signal_is_freed_as_it_ends_not_by_the_cyclic_collector() -> None:
    # A worker runs thousands of steps: one kept past its end until a full collection keeps its result too (issue #29).
    signal = AbortSignal()
    task = asyncio.create_task(abortable(asyncio.sleep(0), signal))
    gc.disable()
    try:
        await task
        ended = weakref.ref(task)
        del task
        await asyncio.sleep(0)  # the loop lets go of what it ran
        assert ended() is None
    finally:
        gc.enable()
