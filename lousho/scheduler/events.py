"""Reading a session's live event stream (`Client.events`, issue #34): sync or async, resumable.

A feed reads the stream with blocking `XREAD`s (`block_s` each) from where it is (`after`: an event id; None: the
stream's start, so a page opened late still sees the answer so far) and ends when the run pauses or finishes: after
an ending event (finished, approval requested, parked, aborted) that nothing follows while the session is idle, or
when a read times out with the session idle. Resuming from an event's id misses none of the events kept after it
and repeats none: delivery is at-least-once to a reader that resumes from the last id it handled. The stream is a
view; the checkpoint (`Client.checkpoint`) is the truth.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, cast

from lousho.errors import ConfigurationError, InvalidEventIdError
from lousho.fleet.events import ENDING_KINDS, SessionEvent, events_key
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors

__all__ = ["EventFeed", "validate_event_id"]

EVENT_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
"""A stream entry id, as `after=` (a browser's `Last-Event-ID`) takes it."""
MAX_EVENT_ID_PART = 2**64 - 1
"""The largest of either part of an event id: Redis refuses a stream id past it."""
BATCH = 500
"""The most entries one read returns."""
GRACE_S = 0.2
"""How long after seeing the run stopped a feed waits for the stopping task's last events (`next_batch`)."""


def validate_event_id(event_id: object) -> str:
    """`event_id` as an id of a session's event stream, or `InvalidEventIdError`: the one check of every reader's
    `after` (`Client.events`, the web example's and the dashboard's `Last-Event-ID`), made before Redis is asked,
    which would refuse an id out of its range. The error tells the id's length, never the id: a header is
    whatever was sent."""
    match = EVENT_ID.fullmatch(event_id) if isinstance(event_id, str) else None
    if match is None or any(int(part) > MAX_EVENT_ID_PART for part in match.groups()):
        given = f"{len(event_id)} characters" if isinstance(event_id, str) else type(event_id).__name__
        raise InvalidEventIdError(
            f"the event id given ({given}) is not one of the stream: after= (and Last-Event-ID) takes an event's "
            f".id, '<ms>-<n>', two whole numbers of at most {MAX_EVENT_ID_PART} each; nothing was read"
        )
    return match.group(0)


class EventFeed:
    """The events of one session, as `for event in feed` or `async for event in feed`.

    `idle()` tells whether the session waits for someone (finished, awaiting approval, parked, aborted, unknown);
    `timeout_s` (None: none) ends a feed that saw nothing for that long, whatever the session does."""

    def __init__(
        self,
        store: RedisStore,
        session_id: str,
        *,
        idle: Callable[[], bool],
        after: str | None = None,
        block_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> None:
        if block_s <= 0:
            raise ConfigurationError(f"block_s must be positive, not {block_s}")
        if after is not None:
            validate_event_id(after)
        self.store = store
        self.session_id = session_id
        self.key = events_key(store, session_id)
        self.idle = idle
        self.last_id = after or "0"
        """The id of the last event read: where the feed (or a new one) goes on from."""
        self.block_s = block_s
        self.timeout_s = timeout_s
        self._quiet_since = time.monotonic()
        self._done = False

    def read(self, block: bool = True) -> list[SessionEvent]:
        """The next events after `last_id` (waiting up to `block_s` for one when `block`); moves `last_id` on."""
        client = self.store.client
        with redis_errors(client, f"read the events of session {self.session_id!r}"):
            block_ms = max(1, round(self.block_s * 1000)) if block else None
            reply = cast(list[Any], client.xread({self.key: self.last_id}, count=BATCH, block=block_ms))
        events = [
            SessionEvent.from_entry(self.session_id, entry_id, fields, self.store.codec)
            for _key, entries in reply or []
            for entry_id, fields in entries
        ]
        if events:
            self.last_id = events[-1].id
            self._quiet_since = time.monotonic()
        return events

    def next_batch(self) -> list[SessionEvent] | None:
        """One blocking read's events; an empty list when it timed out and the run goes on; None at the end."""
        if self._done:
            return None
        events = self.read()
        if events:
            if events[-1].kind in ENDING_KINDS and self._ends_after(events[-1]):
                self._done = True
            return events
        if self.timeout_s is not None and time.monotonic() - self._quiet_since > self.timeout_s:
            return None
        if self.idle():
            # A task writes its last events just after its save: read once more, so a run that just stopped
            # ends the feed after them, not before.
            time.sleep(GRACE_S)
            return self.read(block=False) or None
        return []

    def _ends_after(self, event: SessionEvent) -> bool:
        """The run stopped at `event`: nothing was written since, and the session waits (an abort leaves it
        'in-progress', idle)."""
        if self.read_more():
            return False
        return event.kind == "aborted" or self.idle()

    def read_more(self) -> bool:
        """Whether an event follows `last_id` (not consumed)."""
        client = self.store.client
        with redis_errors(client, f"read the events of session {self.session_id!r}"):
            return bool(client.xrange(self.key, min=f"({self.last_id}", max="+", count=1))

    def __iter__(self) -> Iterator[SessionEvent]:
        while (events := self.next_batch()) is not None:
            yield from events

    async def __aiter__(self) -> AsyncIterator[SessionEvent]:
        # The blocking read runs in a thread: the event loop (a FastAPI app's) goes on meanwhile.
        while (events := await asyncio.to_thread(self.next_batch)) is not None:
            for event in events:
                yield event
