"""The parts of `PayloadCodec` that are not the codec itself: where a sealed value belongs (`Place`),
bounded compression, AES keys and how settings carry them (issues #17, #31)."""

from __future__ import annotations

import base64
import binascii
import json
import threading
import zlib
from dataclasses import dataclass
from typing import Any

from lousho.errors import ConfigurationError, PayloadDecodeError, PayloadTooLargeError

__all__ = [
    "HEAD",
    "MAX_PAYLOAD_BYTES",
    "NOWHERE",
    "Place",
    "approval_place",
    "cipher_of",
    "head_covers",
    "history_part",
    "message_place",
    "parse_keys",
    "result_place",
]

MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
"""The most a stored compressed value may inflate to by default (issue #31: 1.3 MB once inflated to 300 MB)."""
HEAD = "head"


@dataclass(frozen=True)
class Place:
    """Where a sealed value belongs (issue #31): the session and the part of it (`HEAD`, `message n`,
    `history entry vN`, `approval <id>`, `result <call>`); `covers`: more the value vouches for (a head's
    plain fields and message count). AES-GCM's associated data names it, with the store's identity, so a
    value read anywhere else does not open."""

    session: str
    part: str
    covers: bytes = b""

    def associated(self, store: str) -> bytes:
        """The associated data after the codec header: store, session and part, then what it covers."""
        named = json.dumps([store, self.session, self.part], ensure_ascii=True, separators=(",", ":"))
        return b"\x00" + named.encode() + b"\x00" + self.covers

    def describe(self) -> str:
        """The place in an error message: "message 3 of session 's'", "approval 'a1'"."""
        if not self.part and not self.session:
            return "a stored payload"
        if not self.session:
            return f"stored {self.part}"
        return f"{self.part} of session {self.session!r}"


NOWHERE = Place("", "")
"""The place of a value a caller stores outside any session part (a custom store's own payloads)."""


def message_place(session_id: str, index: int) -> Place:
    """The place of the message at `index` of a session's transcript (its position in the conversation)."""
    return Place(session_id, f"message {index}")


def history_part(version: object) -> str:
    """The part of a history entry: the save of that version (a ring's positions shift, versions do not)."""
    return f"history entry v{version}"


def approval_place(approval_id: str) -> Place:
    return Place("", f"approval {approval_id!r}")


def result_place(session_id: str, call: str) -> Place:
    """The place of a committed tool result of a session (the fleet's results hash)."""
    return Place(session_id, f"result {call}")


def head_covers(plain_fields: dict[str, Any], count: int | None) -> bytes:
    """What a head's sealed part vouches for: its plain fields (canonical JSON) and its message count."""
    canonical = json.dumps(plain_fields, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return canonical.encode() + b"\x00" + str(count).encode()


def _deflate(plain: bytes) -> bytes:
    """Raw deflate (zlib's format without its header and checksum: AES-GCM's tag or the JSON parse catches
    damage) at level 1 (on a message of a few KB, level 6 saves ~3% more bytes for ~40% more time), with a
    window no larger than the payload: zlib allocates and clears its window and hash tables per call,
    which costs more than compressing a small message (issue #17: the save overhead in
    docs/bench/codec.md). Any window up to 2**15 decompresses with wbits -15."""
    wbits = min(15, max(9, (len(plain) - 1).bit_length()))
    packer = zlib.compressobj(1, zlib.DEFLATED, -wbits, min(8, max(1, wbits - 7)))
    return packer.compress(plain) + packer.flush()


def _too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"a stored payload inflates past {limit} bytes (the codec's max_payload_bytes): refused, nothing changed. "
        "A real payload that large: raise max_payload_bytes (LOUSHO_PAYLOAD_MAX_BYTES); otherwise it was planted"
    )


def _inflate(packed: bytes, limit: int) -> bytes:
    """Raw deflate undone, never past `limit` bytes (issue #31)."""
    unpacker = zlib.decompressobj(-15)
    try:
        plain = unpacker.decompress(packed, limit + 1)
        if len(plain) <= limit and not unpacker.unconsumed_tail:
            plain += unpacker.flush()
    except zlib.error as exc:
        raise PayloadDecodeError(f"a stored payload does not decompress ({exc}); it is damaged") from exc
    if len(plain) > limit or unpacker.unconsumed_tail:
        raise _too_large(limit)
    return plain


class _Zstd:
    """Zstandard at level 1, a compressor and a decompressor per thread (zstandard's are not thread-safe)."""

    def __init__(self) -> None:
        try:
            import zstandard
        except ImportError as exc:
            raise ConfigurationError(
                "zstd payloads need the zstandard package: pip install 'lousho[zstd]' (or compress='zlib')"
            ) from exc
        self._module = zstandard
        self._local = threading.local()

    def compress(self, plain: bytes) -> bytes:
        packer = getattr(self._local, "packer", None)
        if packer is None:
            packer = self._local.packer = self._module.ZstdCompressor(level=1)
        packed: bytes = packer.compress(plain)
        return packed

    def decompress(self, packed: bytes, limit: int) -> bytes:
        """`packed` inflated, reading at most `limit` + 1 bytes out of it (issue #31), whatever the size
        its frame header claims."""
        unpacker = getattr(self._local, "unpacker", None)
        if unpacker is None:
            unpacker = self._local.unpacker = self._module.ZstdDecompressor()
        chunks, size = [], 0
        try:
            with unpacker.stream_reader(packed, read_across_frames=True) as reader:
                while size <= limit:
                    chunk = reader.read(min(1 << 20, limit + 1 - size))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
        except self._module.ZstdError as exc:
            raise PayloadDecodeError(f"a stored payload does not decompress ({exc}); it is damaged") from exc
        if size > limit:
            raise _too_large(limit)
        return b"".join(chunks)


def cipher_of(key_id: str, key: bytes) -> Any:
    if not key_id or len(key_id.encode()) > 255:
        raise ConfigurationError(f"a payload key id must be 1 to 255 bytes of text, not {key_id!r}")
    if not isinstance(key, bytes) or len(key) not in (16, 24, 32):
        raise ConfigurationError(
            f"payload key {key_id!r} must be 16, 24 or 32 bytes (AES-128/192/256); "
            "make one with os.urandom(32) and keep it in your secret store"
        )
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise ConfigurationError(
            "encrypting payloads needs the cryptography package: pip install 'lousho[encryption]'"
        ) from exc
    return AESGCM(key)


def parse_keys(spec: str) -> dict[str, bytes]:
    """`"k2:<base64>,k1:<base64>"` (first writes) as a keys mapping: how settings and URLs carry keys."""
    keys: dict[str, bytes] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key_id, sep, encoded = part.partition(":")
        if not sep:
            raise ConfigurationError(f"a payload key must be written <key id>:<base64 key>, not {key_id!r}...")
        try:
            keys[key_id.strip()] = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigurationError(f"payload key {key_id.strip()!r} is not valid base64") from exc
    return keys
