"""Re-sealing a session's stored values under the codec's current key and place (issue #31): `lousho reseal`.

A store written before its keys were set (plain JSON), by lousho 0.1 (encrypted without the place), or under
a key being retired, is read with a codec that can read it (`read_unsealed=True` for the first two, the old
key among `keys` for the last) and every value of the session is written again, in place, sealed under the
first key to where it is: each message at its position, the head, each history entry, with their writer ids,
segments and save times unchanged. A record of the older whole-checkpoint layout is left to the next save.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from lousho.checkpoint import decode_checkpoint
from lousho.errors import CorruptCheckpointError
from lousho.stores.codec import PayloadCodec, message_place
from lousho.stores.redis_records import chain_step
from lousho.stores.segments import HEADER, Head, behind_header, parse_message, split_record

if TYPE_CHECKING:
    from lousho.stores.redis_checkpoints import RedisCheckpointStore

__all__ = ["Resealed", "reseal_records", "reseal_redis_records", "reseal_redis_session"]


@dataclass
class Resealed:
    """The new stored text of each value: records in the order given, messages by position."""

    records: list[str] = field(default_factory=list)
    messages: dict[int, Any] = field(default_factory=dict)
    sealed: list[tuple[Head, str]] = field(default_factory=list)
    """`reseal_records`: each record's header as it was read and its new body, for `with_extra`."""

    def with_extra(self, extra: Callable[[Head], Mapping[str, int]]) -> list[str]:
        """The records again, each header's store-specific fields `extra(header)`: FileStore's byte count `b`
        of the messages file changes when its lines are written again at other lengths."""
        return [behind_header(head.writer, head.segments, extra(head), body) for head, body in self.sealed]


def _indexes(segments: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(position, transcript index) of each message the segments name."""
    positions = [p for start, count in segments for p in range(start, start + count)]
    return list(zip(positions, range(len(positions)), strict=True))


def _messages(
    session_id: str,
    codec: PayloadCodec,
    rows: Mapping[int, str | bytes],
    segments: Sequence[Sequence[int]],
    encoded: dict[int, Any],
    *,
    binary: bool = False,
) -> list[Any]:
    """The messages the segments name; each one's new stored value (bytes where the store keeps bytes) goes
    into `encoded`, once per position (records share them)."""
    messages: list[Any] = []
    for position, index in _indexes(segments):
        raw = rows.get(position)
        if raw is None:
            raise CorruptCheckpointError(session_id, "its head names messages that are not stored")
        place = message_place(session_id, index)
        plain = codec.decode_text(raw, place)
        messages.append(parse_message(session_id, plain))
        if position not in encoded:
            encoded[position] = codec.encode_json(plain, place) if binary else codec.encode_text(plain, place)
    return messages


def reseal_records(
    session_id: str,
    codec: PayloadCodec,
    records: Sequence[tuple[str | bytes, bool]],
    rows: Mapping[int, str | bytes],
) -> Resealed:
    """SqlStore, FileStore and the mapping store: each (record, is a history entry) re-sealed, with the
    messages it names (`rows`: position -> stored text). Every value is read before anything is returned,
    so a value that does not open raises and the caller writes nothing."""
    out = Resealed()
    for raw, history in records:
        data, head = split_record(session_id, raw, codec, history=history)
        if head is None:
            raise CorruptCheckpointError(
                session_id, "a record of the older whole-checkpoint layout: save the session once, then re-seal"
            )
        messages = _messages(session_id, codec, rows, head.segments, out.messages)
        checkpoint = decode_checkpoint(session_id, {**data, "messages": messages})
        body = codec.seal_record(checkpoint, session_id, history=history)[-1]
        out.sealed.append((head, body))
        out.records.append(behind_header(head.writer, head.segments, head.extra, body))
    return out


def reseal_redis_records(
    session_id: str, codec: PayloadCodec, records: Sequence[tuple[str | bytes, bool]], listed: Sequence[bytes]
) -> Resealed:
    """RedisStore: as `reseal_records`, its header's transcript digest `h` made again over the new bytes."""
    rows = dict(enumerate(listed))
    out = Resealed()
    for raw, history in records:
        data = json.loads(raw)
        meta = data.pop(HEADER, None) if isinstance(data, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("s"), list):
            raise CorruptCheckpointError(
                session_id, "a record of the older whole-checkpoint layout: save the session once, then re-seal"
            )
        messages = _messages(session_id, codec, rows, meta["s"], out.messages, binary=True)
        data["messages"] = messages
        opened = codec.open_fields(data, session_id, history=history)
        checkpoint = decode_checkpoint(session_id, opened)
        body = codec.seal_record(checkpoint, session_id, history=history)[-1]
        out.records.append(_redis_record(meta, body, out.messages, rows))
    return out


def _redis_record(meta: dict[str, Any], body: str, new: Mapping[int, Any], old: Mapping[int, Any]) -> str:
    if isinstance(meta.get("h"), str):
        digest = ""
        for position, _ in _indexes(meta["s"]):
            digest = chain_step(digest, new.get(position, old.get(position, b"")))
        meta = {**meta, "h": digest}
    return '{"' + HEADER + '":' + json.dumps(meta, separators=(",", ":")) + "," + body[1:]


def reseal_redis_session(store: RedisCheckpointStore, session_id: str) -> int:
    """RedisStore: write every stored value of the session again, sealed under the codec's first key to its place
    (issue #31, `lousho reseal`), in one MULTI/EXEC on the session's keys (WATCHed: a save in between
    makes it read again); how many values. A value the codec cannot read raises, nothing written."""
    import redis  # here: SqlStore and the mapping store import this module, and nothing of theirs imports redis

    from lousho.stores.redis_common import redis_errors

    head_key, messages_key, history_key = store.keys.session_keys(session_id)
    with redis_errors(store.client, f"re-seal session {session_id!r}"), store.client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(head_key, messages_key, history_key)  # type: ignore[no-untyped-call]
                head = cast(bytes | None, pipe.get(head_key))
                entries = cast(list[bytes], pipe.lrange(history_key, 0, -1))
                listed = cast(list[bytes], pipe.lrange(messages_key, 0, -1))
                records: list[tuple[str | bytes, bool]] = [(head, False)] if head is not None else []
                records += [(e, True) for e in entries]
                resealed = reseal_redis_records(session_id, store.codec, records, listed)
                new = iter(resealed.records)
                pipe.multi()
                for position, data in resealed.messages.items():
                    pipe.lset(messages_key, position, data)
                if head is not None:
                    pipe.set(head_key, next(new), keepttl=True)
                for index, data in enumerate(new):
                    pipe.lset(history_key, index, data)
                pipe.execute()
                break
            except redis.WatchError:
                continue
    store.reader.cache.drop(session_id)  # the reader shares the store's cache
    return len(resealed.records) + len(resealed.messages)
