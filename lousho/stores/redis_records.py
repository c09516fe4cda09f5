"""How RedisStore's records read back: a head or history entry plus the messages it names.

A record is the checkpoint's JSON without its messages, behind a store header
`{"$store":{"f":1,"v":<version>,"w":<writer id>,"t":<ms>,"s":[[start,count],...]}, ...}`.
A record without the header is a plain checkpoint JSON (written by hand or by an older
layout) and carries its own messages. Anything else is reported, never repaired.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from lousho.checkpoint import Checkpoint, check_schema, decode_checkpoint
from lousho.errors import CorruptCheckpointError, NewerFormatError
from lousho.messages import Message
from lousho.stores.codec import PLAIN, PayloadCodec, message_place

__all__ = ["MessagePool", "check_count", "decode_record", "parse_messages", "status_of"]

HEADER = "$store"


class MessagePool:
    """The session's messages list, parsed lazily and once, shared by every history entry."""

    def __init__(self, session_id: str, raws: Sequence[bytes | str], codec: PayloadCodec = PLAIN) -> None:
        self._session_id = session_id
        self._codec = codec
        self._raws = raws
        self._parsed: dict[tuple[int, int], Message] = {}
        self._digests: dict[tuple[str, int], str] = {}

    def take(self, segments: list[list[int]]) -> list[Message]:
        out: list[Message] = []
        for start, count in segments:
            if start < 0 or start + count > len(self._raws):
                raise CorruptCheckpointError(self._session_id, "a history entry names messages the list no longer has")
            for position in range(start, start + count):
                index = len(out)
                message = self._parsed.get((position, index))
                if message is None:
                    raw = self._raws[position]
                    message = parse_messages(self._session_id, [raw], self._codec, first=index)[0]
                    self._parsed[(position, index)] = message
                out.append(message)
        return out

    def digest(self, segments: list[list[int]]) -> str:
        """The chained digest of the messages the segments name (save_checkpoint.lua's `h`), each step
        remembered: history entries share their prefix."""
        digest = ""
        for start, count in segments:
            for position in range(max(start, 0), min(start + count, len(self._raws))):
                step = self._digests.get((digest, position))
                if step is None:
                    step = self._digests[(digest, position)] = chain_step(digest, self._raws[position])
                digest = step
        return digest


def chain_step(digest: str, raw: bytes | str) -> str:
    """One step of segments.lua's `chain_digest`: sha1hex(digest .. message)."""
    return hashlib.sha1(digest.encode() + (raw.encode() if isinstance(raw, str) else raw)).hexdigest()


_MESSAGES: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


def parse_messages(
    session_id: str, raws: Sequence[bytes | str], codec: PayloadCodec = PLAIN, *, first: int = 0
) -> list[Message]:
    """Each stored message (plain JSON, or encoded by the store's codec: issue #17) as a `Message`, the
    first one the `first`-th of the transcript (its place, issue #31)."""
    if codec.reads_plain and len(raws) > 1 and all(_one_plain_object(raw) for raw in raws):
        try:  # one validation for the transcript: half the time of one a message (issue #30: a cold read's cost)
            parsed = _MESSAGES.validate_json(b"[" + b",".join(raws) + b"]")  # type: ignore[arg-type]
        except ValidationError:
            parsed = []  # read one by one below, for the error that names what is wrong
        if len(parsed) == len(raws):
            return parsed
    try:
        return [
            Message.model_validate_json(codec.decode_text(raw, message_place(session_id, first + i)))
            for i, raw in enumerate(raws)
        ]
    except ValidationError as exc:
        raise CorruptCheckpointError(session_id, f"a stored message is damaged ({exc.errors()[0]['msg']})") from exc


_CLOSE_AND_OPEN = re.compile(rb"\}\s*,\s*\{")
"""What could end one object and begin the next inside one raw message: a raw without it is never read as two."""


def _one_plain_object(raw: bytes | str) -> bool:
    """Whether `raw` reads, among the others joined into one array, as itself: plain JSON bytes that begin and end as
    one object and hold nothing that could end it and open another (`_CLOSE_AND_OPEN`). Joined, such raws can only
    merge (fewer elements than raws, then each is read alone); anything else (sealed, text, a message whose strings
    hold `},{`) is read alone."""
    return isinstance(raw, bytes) and raw[:1] == b"{" and raw[-1:] == b"}" and not _CLOSE_AND_OPEN.search(raw)


def check_count(session_id: str, segments: list[list[int]], messages: list[Message]) -> list[Message]:
    """The load script already sliced the segments; check that the list still held them all."""
    if sum(count for _, count in segments) != len(messages):
        raise CorruptCheckpointError(
            session_id, "its messages list is shorter than its head says (deleted or expired?)"
        )
    return messages


def decode_record(
    session_id: str,
    raw: bytes | str,
    messages_for: Callable[[list[list[int]]], list[Message]],
    codec: PayloadCodec = PLAIN,
    *,
    history: bool = False,
) -> tuple[Checkpoint, dict[str, Any] | None]:
    """A head or history entry as a checkpoint, plus its store header (None for a plain checkpoint JSON).

    `messages_for(segments)` supplies the transcript the header names; a plain JSON keeps its own.
    A head's sealed part is opened by `codec` (issue #17), as the session's head or (`history`) as
    the history entry of its version (issue #31).
    """
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return decode_checkpoint(session_id, raw), None  # raises, saying "not JSON"
    meta = data.pop(HEADER, None) if isinstance(data, dict) else None
    if meta is None:
        fields = codec.open_fields(data, session_id, history=history) if isinstance(data, dict) else data
        return decode_checkpoint(session_id, fields), None
    if isinstance(meta, dict) and isinstance(meta.get("f"), int) and meta["f"] > 1:
        raise NewerFormatError(  # not damage: handed back on the fleet for a worker that reads it (issue #35)
            session_id, f"it was written by a newer lousho (store format {meta['f']}); upgrade lousho"
        )
    if not _valid_header(meta):
        raise CorruptCheckpointError(session_id, "its store header is damaged")
    check_schema(session_id, data)  # before its transcript: a newer schema may keep it otherwise
    data["messages"] = messages_for(meta["s"])
    return decode_checkpoint(session_id, codec.open_fields(data, session_id, history=history)), meta


def _valid_header(meta: Any) -> bool:
    return (
        isinstance(meta, dict)
        and isinstance(meta.get("v"), int)
        and isinstance(meta.get("w"), str)
        and isinstance(meta.get("t"), int)
        and isinstance(meta.get("s"), list)
        and all(isinstance(s, list) and len(s) == 2 and all(isinstance(n, int) for n in s) for s in meta["s"])
    )


def status_of(raw: bytes | str) -> str | None:
    """A head's status ('in-progress' when it has none), or None when it is not a JSON object with a text status."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    status = data.get("status", "in-progress") if isinstance(data, dict) else None
    return status if isinstance(status, str) else None
