"""`PayloadCodec`: compression and encryption of what a store holds, with key ids so keys rotate (issue #17),
each sealed value bound to its place (issue #31).

```python
codec = PayloadCodec(compress=True, keys={"k2": key2, "k1": key1})   # the first key writes, all read
store = RedisStore("redis://localhost:6379/0", codec=codec)           # every store takes codec=
```

Off by default: a store without `codec=` writes plain JSON as before, and reads plain JSON and
compressed-only values. A store with keys reads only values sealed under one of them to their place:
a plain, compressed-only or lousho 0.1 value is refused (`UnsealedValueError`) unless the codec has
`read_unsealed=True`, the setting that migrates old data (`lousho reseal`, docs/stores.md).

An encoded value is `MAGIC | format | flags | key id length | key id | [nonce | ciphertext+tag]`.
Format 2 (issue #31): AES-GCM's associated data is that header plus the value's place (`Place`:
the store's identity, the session id, the part: head, message n, history entry, approval, tool
result), and for a head its plain fields and message count: a value moved, swapped or replayed
elsewhere, or a head whose plain fields were edited, does not open (`SealedValueMismatchError`).
Format 1 (lousho 0.1) bound the header alone. Stores that keep text (SQL, files, mappings, the JSON
of a head) hold `$lz:` + base64 of it. Inflating is bounded by `max_payload_bytes`.

The secret boundary: message contents, tool arguments and results, pending input, business state,
the agent's fingerprint and run config, and approval snapshots are encoded. A checkpoint's head keeps
in plain JSON what stores and the fleet's Lua scripts read without decoding (`PLAIN_FIELDS`: ids,
version, status, step numbers, token usage), plus the store header (versions, writer ids, segments,
save times); the sealed rest is the head's `"$sealed"` field, which vouches for the plain fields.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os
from collections.abc import Mapping
from typing import Any

from lousho.checkpoint import Checkpoint
from lousho.errors import (
    ConfigurationError,
    PayloadDecodeError,
    PayloadKeyError,
    SealedValueMismatchError,
    UnsealedValueError,
)
from lousho.stores.codec_parts import (
    HEAD,
    MAX_PAYLOAD_BYTES,
    NOWHERE,
    Place,
    _deflate,
    _inflate,
    _Zstd,
    approval_place,
    cipher_of,
    head_covers,
    history_part,
    message_place,
    parse_keys,
    result_place,
)

__all__ = [
    "HEAD",
    "MAX_PAYLOAD_BYTES",
    "NOWHERE",
    "PLAIN",
    "PLAIN_FIELDS",
    "SEALED",
    "PayloadCodec",
    "Place",
    "approval_place",
    "history_part",
    "message_place",
    "parse_keys",
    "result_place",
]

MAGIC = b"\xa7lz"
FORMAT = 2
"""2: the associated data names the value's place (issue #31); 1 (lousho 0.1): the header alone."""
TEXT_MARK = "$lz:"
SEALED = "$sealed"
_COMPRESSED = 1
_ENCRYPTED = 2
_ZSTD = 4
_NONCE_BYTES = 12
_NOT_COVERED = frozenset({SEALED, "$store", "messages"})
"""A head's fields its sealed part does not vouch for: itself, the store header (the store's own), the messages."""
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
    """Compression (zlib or zstd) and AES-GCM encryption of stored payloads; one instance per store.

    - `compress`: compress each payload of 256 bytes or more (kept plain when that would not make it
      smaller): True or `"zlib"` (the standard library's deflate), `"zstd"` (Zstandard: faster, `pip install 'lousho[zstd]'`; docs/bench/codec.md). A store reads both either way
      (a zstd payload needs `zstandard` installed).
    - `keys`: key id -> AES key (16, 24 or 32 bytes). The first entry encrypts new writes; every entry
      decrypts. Rotating: add the new key first, `lousho reseal --all`, then drop the old one
      (docs/stores.md). Needs `cryptography` (`pip install 'lousho[encryption]'`).
    - `read_unsealed`: with keys, also read values not sealed to their place (plain JSON, compressed
      only, lousho 0.1's encryption): only to migrate old data, then re-seal it (issue #31).
    - `max_payload_bytes`: the most a compressed value may inflate to (`PayloadTooLargeError` past it).
    - `store`: the store's identity in each value's associated data (stores set it: `for_store`).
    """

    def __init__(
        self,
        *,
        compress: bool | str = False,
        keys: Mapping[str, bytes] | None = None,
        read_unsealed: bool = False,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        store: str = "",
    ) -> None:
        if compress not in (False, True, "zlib", "zstd"):
            raise ConfigurationError(f"compress must be True, False, 'zlib' or 'zstd', not {compress!r}")
        if max_payload_bytes <= 0:
            raise ConfigurationError(f"max_payload_bytes must be more than 0, not {max_payload_bytes}")
        self.compress = compress
        self._zstd = _Zstd() if compress == "zstd" else None
        self.keys = dict(keys or {})
        self.read_unsealed = read_unsealed
        self.max_payload_bytes = max_payload_bytes
        self.store = store
        self._ciphers = {key_id: cipher_of(key_id, key) for key_id, key in self.keys.items()}
        self._write_key = next(iter(self.keys), None)
        self._writer = None if self._write_key is None else self._ciphers[self._write_key]
        self._active = bool(compress) or self._write_key is not None
        self._strict = bool(self.keys) and not read_unsealed
        # The header of each kind of write (compressed or not), made once: a save encodes a few payloads.
        key_id = (self._write_key or "").encode()
        encrypted = _ENCRYPTED if self._write_key is not None else 0
        packed = _ZSTD if compress == "zstd" else _COMPRESSED
        self._headers = {flag: MAGIC + bytes((FORMAT, flag | encrypted, len(key_id))) + key_id for flag in (0, packed)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PayloadCodec:
        """The codec the environment names: `LOUSHO_PAYLOAD_KEYS` (`k2:<base64>,k1:<base64>`, the first
        writes), `LOUSHO_PAYLOAD_COMPRESS` (`1`/`true`/`zlib`/`zstd`), `LOUSHO_PAYLOAD_READ_UNSEALED=1`
        (migrating, issue #31) and `LOUSHO_PAYLOAD_MAX_BYTES`; none set: off (`PLAIN`). How the CLI,
        `LoushoSettings` and store URLs turn it on (issue #17)."""
        env = os.environ if environ is None else environ
        keys = parse_keys(env.get("LOUSHO_PAYLOAD_KEYS", ""))
        said = env.get("LOUSHO_PAYLOAD_COMPRESS", "").strip().lower()
        compress: bool | str = said if said in ("zlib", "zstd") else said in ("1", "true", "yes", "on")
        unsealed = env.get("LOUSHO_PAYLOAD_READ_UNSEALED", "").strip().lower() in ("1", "true", "yes", "on")
        limit = env.get("LOUSHO_PAYLOAD_MAX_BYTES", "").strip()
        if not (keys or compress or limit):
            return PLAIN
        try:
            max_bytes = int(limit) if limit else MAX_PAYLOAD_BYTES
        except ValueError:
            raise ConfigurationError(f"LOUSHO_PAYLOAD_MAX_BYTES must be a number of bytes, not {limit!r}") from None
        return cls(compress=compress, keys=keys, read_unsealed=unsealed, max_payload_bytes=max_bytes)

    def for_store(self, store: str) -> PayloadCodec:
        """This codec for the store named `store` (its key prefix or schema): the identity its values are
        bound to (issue #31). Shares the keys; a store calls it once."""
        bound = copy.copy(self)
        bound.store = store
        return bound

    @property
    def active(self) -> bool:
        """Whether writes are encoded (a codec that is off still reads encoded values it can open)."""
        return self._active

    @property
    def encrypts(self) -> bool:
        return self._write_key is not None

    @property
    def reads_plain(self) -> bool:
        """Whether a plain (unsealed) value reads as it is: no keys, or a migration setting that allows it."""
        return not self._strict

    def __repr__(self) -> str:  # never the keys themselves
        return f"PayloadCodec(compress={self.compress}, key_ids={list(self.keys)})"

    # -- bytes --------------------------------------------------------------------------------

    def encode(self, plain: bytes, place: Place = NOWHERE) -> bytes:
        """`plain` as stored: itself when the codec is off, else header + (compressed, encrypted) body,
        the encryption bound to `place` (issue #31)."""
        if not self._active:
            return plain
        flag, body = self._pack(plain)
        if self._writer is None:  # compression only: a payload it did not shrink stays plain JSON
            return self._headers[flag] + body if flag else plain
        return self._encrypt(flag, body, place)

    def _pack(self, plain: bytes) -> tuple[int, bytes]:
        if self.compress and len(plain) >= _MIN_COMPRESS_BYTES:
            packed = self._zstd.compress(plain) if self._zstd else _deflate(plain)
            if len(packed) < len(plain):
                return (_ZSTD if self._zstd else _COMPRESSED), packed
        return 0, plain

    def _encrypt(self, flag: int, body: bytes, place: Place) -> bytes:
        assert self._writer is not None
        header = self._headers[flag]
        nonce = os.urandom(_NONCE_BYTES)
        sealed: bytes = self._writer.encrypt(nonce, body, header + place.associated(self.store))
        return header + nonce + sealed

    def decode(self, stored: bytes, place: Place = NOWHERE) -> bytes:
        """The plain payload of a stored value read at `place`; a value without the header is plain
        already (refused by a codec with keys, unless `read_unsealed`)."""
        if not stored.startswith(MAGIC):
            self._refuse_unsealed(place, "it is plain JSON")
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
            key_id = header[len(MAGIC) + 3 :].decode(errors="replace")
            if version < 2:  # lousho 0.1: the header alone was bound, not the place
                self._refuse_unsealed(place, "it was encrypted by lousho 0.1, without its place")
                body = self._decrypt(key_id, header, body, place)
            else:
                body = self._decrypt(key_id, header + place.associated(self.store), body, place)
        else:
            self._refuse_unsealed(place, "it is compressed but not encrypted")
        if flags & _COMPRESSED:
            body = _inflate(body, self.max_payload_bytes)
        elif flags & _ZSTD:
            body = (self._zstd or _Zstd()).decompress(body, self.max_payload_bytes)
        return body

    def _refuse_unsealed(self, place: Place, how: str) -> None:
        if not self._strict:
            return
        raise UnsealedValueError(
            f"{place.describe()} is not sealed under a key ({how}), but this store has keys "
            f"({', '.join(repr(k) for k in self.keys)}): anyone who can write to the store could have written it, "
            "so it is refused and nothing is written. Data stored before the keys were set: open the store with "
            "PayloadCodec(read_unsealed=True) (LOUSHO_PAYLOAD_READ_UNSEALED=1) and run `lousho reseal --all` "
            "(docs/stores.md)",
            part=place.part,
            session_id=place.session,
        )

    def _decrypt(self, key_id: str, associated: bytes, body: bytes, place: Place) -> bytes:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            held = ", ".join(repr(k) for k in self.keys) or "none"
            raise PayloadKeyError(
                f"a stored payload is encrypted with key id {key_id!r}, which this store does not have "
                f"(its key ids: {held}); pass that key in PayloadCodec(keys={{{key_id!r}: ...}})"
            )
        from cryptography.exceptions import InvalidTag

        try:
            plain: bytes = cipher.decrypt(body[:_NONCE_BYTES], body[_NONCE_BYTES:], associated)
        except InvalidTag:
            raise SealedValueMismatchError(
                f"{place.describe()}: its value under key id {key_id!r} does not open with this store's key of "
                "that id at this place: it was moved, swapped or replayed from another session, position or "
                "store, or altered (its plain fields too, for a head), or the key under that id is wrong. "
                "Nothing was written; restore the value, or delete the session",
                key_id=key_id,
                part=place.part,
                session_id=place.session,
            ) from None
        return plain

    # -- text ---------------------------------------------------------------------------------

    def encode_text(self, plain: str, place: Place = NOWHERE) -> str:
        """`plain` as text a text column, a JSON line or a JSON string can hold."""
        encoded = self.encode(plain.encode(), place) if self._active else b""
        if not encoded.startswith(MAGIC):  # off, or a payload compression did not shrink: plain JSON
            return plain
        return TEXT_MARK + base64.b64encode(encoded).decode("ascii")

    def decode_text(self, stored: str | bytes, place: Place = NOWHERE) -> str:
        """The plain text of a stored value (text or bytes, encoded as text, as bytes, or plain)."""
        raw = stored.encode() if isinstance(stored, str) else stored
        if raw.startswith(TEXT_MARK.encode()):
            try:
                raw = base64.b64decode(raw[len(TEXT_MARK) :], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise PayloadDecodeError("a stored payload's text is not base64; it is damaged") from exc
        elif not raw.startswith(MAGIC):
            self._refuse_unsealed(place, "it is plain JSON")
            return stored if isinstance(stored, str) else stored.decode(errors="replace")
        return self.decode(raw, place).decode(errors="replace")

    def encode_json(self, plain_json: str, place: Place = NOWHERE) -> str | bytes:
        """A JSON document as bytes where the store keeps bytes (Redis): the codec's binary form."""
        return self.encode(plain_json.encode(), place) if self._active else plain_json

    # -- checkpoint heads ---------------------------------------------------------------------

    def seal_head(self, checkpoint: Checkpoint, session_id: str | None = None) -> str:
        """The checkpoint's JSON without messages: `PLAIN_FIELDS` as they are, the rest in `"$sealed"`,
        bound to the head of `session_id` (default: the checkpoint's)."""
        return self.seal_record(checkpoint, session_id, history=False)[0]

    def seal_record(self, checkpoint: Checkpoint, session_id: str | None = None, *, history: bool = True) -> list[str]:
        """The head of a save, then (with `history`) its history entry: the same JSON, the sealed part bound
        once to the head and once to the history entry of its version (issue #31; one string twice when
        nothing is encrypted). The sealed part vouches for the plain fields and the message count."""
        session = checkpoint.session_id if session_id is None else session_id
        count = 2 if history else 1
        if not self._active:
            return [checkpoint.model_dump_json(exclude={"messages"})] * count
        secret = checkpoint.model_dump_json(exclude=_SECRET_EXCLUDES)
        if self._writer is None and len(secret) < _MIN_COMPRESS_BYTES:  # no key, and too small to compress
            return [checkpoint.model_dump_json(exclude={"messages"})] * count
        flag, body = self._pack(secret.encode())
        plain = checkpoint.model_dump_json(include=_PLAIN_INCLUDES)
        if self._writer is None:
            if not flag:  # no key, and compression did not shrink it: the head as it is
                return [checkpoint.model_dump_json(exclude={"messages"})] * count
            sealed = TEXT_MARK + base64.b64encode(self._headers[flag] + body).decode("ascii")
            return [plain[:-1] + ',"' + SEALED + '":"' + sealed + '"}'] * count  # base64: nothing to escape
        covers = head_covers(json.loads(plain), len(checkpoint.messages))
        parts = [HEAD, history_part(checkpoint.version)][:count]
        out = []
        for part in parts:
            encrypted = self._encrypt(flag, body, Place(session, part, covers))
            out.append(plain[:-1] + ',"' + SEALED + '":"' + TEXT_MARK + base64.b64encode(encrypted).decode() + '"}')
        return out

    def open_fields(
        self, data: dict[str, Any], session_id: str = "", *, history: bool = False, count: int | None = None
    ) -> dict[str, Any]:
        """A head's JSON fields with its `"$sealed"` part opened and merged back (the dict is changed).

        Read as the head of `session_id`, or (`history`) as the history entry of its version; `count`:
        the messages it names (default: its inline `messages`), which the sealed part vouches for."""
        sealed = data.pop(SEALED, None)
        part = history_part(data.get("version")) if history else HEAD
        if sealed is None:
            self._refuse_unsealed(Place(session_id, part), "its fields are plain JSON")
            return data
        if not isinstance(sealed, str):
            raise PayloadDecodeError("a stored head's sealed part is not text; it is damaged")
        if count is None and isinstance(data.get("messages"), list):
            count = len(data["messages"])
        covers = head_covers({k: v for k, v in data.items() if k not in _NOT_COVERED}, count) if self.keys else b""
        try:
            secret = json.loads(self.decode_text(sealed, Place(session_id, part, covers)))
        except ValueError as exc:
            raise PayloadDecodeError("a stored head's sealed part is not JSON once decoded; it is damaged") from exc
        if not isinstance(secret, dict):
            raise PayloadDecodeError("a stored head's sealed part is not a JSON object; it is damaged")
        data.update(secret)
        return data


PLAIN = PayloadCodec()
"""The codec of a store given none: writes plain JSON, reads plain and compressed-only values, and names
the key an encrypted value needs."""
