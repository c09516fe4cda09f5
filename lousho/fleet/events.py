"""A session's live event stream on the fleet (issue #34): what the workers did, as they do it.

Workers append to one Redis Stream per session (`<prefix>{<session>}:events`, in the session's hash slot, so it
works on a Cluster): a model turn's start and its attempt, its text deltas as the provider streams them, tool calls
started and finished, approvals requested and decided, checkpoint saves, requeues, and how the run stopped
(finished, parked, aborted, a step that failed). Each entry's stream id is where a reader resumes (`after=`,
or a browser's `Last-Event-ID`). The stream is bounded (`XADD MAXLEN ~`) and expires with the session's TTL.

The stream tells what happened; the checkpoint stays the only truth. A worker that dies mid-turn leaves a partial
text behind: the turn generated again starts with a `turn-started` event of a higher attempt, and a reader drops
what it joined of that turn so far. Events are written after the fact and never read by a worker.

Deltas are coalesced: those that arrive within `FleetSettings.events_flush_interval_s` of each other are written
as one `text-delta` entry. Every event still pending when the step saves rides in the save's own round trip, queued
ahead of the save script on the same connection (`ride_with_save`), so a reader sees a turn's text before its save
and the hop waits for no write of its own. Flushes by a timer (a delta of a slow stream, a long tool call's start)
and the task's last events are written by the process's writer thread, in order with the others; a save whose
session still has such a write under way waits for it first, so a session's events from one process keep their
order (issue #34's cost goal: a hop at most 10 % slower with events on).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lousho.events import (
    ApprovalRequestedEvent,
    CheckpointSavedEvent,
    Event,
    ProviderRetryEvent,
    TextEvent,
)
from lousho.fleet.event_writes import WRITES
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.codec_parts import Place
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors

__all__ = [
    "ENDING_KINDS",
    "EventKind",
    "EventWriter",
    "SessionEvent",
    "events_key",
    "open_session_stream",
    "open_stream",
]

log = logging.getLogger("lousho.events")

EventKind = Literal[
    "turn-started",
    "text-delta",
    "tool-call-started",
    "tool-call-finished",
    "approval-requested",
    "approval-decided",
    "checkpoint-saved",
    "requeued",
    "finished",
    "failed",
    "parked",
    "aborted",
]
ENDING_KINDS: frozenset[str] = frozenset({"finished", "approval-requested", "parked", "aborted"})
"""Kinds after which the run waits for someone (or is done): a reader stops there once nothing follows."""


def event_place(session_id: str) -> Place:
    """Where a sealed event belongs: the session's event stream (issue #31's binding: it opens in no other)."""
    return Place(session_id, "event")


def events_key(store: RedisStore, session_id: str) -> str:
    """The session's event stream, in its hash slot beside its checkpoint."""
    return store.keys.session_key(session_id, "events")


CARRY_S = 0.01
"""How long a task's last save event waits for the session's next step in the same process to write it (`close`).
Short: a next step on another worker may write first meanwhile (a tool call done within it; docs/fleet.md,
"Order"), and the event's `version` orders the saves anyway."""

OPENING_ID = "0-1"
"""The id of the entry that makes a stream (`open_stream`), deleted at once: no real entry has it."""


def open_stream(pipe: Any, key: str, ttl_s: float | None) -> None:
    """Queue on `pipe` (a MULTI) the commands that make the session's stream, empty, when it has none. Workers
    write with `NOMKSTREAM` (`EventWriter`): a task still running for a session deleted meanwhile cannot make its
    stream again, so only the `Client` (a job, a resume) and a new incarnation open one."""
    pipe.xadd(key, {"e": "{}"}, id=OPENING_ID)  # refused (and nothing done) when the stream has entries already
    pipe.xdel(key, OPENING_ID)
    if ttl_s is not None:
        pipe.pexpire(key, max(1, round(ttl_s * 1000)))


def open_session_stream(store: RedisStore, session_id: str) -> None:
    """Make the session's stream, empty, unless it has one (a job enqueued, a session resumed)."""
    client = store.client
    with redis_errors(client, f"open the event stream of session {session_id!r}"):
        pipe = client.pipeline(transaction=True)
        open_stream(pipe, events_key(store, session_id), store.ttl_s)
        pipe.execute(raise_on_error=False)  # the XADD's refusal of a stream that exists is the point


class SessionEvent(BaseModel):
    """One entry of a session's event stream."""

    model_config = ConfigDict(frozen=True)

    id: str = ""
    """The stream entry id (`<ms>-<n>`): pass it as `after=` (or a browser's `Last-Event-ID`) to resume after it."""
    kind: EventKind
    session_id: str = ""
    turn: int | None = None
    """The model turn (1-based) a `turn-started` or `text-delta` belongs to."""
    attempt: int | None = None
    """Which start of that turn: 2 after a worker died mid-turn. A `turn-started` (a new attempt, or a provider
    retry within one) means: drop the turn's text joined so far."""
    text: str | None = None
    """A `text-delta`'s text."""
    data: dict[str, Any] = Field(default_factory=dict)
    """Kind-specific: a tool call's `call_id`, `name`, `arguments`, `result`; a save's `step`, `status` and
    `version`; an approval's `approval_id` (and `approved`); a failure's `error`; a park's `reason`."""
    at_ms: int = 0
    """When the worker wrote it (its clock, ms since the epoch)."""

    @classmethod
    def from_entry(
        cls, session_id: str, entry_id: Any, fields: dict[Any, Any], codec: PayloadCodec = PLAIN
    ) -> SessionEvent:
        """An entry of the session's stream, opened with the store's payload codec (sealed as it was written)."""
        raw = fields[b"e"] if b"e" in fields else fields["e"]
        body = json.loads(codec.decode_text(raw, event_place(session_id)))
        stream_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        return cls.model_validate({**body, "id": stream_id, "session_id": session_id})

    def sse(self) -> str:
        """This event as a Server-Sent Events message (`id`, `event` and `data` lines)."""
        return f"id: {self.id}\nevent: {self.kind}\ndata: {self.model_dump_json()}\n\n"


Hook = Callable[[Event], Awaitable[None] | None]


class EventWriter:
    """The events of one task (one step, one tool call) of one session, written to its stream.

    Buffered, written in one pipelined round trip at each flush point: a delta or a tool call's start when
    `flush_interval_s` has passed since the last write (else a timer then), the turn's whole text (just before
    its save), and the end of the task (`close`). A write that fails is logged and dropped: the stream is a view,
    a step never fails for it."""

    def __init__(
        self, store: RedisStore, session_id: str, *, maxlen: int, flush_interval_s: float, hook: Hook | None = None
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.key = events_key(store, session_id)
        self.maxlen = maxlen
        self.flush_interval_s = flush_interval_s
        self.hook = hook
        """The app's own `on_event` (create_app), called with every engine event as before."""
        self.enabled: bool | None = None
        """The agent's `stream_events`, once the task knows its agent; None: not known (written)."""
        self.turn: int | None = None
        self.attempt: int | None = None
        self._pending: list[dict[str, Any]] = []
        self._last_write = time.monotonic()
        """When the task last wrote (at first: when it began): the first deltas of a fast turn go together."""
        self._timer: asyncio.TimerHandle | None = None

    # -- what the worker tells ------------------------------------------------------

    def add(self, kind: EventKind, *, soon: bool = False, **fields: Any) -> None:
        """Queue one event (`soon`: write it within `flush_interval_s`, not only at the task's end: a tool call's
        start is seen while the tool runs, and a call done sooner is written with its end, in one round trip)."""
        self._pending.append({"kind": kind, "at_ms": int(time.time() * 1000), **fields})
        if soon:
            self._flush_soon()

    def _flush_soon(self) -> None:
        wait_s = self.flush_interval_s - (time.monotonic() - self._last_write)
        if wait_s <= 0:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(wait_s, self.flush)

    def turn_started(self, turn: int, attempt: int, retry: int = 1) -> None:
        self.turn, self.attempt = turn, attempt
        data = {"retry": retry} if retry > 1 else {}
        self.add("turn-started", turn=turn, attempt=attempt, data=data)

    def delta(self, text: str) -> None:
        last = self._pending[-1] if self._pending else None
        if last is not None and last["kind"] == "text-delta" and last["attempt"] == self.attempt:
            last["text"] += text  # coalesced with the delta not written yet
        else:
            self.add("text-delta", turn=self.turn, attempt=self.attempt, text=text)
        if self._timer is None:  # a timer set writes these deltas in time: nothing to look at per delta (issue #30)
            self._flush_soon()

    async def sink(self, event: Event) -> None:
        """The run's `on_event` on the fleet: the engine's events, told to the stream and to the app's hook."""
        if isinstance(event, TextEvent):
            if event.delta:
                self.delta(event.text)
            # the turn's whole text comes just before its save: the deltas still pending ride with that save
        elif isinstance(event, CheckpointSavedEvent):
            self.add("checkpoint-saved", data={"step": event.step, "status": event.status, "version": event.version})
        elif isinstance(event, ApprovalRequestedEvent):
            data = {"approval_id": event.approval_id, "call_id": event.call.id, "name": event.call.name}
            self.add("approval-requested", data=data)
        elif isinstance(event, ProviderRetryEvent) and self.turn is not None and self.attempt is not None:
            self.turn_started(self.turn, self.attempt, retry=event.attempt + 1)  # the provider is asked anew
        if self.hook is not None:
            told = self.hook(event)
            if told is not None and inspect.isawaitable(told):  # an async hook's (a sync one's None: no await)
                await told

    # -- writing ----------------------------------------------------------------------

    def flush(self) -> None:
        """Hand what is pending to the process's writer thread, behind the session's earlier writes: off the
        step's path, and the loop never waits for it."""
        pending = self._take()
        if not pending:
            return
        self._last_write = time.monotonic()
        WRITES.submit(functools.partial(self._write, pending), self.key)

    def _take(self) -> list[dict[str, Any]]:
        """What is pending, after what an earlier task of the session carried (`close`), taken (none when events
        are off); the timer's flush is not needed any more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = WRITES.take_carried(self.key) + self._pending, []
        return [] if self.enabled is False else pending

    async def ride_with_save(self) -> Callable[[Any], int] | None:
        """What the step's next save queues ahead of its script on its pipeline: the pending events, which then
        reach the stream before the save, in its round trip (None: nothing to write). A session whose earlier
        events the writer thread still writes has them written first (`OrderedWrites.settled`, awaited: the loop
        runs other sessions' steps meanwhile): order is kept."""
        if WRITES.busy(self.key):
            await WRITES.settled(self.key)  # the session's earlier events reach the stream first
        if WRITES.busy(self.key):  # still not written (a stuck write): these go behind them, not beside them
            self.flush()
            return None
        pending = self._take()
        if not pending:
            return None
        self._last_write = time.monotonic()
        bodies = self._bodies(pending)
        return functools.partial(self._queue, bodies)

    def _bodies(self, pending: list[dict[str, Any]]) -> list[str | bytes]:
        # Sealed like the checkpoint when the store has a payload codec: a text delta or a tool result is as secret
        # as the transcript it becomes (issue #34; tests/fleet/test_fleet_codec.py reads Redis for plaintext).
        codec, place = self.store.codec, event_place(self.session_id)
        return [codec.encode_text(json.dumps(event, separators=(",", ":"), default=str), place) for event in pending]

    def _queue(self, bodies: list[str | bytes], pipe: Any) -> int:
        """Queue the XADDs (and the stream's expiry) on `pipe`; how many commands."""
        for body in bodies:
            pipe.xadd(self.key, {"e": body}, maxlen=self.maxlen, approximate=True, nomkstream=True)
        if self.store.ttl_s is None:
            return len(bodies)
        pipe.pexpire(self.key, max(1, round(self.store.ttl_s * 1000)))
        return len(bodies) + 1

    def _write(self, pending: list[dict[str, Any]]) -> None:
        client = self.store.client
        bodies = self._bodies(pending)
        try:
            with redis_errors(client, f"write the events of session {self.session_id!r}"):
                if len(bodies) == 1 and self.store.ttl_s is None:  # one command: no pipeline to build
                    client.xadd(self.key, {"e": bodies[0]}, maxlen=self.maxlen, approximate=True, nomkstream=True)
                    return
                pipe = client.pipeline(transaction=False)
                self._queue(bodies, pipe)
                pipe.execute()
        except Exception as exc:  # a view only: the step goes on, its checkpoint is the truth
            log.warning("lousho: %d event(s) of session %r not written: %s", len(pending), self.session_id, exc)

    def close(self) -> None:
        """The task ends: what is pending goes to the writer thread, off the hop's path (issue #34's cost). A
        task's last save told alone is carried for `CARRY_S` first: a next step of the session in this process
        within that time writes it in its own first write, ahead of its events (a zero-latency hop then costs no
        write of its own); else the writer thread writes it. A step on another worker usually comes after
        these, not by guarantee (docs/fleet.md, "Order")."""
        pending = self._take()
        if not pending:
            return
        self._last_write = time.monotonic()
        if all(event["kind"] == "checkpoint-saved" for event in pending):
            WRITES.carry(self.key, pending, self._write, CARRY_S)
        else:
            WRITES.submit(functools.partial(self._write, pending), self.key)
