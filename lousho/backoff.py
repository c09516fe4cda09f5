"""How long lousho waits before it tries again: one rule with jitter for every retry and re-send.

Work that fails together retries together unless each wait is drawn apart: the sessions that met one
vendor's 429, the steps one Redis failover cut, the sessions one reaper pass sent again. So every wait
lousho makes before it tries again is `jittered_s`:

- at least `floor_s` (a server's `Retry-After`, a configured interval): never sooner than asked;
- at least half of `step_s` (the exponential step of a retry, `exponential_s`): a run of failures slows
  down whatever a server says, so a `Retry-After: 0` cannot make a loop of requests;
- plus a random part of up to half the larger of the two, which spreads the retries of work that failed
  at one instant over a window as long as half its wait ("equal jitter").

The waits of a run of failures have a lower bound (`floor_s`, half the step): a test can count how many
requests a window holds at most. `Clock` is the time a retry loop reads and sleeps on: the process's
monotonic clock, or a test's own.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Protocol

__all__ = ["Clock", "MonotonicClock", "exponential_s", "jittered_s"]


def exponential_s(attempt: int, *, base_s: float, cap_s: float) -> float:
    """The exponential step before retry `attempt` (1: the first retry): `base_s`, doubled each time, at most
    `cap_s`."""
    return float(min(cap_s, base_s * 2.0 ** max(0, attempt - 1)))


def jittered_s(*, floor_s: float = 0.0, step_s: float = 0.0) -> float:
    """A wait of at least `floor_s` and at least half `step_s`, plus a random part of up to half the larger."""
    floor_s, step_s = max(0.0, floor_s), max(0.0, step_s)
    # `random`'s own generator: Python seeds it anew in a forked child, so worker processes draw apart.
    return max(floor_s, step_s / 2) + random.uniform(0.0, max(floor_s, step_s) / 2)


class Clock(Protocol):
    """The time a retry loop reads, and how it waits."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The process's monotonic clock, and `asyncio.sleep`."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
