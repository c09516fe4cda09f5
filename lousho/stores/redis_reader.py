"""`CheckpointReader`: how a caller's Lua script reads a RedisStore checkpoint in its own round trip (issue #14),
and how its reply is decoded and checked (issue #31). Apart from `lousho.stores.redis_checkpoints` to keep that
module under ~400 lines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lousho.checkpoint import Checkpoint
from lousho.errors import CorruptCheckpointError, SDKError
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.redis_common import RedisKeys, text
from lousho.stores.redis_records import check_count, decode_record, parse_messages
from lousho.stores.segments import Known, SessionCache

__all__ = ["CheckpointReader"]


@dataclass(frozen=True)
class CheckpointReader:
    """How to read a session's checkpoint inside a caller's own Lua script (`-- needs: read_checkpoint`),
    in that script's round trip: the fleet's scripts read it as they take a lease (issue #14).

    Pass `read_keys(s)` as the script's keys and `cached(s).writer` (or '') as its argument, then hand
    the script's `read_checkpoint()` reply to `from_reply`, which also keeps the store's cache."""

    keys: RedisKeys
    cache: SessionCache
    codec: PayloadCodec = PLAIN
    """Decodes what the store's codec encoded (issue #17)."""

    def cached(self, session_id: str) -> Known | None:
        """What this process holds of the session's last save it made or read (None: nothing)."""
        return self.cache.get(session_id)

    def read_keys(self, session_id: str) -> tuple[str, str]:
        """The keys `read_checkpoint.lua` reads: the head and the messages list."""
        return self.keys.head(session_id), self.keys.messages(session_id)

    def from_reply(self, session_id: str, reply: list[Any], known: Known | None) -> Checkpoint | None:
        """Decode a `read_checkpoint.lua` reply (made with `known.writer`, or '' when `known` is None). One
        that cannot be read raises, and the cache forgets the session: no save builds on it (issue #31)."""
        try:
            return self._from_reply(session_id, reply, known)
        except SDKError:
            self.cache.drop(session_id)
            raise

    def _from_reply(self, session_id: str, reply: list[Any], known: Known | None) -> Checkpoint | None:
        kind = text(reply[0])
        if kind == "none":
            return None
        if kind == "corrupt":
            raise CorruptCheckpointError(session_id, text(reply[1]))
        # 'known': this process holds the transcript of that very save (writer ids are unique).
        messages = (
            list(known.messages) if kind == "known" and known else parse_messages(session_id, reply[2:], self.codec)
        )
        checkpoint, meta = decode_record(
            session_id, reply[1], lambda segments: check_count(session_id, segments, messages), self.codec
        )
        if meta is not None:
            self.cache.put(session_id, Known(checkpoint.version, str(meta["w"]), tuple(checkpoint.messages)))
        return checkpoint
