"""Heartbeats: while work runs, extend its lease, push the session's in-flight deadline, and
watch the session's abort flag (so a running tool's `ctx.signal` fires on `Client.abort`).

Each piece of work in flight (a step, a tool call's run) beats on its own lease, as before; what is
shared is the trip to Redis (issue #29). One `Heart` per event loop wakes eight times a heartbeat
interval and sends the beats then due, each one script (lua/heartbeat.lua), in one pipeline: a
worker holding hundreds of calls whose models take seconds sent four to six round trips per call
per beat, each holding its event loop. A beat is due `heartbeat_s * 7/8` after the last; when one is
due, the pieces at least half way to theirs go in the same round trip, so work that began a moment
apart falls into step and shares every later trip. Beats of one piece of work come between 1/2 and 1
heartbeat interval apart (one timer per piece came every 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.commands.core import Script

from lousho.abort import AbortSignal
from lousho.errors import StoreUnavailableError
from lousho.stores.redis_common import load_script, redis_errors, run_script_many
from lousho.worker.leases import Lease
from lousho.worker.limits import touch_slots
from lousho.worker.runtime import FleetRuntime

__all__ = ["Beating", "Heart", "beat", "heartbeat"]

log = logging.getLogger("lousho.worker")

TICKS_PER_BEAT = 8
"""How often a heart wakes per heartbeat interval: the beats it sends are late by at most one tick."""


@dataclass(eq=False, slots=True)
class Beating:
    """One piece of work in flight: whose lease its beats extend, and whose abort they watch."""

    session_id: str
    lease: Lease
    signal: AbortSignal
    entry: str | None = None
    """A tool call's run: its entry in the running index, which each beat marks alive (worker/running.py)."""
    last_s: float = field(default_factory=time.monotonic)
    """`time.monotonic()` when it began, or was last beaten."""


def beat(runtime: FleetRuntime, beating: list[Beating]) -> None:
    """Beat each of `beating` in one round trip: extend, push, mark and read (lua/heartbeat.lua); the held slots
    of the ones still ours are pushed too (issue #29). A Redis error is logged: the next beat tries again, and
    Redis may come back before the leases expire."""
    beating = [b for b in beating if b.lease.held]  # released already (a save that ended the step): work over
    if not beating:
        return
    started = time.monotonic()
    try:
        replies = _run_beats(runtime, beating)
    except StoreUnavailableError as exc:
        log.warning("heartbeat of %d pieces of work failed: %s", len(beating), exc)
        return
    ours: list[str] = []
    for item, reply in zip(beating, replies, strict=True):
        item.last_s = started
        if isinstance(reply, Exception):
            log.warning("heartbeat for %s failed: %s", item.session_id, reply)
        elif int(reply) < 0:
            # Another worker took over (this one was stopped past its lease): the session's deadline is theirs
            # to push; a touch from here could put a session they finished back in flight.
            item.lease.held = False
            log.warning("lost the lease %s; a save by this worker will be refused", item.lease.key)
        else:
            item.lease.confirmed_at = started
            ours.append(item.session_id)
            if int(reply) == 1:
                item.signal.abort("aborted by Client.abort()")
    try:
        touch_slots(runtime, ours)  # the sessions' slots among their agents' in flight (issue #29)
    except StoreUnavailableError as exc:
        log.warning("heartbeat of the sessions' slots failed: %s", exc)


def _run_beats(runtime: FleetRuntime, beating: list[Beating]) -> list[Any]:
    """Each beat's reply (or its error), in order: one script per beat, in one round trip."""
    client, keys, deadline_ms = runtime.store.client, runtime.keys, runtime.inflight.deadline_ms
    calls = [
        (
            (
                item.lease.key,
                runtime.store.keys.inflight_of(item.session_id),
                keys.running_of(item.session_id),
                keys.abort(item.session_id),
            ),
            (item.lease.token, item.lease.ttl_ms, item.session_id, deadline_ms, item.entry or ""),
        )
        for item in beating
    ]
    with redis_errors(client, f"send the heartbeats of {len(beating)} pieces of work"):
        return run_script_many(client, _script(client), calls)


@functools.lru_cache(maxsize=32)
def _script(client: redis.Redis) -> Script:
    """One Script object per client: it hashes the source once."""
    return load_script(client, "lousho.worker:heartbeat")


class Heart:
    """The beats of the work in flight on one event loop (see the module's docstring). Used from its loop's
    thread only; its timer runs only while something beats."""

    def __init__(self, runtime: FleetRuntime, loop: asyncio.AbstractEventLoop) -> None:
        self.runtime = runtime
        self.loop = loop
        self.beating: set[Beating] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, item: Beating) -> None:
        self.beating.add(item)
        if self._timer is None:
            self._timer = self.loop.call_later(self._tick_s, self._tick)

    def remove(self, item: Beating) -> None:
        self.beating.discard(item)

    @property
    def _tick_s(self) -> float:
        return self.runtime.settings.heartbeat_s / TICKS_PER_BEAT

    def _tick(self) -> None:
        self._timer = None
        try:
            now, interval_s = time.monotonic(), self.runtime.settings.heartbeat_s
            due_before = now - interval_s * (TICKS_PER_BEAT - 1) / TICKS_PER_BEAT
            if any(item.last_s <= due_before for item in self.beating):
                # Those half way to theirs too: work that began a tick apart shares the trips from now on.
                beat(self.runtime, [item for item in self.beating if item.last_s <= now - interval_s / 2])
        finally:  # whatever a beat raised, the next one still comes
            if self.beating:
                self._timer = self.loop.call_later(self._tick_s, self._tick)


def heart_of(runtime: FleetRuntime, loop: asyncio.AbstractEventLoop) -> Heart:
    """The heart of `loop` (one per loop and runtime: on lousho's pool each of the process's loops has one)."""
    heart: Heart | None = runtime.hearts.get(loop)
    if heart is None:
        heart = runtime.hearts[loop] = Heart(runtime, loop)
    return heart


def heartbeat(
    runtime: FleetRuntime, session_id: str, lease: Lease, signal: AbortSignal, entry: str | None = None
) -> contextlib.AbstractAsyncContextManager[None]:
    """`async with heartbeat(...)`: beat every `heartbeat_s` (at most; at least half of it) for as long as the body
    runs (`entry`: a tool call's run, whose score in the running index each beat pushes to now).

    Joining the loop's heart costs nothing on a step that ends before its first beat, as most do (issue #9)."""
    return _BeatingWhileInside(runtime, Beating(session_id, lease, signal, entry))


class _BeatingWhileInside:
    """`heartbeat`'s context: an object of three fields, not a generator's frame (a step in flight holds it, issue #29)."""

    __slots__ = ("heart", "item", "runtime")

    def __init__(self, runtime: FleetRuntime, item: Beating) -> None:
        self.runtime, self.item = runtime, item
        self.heart: Heart | None = None

    async def __aenter__(self) -> None:
        self.heart = heart_of(self.runtime, asyncio.get_running_loop())
        self.heart.add(self.item)

    async def __aexit__(self, *_: object) -> None:
        if self.heart is not None:
            self.heart.remove(self.item)
