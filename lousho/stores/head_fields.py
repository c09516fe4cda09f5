"""`HeadFields`: what a listing shows of a session, read from its stored head without opening a payload (issue #32).

A head keeps in plain JSON what listings, prune and the fleet's scripts read (`PLAIN_FIELDS` of the codec: ids,
status, step numbers), behind a store header naming its messages (`"s"`: segments) and, where the store records
it, its save time (`"t"`: ms). So `lousho sessions`, `Client` listings and the dashboard's sessions page read
those and nothing else: a store whose payloads this process cannot open (no key) lists in full, and a listing
costs no decryption, decompression or message parsing. With keys, these fields are vouched for only when the
head is opened (`lousho show`): a listing shows them as stored.

Each store's `checkpoints.heads(session_ids)` returns a `Listing[HeadFields]` (a head that is not a JSON object
is named in `skipped`); a store without `heads()` is listed by loading each checkpoint instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lousho.checkpoint import Checkpoint
from lousho.errors import CorruptCheckpointError

__all__ = ["HeadFields", "fields_of_checkpoint", "head_fields", "iso_of_ms"]


@dataclass(frozen=True)
class HeadFields:
    """A session's plain head fields: what a listing shows without its payload."""

    session_id: str
    status: str
    agent_name: str | None = None
    step_index: int | None = None
    approval_id: str | None = None
    parent_session_id: str | None = None
    messages: int | None = None
    """How many messages its transcript has (the header's segments), None when the store cannot say."""
    saved_at: str | None = None
    """When it was last saved (ISO 8601, UTC), None when the store cannot say."""


def iso_of_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def head_fields(
    session_id: str, raw: str | bytes | dict[str, Any], *, saved_at: str | None = None, messages: int | None = None
) -> HeadFields:
    """The plain fields of a stored head (text, or JSON already parsed), never opening its sealed part;
    `saved_at`, `messages`: what the store knows besides (a column, a file's time), else the header's."""
    try:
        data = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except (ValueError, UnicodeDecodeError):
        data = None
    status = data.get("status", "in-progress") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(status, str):
        raise CorruptCheckpointError(session_id, "its head is not a JSON object with a status")
    meta = data.get("$store")
    if isinstance(meta, dict):
        segments = meta.get("s")
        if messages is None and isinstance(segments, list):
            counts = [s[1] for s in segments if isinstance(s, list) and len(s) == 2]
            messages = sum(c for c in counts if isinstance(c, int)) if len(counts) == len(segments) else None
        stamp = _int(meta.get("t"))
        if saved_at is None and stamp is not None:
            saved_at = iso_of_ms(stamp)
    elif messages is None and isinstance(data.get("messages"), list):
        messages = len(data["messages"])
    return HeadFields(
        session_id=session_id,
        status=status,
        agent_name=_text(data.get("agent_name")),
        step_index=_int(data.get("step_index")),
        approval_id=_text(data.get("approval_id")),
        parent_session_id=_text(data.get("parent_session_id")),
        messages=messages,
        saved_at=saved_at,
    )


def fields_of_checkpoint(checkpoint: Checkpoint, saved_at: str | None = None) -> HeadFields:
    """The same fields of a loaded checkpoint (a store without `heads()`)."""
    return HeadFields(
        session_id=checkpoint.session_id,
        status=checkpoint.status,
        agent_name=checkpoint.agent_name,
        step_index=checkpoint.step_index,
        approval_id=checkpoint.approval_id,
        parent_session_id=checkpoint.parent_session_id,
        messages=len(checkpoint.messages),
        saved_at=saved_at,
    )
