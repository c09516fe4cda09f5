"""`PayloadCodec`: compression and encryption of what a store holds, with key ids so keys rotate (issue #17).

```python
codec = PayloadCodec(compress=True, keys={"k2": key2, "k1": key1})   # the first key writes, all read
store = RedisStore("redis://localhost:6379/0", codec=codec)           # every store takes codec=
```

Off by default: a store without `codec=` writes plain JSON as before. A store reads both: a value
without the codec's header is plain JSON (written before the codec was turned on, or by a store
without it), so turning the codec on needs no migration (mixed reading).

An encoded value is `MAGIC | version | flags | key id length | key id | [nonce | ciphertext+tag]`,
the header bound to the ciphertext as AES-GCM's associated data. Stores that keep text (SQL, files,
mappings, the JSON of a head) hold `$lz:` + base64 of it.

The secret boundary: message contents, tool arguments and results, pending input, business state,
the agent's fingerprint and run config, and approval snapshots are encoded. A checkpoint's head keeps
in plain JSON what stores and the fleet's Lua scripts read without decoding (`PLAIN_FIELDS`: ids,
version, status, step numbers, token usage), plus the store header (versions, writer ids, segments,
save times); the sealed rest is the head's `"$sealed"` field.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
import zlib
from collections.abc import Mapping
from typing import Any

from lousho.checkpoint import Checkpoint
from lousho.errors import ConfigurationError, PayloadDecodeError, PayloadKeyError

__all__ = ["PLAIN", "PLAIN_FIELDS", "SEALED", "PayloadCodec", "parse_keys"]

MAGIC = b"\xa7lz"
FORMAT = 1
TEXT_MARK = "$lz:"
SEALED = "$sealed"
_COMPRESSED = 1
_ENCRYPTED = 2
_ZSTD = 4
_NONCE_BYTES = 12
_MIN_COMPRESS_BYTES = 256  # below this, deflate saves a few bytes for more time than the save's round trip
PLAIN_FIELDS = frozenset(
    {
        "schema_version",
        "session_id",
        "version",
        "status",
        "finish_reason",
        "agent_name",
        "step_index",
        "usage",
        "run_start",
        "run_input_count",
        "approval_id",
        "parent_session_id",
    }
)
"""Checkpoint fields a head keeps in plain JSON: no secret, read by listings, prune and the Lua scripts."""
_PLAIN_INCLUDES = set(PLAIN_FIELDS)
_SECRET_EXCLUDES = {"messages", *PLAIN_FIELDS}


class PayloadCodec:
    """Compression (zlib) and AES-GCM encryption of stored payloads; one instance per store.

    - `compress`: compress each payload of 256 bytes or more (kept plain when that would not make it
      smaller): True or `"zlib"` (the standard library's deflate), `"zstd"` (Zstandard: faster, `pip install 'lousho[zstd]'`; docs/bench/codec.md). A store reads both either way
      (a zstd payload needs `zstandard` installed).
    - `keys`: key id -> AES key (16, 24 or 32 bytes). The first entry encrypts new writes; every entry
      decrypts. Rotating: add the new key first, keep the old ones while data written under them is
      stored (docs/stores.md). Needs `cryptography` (`pip install 'lousho[encryption]'`).
    """

    def __init__(self, *, compress: bool | str = False, keys: Mapping[str, bytes] | None = None) -> None:
        if compress not in (False, True, "zlib", "zstd"):
            raise ConfigurationError(f"compress must be True, False, 'zlib' or 'zstd', not {compress!r}")
        self.compress = compress
        self._zstd = _Zstd() if compress == "zstd" else None
        self.keys = dict(keys or {})
        self._ciphers = {key_id: _cipher(key_id, key) for key_id, key in self.keys.items()}
        self._write_key = next(iter(self.keys), None)
        self._writer = None if self._write_key is None else self._ciphers[self._write_key]
        self._active = bool(compress) or self._write_key is not None
        # The header of each kind of write (compressed or not), made once: a save encodes a few payloads.
        key_id = (self._write_key or "").encode()
        encrypted = _ENCRYPTED if self._write_key is not None else 0
        packed = _ZSTD if compress == "zstd" else _COMPRESSED
        self._headers = {flag: MAGIC + bytes((FORMAT, flag | encrypted, len(key_id))) + key_id for flag in (0, packed)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PayloadCodec:
        """The codec the environment names: `LOUSHO_PAYLOAD_KEYS` (`k2:<base64>,k1:<base64>`, the first
        writes) and `LOUSHO_PAYLOAD_COMPRESS` (`1`/`true`); neither set: off (`PLAIN`). How the CLI,
        `LoushoSettings` and store URLs turn it on (issue #17)."""
        env = os.environ if environ is None else environ
        keys = parse_keys(env.get("LOUSHO_PAYLOAD_KEYS", ""))
        said = env.get("LOUSHO_PAYLOAD_COMPRESS", "").strip().lower()
        compress: bool | str = said if said in ("zlib", "zstd") else said in ("1", "true", "yes", "on")
        return cls(compress=compress, keys=keys) if keys or compress else PLAIN

    @property
    def active(self) -> bool:
        """Whether writes are encoded (a codec that is off still reads encoded values it can open)."""
        return self._active

    @property
    def encrypts(self) -> bool:
        return self._write_key is not None

    def __repr__(self) -> str:  # never the keys themselves
        return f"PayloadCodec(compress={self.compress}, key_ids={list(self.keys)})"

    # -- bytes --------------------------------------------------------------------------------

    def encode(self, plain: bytes) -> bytes:
        """`plain` as stored: itself when the codec is off, else header + (compressed, encrypted) body."""
        if not self._active:
            return plain
        flag, body = 0, plain
        if self.compress and len(plain) >= _MIN_COMPRESS_BYTES:
            packed = self._zstd.compress(plain) if self._zstd else _deflate(plain)
            if len(packed) < len(plain):
                flag, body = (_ZSTD if self._zstd else _COMPRESSED), packed
        if self._writer is None:  # compression only: a payload it did not shrink stays plain JSON
            return self._headers[flag] + body if flag else plain
        header = self._headers[flag]
        nonce = os.urandom(_NONCE_BYTES)
        sealed: bytes = self._writer.encrypt(nonce, body, header)
        return header + nonce + sealed

    def decode(self, stored: bytes) -> bytes:
        """The plain payload of a stored value; a value without the header is plain already."""
        if not stored.startswith(MAGIC):
            return stored
        if len(stored) < len(MAGIC) + 3:
            raise PayloadDecodeError("a stored payload is cut short (its codec header is incomplete)")
        version, flags, id_length = stored[len(MAGIC) : len(MAGIC) + 3]
        if version > FORMAT:
            raise PayloadDecodeError(
                f"a stored payload was encoded by a newer lousho (codec format {version}); upgrade"
            )
        start = len(MAGIC) + 3 + id_length
        header, body = stored[:start], stored[start:]
        if flags & _ENCRYPTED:
            body = self._decrypt(header[len(MAGIC) + 3 :].decode(errors="replace"), header, body)
        if flags & _COMPRESSED:
            try:
                body = zlib.decompress(body, -15)
            except zlib.error as exc:
                raise PayloadDecodeError(f"a stored payload does not decompress ({exc}); it is damaged") from exc
        elif flags & _ZSTD:
            body = (self._zstd or _Zstd()).decompress(body)
        return body

    def _decrypt(self, key_id: str, header: bytes, body: bytes) -> bytes:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            held = ", ".join(repr(k) for k in self.keys) or "none"
            raise PayloadKeyError(
                f"a stored payload is encrypted with key id {key_id!r}, which this store does not have "
                f"(its key ids: {held}); pass that key in PayloadCodec(keys={{{key_id!r}: ...}})"
            )
        from cryptography.exceptions import InvalidTag

        try:
            plain: bytes = cipher.decrypt(body[:_NONCE_BYTES], body[_NONCE_BYTES:], header)
        except InvalidTag:
            raise PayloadKeyError(
                f"a stored payload encrypted with key id {key_id!r} does not open with this store's key of that "
                "id: the key is wrong (check the key configured under that id) or the value was altered"
            ) from None
        return plain

    # -- text ---------------------------------------------------------------------------------

    def encode_text(self, plain: str) -> str:
        """`plain` as text a text column, a JSON line or a JSON string can hold."""
        encoded = self.encode(plain.encode()) if self._active else b""
        if not encoded.startswith(MAGIC):  # off, or a payload compression did not shrink: plain JSON
            return plain
        return TEXT_MARK + base64.b64encode(encoded).decode("ascii")

    def decode_text(self, stored: str | bytes) -> str:
        """The plain text of a stored value (text or bytes, encoded as text, as bytes, or plain)."""
        raw = stored.encode() if isinstance(stored, str) else stored
        if raw.startswith(TEXT_MARK.encode()):
            try:
                raw = base64.b64decode(raw[len(TEXT_MARK) :], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise PayloadDecodeError("a stored payload's text is not base64; it is damaged") from exc
        elif not raw.startswith(MAGIC):
            return stored if isinstance(stored, str) else stored.decode(errors="replace")
        return self.decode(raw).decode(errors="replace")

    def encode_json(self, plain_json: str) -> str | bytes:
        """A JSON document as bytes where the store keeps bytes (Redis): the codec's binary form."""
        return self.encode(plain_json.encode()) if self._active else plain_json

    # -- checkpoint heads ---------------------------------------------------------------------

    def seal_head(self, checkpoint: Checkpoint) -> str:
        """The checkpoint's JSON without messages: `PLAIN_FIELDS` as they are, the rest in `"$sealed"`."""
        if not self._active:
            return checkpoint.model_dump_json(exclude={"messages"})
        secret = checkpoint.model_dump_json(exclude=_SECRET_EXCLUDES)
        if self._writer is None and len(secret) < _MIN_COMPRESS_BYTES:  # no key, and too small to compress
            return checkpoint.model_dump_json(exclude={"messages"})
        sealed = self.encode_text(secret)
        if not sealed.startswith(TEXT_MARK):  # no key, and compression did not shrink it: the head as it is
            return checkpoint.model_dump_json(exclude={"messages"})
        plain = checkpoint.model_dump_json(include=_PLAIN_INCLUDES)
        return plain[:-1] + ',"' + SEALED + '":"' + sealed + '"}'  # base64: nothing to escape

    def open_fields(self, data: dict[str, Any]) -> dict[str, Any]:
        """A head's JSON fields with its `"$sealed"` part opened and merged back (the dict is changed)."""
        sealed = data.pop(SEALED, None)
        if sealed is None:
            return data
        if not isinstance(sealed, str):
            raise PayloadDecodeError("a stored head's sealed part is not text; it is damaged")
        try:
            secret = json.loads(self.decode_text(sealed))
        except ValueError as exc:
            raise PayloadDecodeError("a stored head's sealed part is not JSON once decoded; it is damaged") from exc
        if not isinstance(secret, dict):
            raise PayloadDecodeError("a stored head's sealed part is not a JSON object; it is damaged")
        data.update(secret)
        return data


PLAIN = PayloadCodec()
"""The codec of a store given none: writes plain JSON, reads plain and compressed-only values, and names
the key an encrypted value needs."""


def _deflate(plain: bytes) -> bytes:
    """Raw deflate (zlib's format without its header and checksum: AES-GCM's tag or the JSON parse catches
    damage) at level 1 (on a message of a few KB, level 6 saves ~3% more bytes for ~40% more time), with a
    window no larger than the payload: zlib allocates and clears its window and hash tables per call,
    which costs more than compressing a small message (issue #17: the save overhead in
    docs/bench/codec.md). Any window up to 2**15 decompresses with wbits -15."""
    wbits = min(15, max(9, (len(plain) - 1).bit_length()))
    packer = zlib.compressobj(1, zlib.DEFLATED, -wbits, min(8, max(1, wbits - 7)))
    return packer.compress(plain) + packer.flush()


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

    def decompress(self, packed: bytes) -> bytes:
        unpacker = getattr(self._local, "unpacker", None)
        if unpacker is None:
            unpacker = self._local.unpacker = self._module.ZstdDecompressor()
        try:
            plain: bytes = unpacker.decompress(packed)
        except self._module.ZstdError as exc:
            raise PayloadDecodeError(f"a stored payload does not decompress ({exc}); it is damaged") from exc
        return plain


def _cipher(key_id: str, key: bytes) -> Any:
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
