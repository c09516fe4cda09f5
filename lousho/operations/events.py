"""Following a session's live events (issue #34): what `lousho show --follow` prints and the dashboard's session
page shows as the workers write them. On a fleet the session's event stream (`Client.events`); elsewhere there is
none (an in-process store has no workers writing events), and both front ends look at the saves instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from lousho.checkpoint import validate_session_id
from lousho.operations.target import Target

if TYPE_CHECKING:
    from lousho.fleet.events import SessionEvent
    from lousho.scheduler.events import EventFeed

__all__ = ["describe_event", "latest_event_id", "session_events"]


def session_events(
    target: Target, session_id: str, after: str | None = None, *, block_s: float = 1.0
) -> EventFeed | None:
    """The session's live events after `after` (None: from the stream's start), ending when the run pauses or
    finishes; None off a fleet."""
    if target.client is None:
        return None
    return target.client.events(session_id, after=after, block_s=block_s)


def latest_event_id(target: Target, session_id: str) -> str | None:
    """The id of the session's newest event ("0-0" when it has none yet; None off a fleet): read it before the
    checkpoint, and follow from it, so nothing written after that read is missed."""
    store = target.fleet_store
    if store is None or target.client is None:
        return None
    from lousho.fleet.events import events_key
    from lousho.stores.redis_common import redis_errors

    validate_session_id(session_id)
    with redis_errors(store.client, f"read the newest event of session {session_id!r}"):
        newest = cast(list[tuple[bytes | str, object]], store.client.xrevrange(events_key(store, session_id), count=1))
    if not newest:
        return "0-0"
    entry_id = newest[0][0]
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


def describe_event(event: SessionEvent) -> str | None:
    """A line about an event that is no text delta (None for a delta and a save: the text itself, and the saved
    messages, are shown instead)."""
    data = event.data
    if event.kind == "turn-started":
        again = (event.attempt is not None and event.attempt > 1) or data.get("retry")
        suffix = ": the text streamed before is dropped" if again else ""
        retry = f", provider try {data['retry']}" if data.get("retry") else ""
        return f"turn {event.turn}, attempt {event.attempt}{retry} started{suffix}"
    if event.kind in ("tool-call-started", "tool-call-finished"):
        return f"tool {data.get('name')} #{data.get('call_id')} {event.kind.rsplit('-', 1)[1]}"
    if event.kind == "approval-requested":
        return f"approval {data.get('approval_id')} requested for {data.get('name')}"
    if event.kind == "approval-decided":
        return f"approval {data.get('approval_id')} {'approved' if data.get('approved') else 'rejected'}"
    if event.kind in ("requeued", "finished", "aborted"):
        return event.kind
    if event.kind == "failed":
        return f"a step failed (the fleet runs it again): {data.get('error')}"
    if event.kind == "parked":
        return f"parked: {data.get('reason')}"
    return None
