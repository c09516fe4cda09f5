"""Heads and transcript segments: what the SQL, file and Redis stores share (no SQLAlchemy, no redis here).

A session's transcript only grows, so its messages are stored once, appended to a per-session
sequence (rows of `lousho_messages`, lines of `messages/<session>.jsonl`), and each saved record
(the latest checkpoint and every history entry) is a *head*: the checkpoint's JSON without its
messages, behind a store header naming the slices of that sequence it uses:

    {"$store":{"f":1,"w":"<writer id>","s":[[start,count],...], ...},"messages":null, <other fields>}

`"messages":null` makes an older lousho refuse such a record (`CorruptCheckpointError`) instead
of reading an empty transcript. A record without the header is a whole checkpoint JSON (an older
layout, or one written by hand) and is read as it is.

A store remembers, per session, the version, writer id and message objects of the last
checkpoint it saved or loaded (`SessionCache`); when the stored head still carries that writer id,
a save finds the unchanged prefix by identity (`common_prefix`) and stores only the new messages.
In SqlStore and FileStore only saves use it: a load reads and checks every message the head names,
so a message damaged since this process wrote it raises there as in any other process (issue #21;
RedisStore's load uses it only while the messages list matches the head's digest).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from lousho.checkpoint import Checkpoint, decode_checkpoint
from lousho.errors import CorruptCheckpointError
from lousho.messages import Message
from lousho.stores.codec import PLAIN, PayloadCodec, message_place
from lousho.stores.record_header import HEADER, RECORD_START, header_text, read_header

__all__ = [
    "HEADER",
    "Head",
    "Known",
    "SessionCache",
    "Transcript",
    "behind_header",
    "common_prefix",
    "encode_record",
    "encode_records",
    "extend_segments",
    "kept_segments",
    "new_writer_id",
    "parse_message",
    "plan_save",
    "split_record",
    "text_prefix",
    "written_head",
]

FORMAT = 1
Segments = list[tuple[int, int]]


@dataclass(frozen=True)
class Head:
    """A record's store header: who wrote it and which slices of the message sequence it uses."""

    writer: str
    segments: Segments
    extra: dict[str, Any] = field(default_factory=dict)
    """Store-specific fields (FileStore: `n` lines and `b` bytes of its messages file in use)."""

    @property
    def end(self) -> int:
        """One past the last message position the head uses (0 when it uses none)."""
        return max((start + count for start, count in self.segments if count), default=0)


def new_writer_id() -> str:
    """A save's writer id: 128 random bits as hex, like `uuid4().hex`, without building a UUID (a few us
    per save, issue #20). Only compared for equality: a head is the one this process wrote."""
    return os.urandom(16).hex()


def encode_record(
    checkpoint: Checkpoint, writer: str, segments: Segments, *, codec: PayloadCodec = PLAIN, **extra: int
) -> str:
    """The head of `checkpoint`: its JSON without messages (secret fields sealed by `codec`, issue #17),
    behind the header naming `segments`."""
    return behind_header(writer, segments, extra, codec.seal_head(checkpoint))


def encode_records(
    checkpoint: Checkpoint,
    writer: str,
    segments: Segments,
    *,
    codec: PayloadCodec = PLAIN,
    session_id: str | None = None,
    history: bool = True,
    **extra: int,
) -> list[str]:
    """The head of `checkpoint` and (with `history`) its history entry: the same header and fields, the
    sealed part bound to each place (issue #31; the same text twice when nothing is encrypted)."""
    bodies = codec.seal_record(checkpoint, session_id, history=history)
    header = _record_start(writer, segments, extra)  # one header for both (issue #30)
    return [header + body[1:] for body in bodies]


def behind_header(writer: str, segments: Segments, extra: Mapping[str, int], body: str) -> str:
    """A record: the store header (`writer`, `segments`, the store's own `extra` fields), then `body`, the
    checkpoint's JSON without messages (as `seal_record` makes it)."""
    return _record_start(writer, segments, extra) + body[1:]


def _record_start(writer: str, segments: Segments, extra: Mapping[str, int]) -> str:
    return RECORD_START + header_text(FORMAT, writer, segments, extra) + ',"messages":null,'


def split_record(
    session_id: str, raw: object, codec: PayloadCodec | None = None, *, history: bool = False
) -> tuple[Any, Head | None]:
    """A stored record (text, or JSON already parsed) as (its JSON fields, its header), the header
    None for a whole checkpoint JSON; a sealed part is opened by `codec` (issue #17), as the head of
    the session or (`history`) as a history entry (issue #31), or left sealed when None (a caller
    after the header alone).

    Not JSON, or a damaged or newer header, raises `CorruptCheckpointError`; the caller decodes
    the fields (`decode_checkpoint`), which checks everything else."""
    data: Any = raw
    if isinstance(raw, (str, bytes)):
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            decode_checkpoint(session_id, raw)  # raises, saying "not JSON"
            raise AssertionError("unreachable") from None
    elif isinstance(raw, dict):
        data = dict(raw)
    if not isinstance(data, dict):
        return data, None
    if HEADER not in data:  # a whole checkpoint JSON: its sealed part (if any) covers its inline messages
        if codec is not None:
            codec.open_fields(data, session_id, history=history)
        return data, None
    meta = data.get(HEADER)
    if isinstance(meta, dict) and isinstance(meta.get("f"), int) and meta["f"] > FORMAT:
        raise CorruptCheckpointError(
            session_id, f"it was written by a newer lousho (store format {meta['f']}); upgrade lousho"
        )
    head = _head(meta)
    if head is None:
        raise CorruptCheckpointError(session_id, "its store header is damaged")
    if codec is not None:
        codec.open_fields(data, session_id, history=history, count=sum(count for _, count in head.segments))
    data.pop(HEADER)
    return data, head


def written_head(raw: object, writer: str) -> Head | None:
    """The header of a stored record when it names `writer` (the save this process made last), read alone:
    a save only needs its writer and segments (issue #30). None otherwise: read it all (`split_record`)."""
    meta = read_header(raw)
    if not isinstance(meta, dict) or meta.get("w") != writer:
        return None
    return _head(meta) if isinstance(meta.get("f"), int) and meta["f"] <= FORMAT else None


def _head(meta: Any) -> Head | None:
    if not isinstance(meta, dict) or not isinstance(meta.get("w"), str) or not isinstance(meta.get("s"), list):
        return None
    segments: Segments = []
    for segment in meta["s"]:  # the same checks as a generator over each pair, without one (issue #30)
        if not (isinstance(segment, list) and len(segment) == 2):
            return None
        start, count = segment
        if not (type(start) is int and type(count) is int and start >= 0 and count >= 0):
            return None
        segments.append((start, count))
    extra = {k: v for k, v in meta.items() if k not in ("f", "w", "s")}
    if extra and not all(type(v) is int and v >= 0 for v in extra.values()):
        return None
    return Head(writer=meta["w"], segments=segments, extra=extra)


class Transcript:
    """A session's stored messages by position, parsed lazily and once (history entries share them).

    `rows`: position -> JSON (SQL rows by seq), or the sequence itself (lines of a messages file)."""

    def __init__(
        self,
        session_id: str,
        rows: Mapping[int, str | bytes] | Sequence[str | bytes],
        codec: PayloadCodec = PLAIN,
    ) -> None:
        """`codec`: decodes rows the store's codec encoded (issue #17); plain rows read as they are."""
        self._session_id = session_id
        self._rows = rows
        self._codec = codec
        self._parsed: dict[tuple[int, int], Message] = {}

    @property
    def rows(self) -> dict[int, str | bytes]:
        """The stored text of each message by position, as stored."""
        if isinstance(self._rows, Mapping):
            return dict(self._rows)
        return dict(enumerate(self._rows))

    def _raw(self, position: int, index: int) -> str | bytes | None:
        """The stored message at `position`, decoded as the `index`-th of the transcript (its place, #31)."""
        if isinstance(self._rows, Mapping):
            raw = self._rows.get(position)
        else:
            raw = self._rows[position] if 0 <= position < len(self._rows) else None
        return None if raw is None else self._codec.decode_text(raw, message_place(self._session_id, index))

    def texts(self, segments: Segments) -> list[str | None]:
        """The stored JSON of each message the segments name (None where one is missing or not text)."""
        out: list[str | None] = []
        for position in _positions(segments):
            raw = self._raw(position, len(out))
            out.append(raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
        return out

    def take(self, segments: Segments) -> list[Message]:
        """The messages the segments name; a missing one raises `CorruptCheckpointError`."""
        out: list[Message] = []
        for position in _positions(segments):
            index = len(out)
            message = self._parsed.get((position, index))
            if message is None:
                raw = self._raw(position, index)
                if raw is None:
                    raise CorruptCheckpointError(self._session_id, "its head names messages that are not stored")
                message = self._parsed[(position, index)] = parse_message(self._session_id, raw)
            out.append(message)
        return out


def _positions(segments: Segments) -> list[int]:
    return [position for start, count in segments for position in range(start, start + count)]


def parse_message(session_id: str, raw: str | bytes) -> Message:
    try:
        return Message.model_validate_json(raw)
    except ValidationError as exc:
        raise CorruptCheckpointError(session_id, f"a stored message is damaged ({exc.errors()[0]['msg']})") from exc


def common_prefix(old: Sequence[Message], new: Sequence[Message]) -> int:
    """How many leading messages `new` shares with `old`: identity first (consecutive checkpoints
    of a run share their message objects, so this is pointer compares), then equality."""
    if len(new) >= len(old) and list(new[: len(old)]) == list(old):
        return len(old)
    count = 0
    for before, after in zip(old, new, strict=False):
        if before is not after and before != after:
            break
        count += 1
    return count


def text_prefix(stored: Sequence[str | None], new: Sequence[str]) -> int:
    """How many leading serialized messages are the same in both (None: a stored one is missing)."""
    count = 0
    for before, after in zip(stored, new, strict=False):
        if before != after:
            break
        count += 1
    return count


def kept_segments(segments: Segments, keep: int) -> Segments | None:
    """The segments of the first `keep` messages of a transcript stored as `segments` (None: too few)."""
    out: Segments = []
    left = keep
    for start, count in segments:
        if left <= 0:
            break
        taken = min(count, left)
        out.append((start, taken))
        left -= taken
    return None if left > 0 else out


def extend_segments(segments: Segments, base: int, count: int) -> Segments:
    """`segments` followed by `count` messages appended at position `base` (merged when contiguous)."""
    if count <= 0:
        return segments
    if segments and sum(segments[-1]) == base:
        return [*segments[:-1], (segments[-1][0], segments[-1][1] + count)]
    return [*segments, (base, count)]


def plan_save(
    cache: SessionCache,
    session_id: str,
    checkpoint: Checkpoint,
    head: Head | None,
    stored_texts: Callable[[Head], Sequence[str | None]],
    codec: PayloadCodec = PLAIN,
) -> tuple[Segments, list[str]]:
    """What a save stores: the segments of the stored head the new transcript keeps, and the JSON of
    the messages to append (SqlStore, FileStore and the mapping store share it, issue #16).

    A head this process wrote or read last (`cache`): the kept prefix found by identity, only the new
    messages serialized. Otherwise the whole transcript is serialized and compared with the stored
    one, `stored_texts(head)`: the plain JSON of each message the head names, read once. The texts
    to append come back encoded by `codec` (issue #17)."""
    known = cache.reusable(session_id, checkpoint.version - 1, head)
    if known is not None and head is not None:
        keep = common_prefix(known.messages, checkpoint.messages)
        kept = kept_segments(head.segments, keep)
        if kept is not None:
            new = [m.model_dump_json() for m in checkpoint.messages[keep:]]
            return kept, _encoded(codec, session_id, keep, new)
    texts = [m.model_dump_json() for m in checkpoint.messages]
    if head is None or not head.segments:
        return [], _encoded(codec, session_id, 0, texts)
    keep = text_prefix(stored_texts(head), texts)
    return kept_segments(head.segments, keep) or [], _encoded(codec, session_id, keep, texts[keep:])


def _encoded(codec: PayloadCodec, session_id: str, first: int, texts: Sequence[str]) -> list[str]:
    """`texts`, the messages from transcript index `first` on, encoded each bound to its index (issue #31)."""
    if not codec.active:
        return list(texts)
    return [codec.encode_text(text, message_place(session_id, first + i)) for i, text in enumerate(texts)]


@dataclass(frozen=True)
class Known:
    """What this store last saw stored for a session: enough to send only new messages."""

    version: int
    writer: str
    messages: tuple[Message, ...]


class SessionCache:
    """A small LRU of `Known` per session. An entry is used only when the stored head carries its
    writer id, so a stale one (another process saved, a save failed) costs a full write, never a
    wrong save.

    An entry `set_aside` (a fleet worker's step of the session is over) is kept `keep_s` more for the
    session's next step, which may run in this process soon, then dropped unless a step used it again:
    a worker would otherwise hold the transcripts of every session waiting between two steps, several
    for each step it runs (issue #29)."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._entries: OrderedDict[str, Known] = OrderedDict()
        self._aside: OrderedDict[str, float] = OrderedDict()
        """Session -> when its entry goes (time.monotonic), in the order they were set aside."""
        self._lock = threading.Lock()

    def get(self, session_id: str, now: float | None = None) -> Known | None:
        with self._lock:
            self._expire(time.monotonic() if now is None else now)
            known = self._entries.get(session_id)
            if known is not None:
                self._entries.move_to_end(session_id)
                self._aside.pop(session_id, None)  # in use again
            return known

    def put(self, session_id: str, known: Known) -> None:
        if self._size <= 0:
            return
        with self._lock:
            self._entries[session_id] = known
            self._entries.move_to_end(session_id)
            self._aside.pop(session_id, None)
            while len(self._entries) > self._size:
                evicted, _ = self._entries.popitem(last=False)
                self._aside.pop(evicted, None)

    def drop(self, session_id: str) -> None:
        with self._lock:
            self._entries.pop(session_id, None)
            self._aside.pop(session_id, None)

    def set_aside(self, session_id: str, keep_s: float, now: float | None = None) -> None:
        """Keep the session's entry `keep_s` more, then drop it unless a `get` or `put` used it again."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if session_id in self._entries:
                self._aside.pop(session_id, None)
                self._aside[session_id] = now + keep_s
            self._expire(now)

    def _expire(self, now: float) -> None:
        while self._aside:
            session_id, until = next(iter(self._aside.items()))
            if until > now:
                return
            del self._aside[session_id]
            self._entries.pop(session_id, None)

    def reusable(self, session_id: str, version: int, head: Head | None) -> Known | None:
        """The cached transcript when it is the one `head` (at `version`) stores, else None."""
        known = self.get(session_id)
        if known is None or head is None or known.version != version or known.writer != head.writer:
            return None
        return known
