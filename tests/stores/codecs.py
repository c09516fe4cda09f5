"""The payload codec the store contract runs with (issue #17): compression and AES-GCM under a key id."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import redis

from lousho.stores.codec import PayloadCodec

KEY_1 = bytes(range(32))
KEY_2 = bytes(range(100, 132))
CODEC = PayloadCodec(compress=True, keys={"k1": KEY_1})
"""Compression and encryption, on: what `+codec` contract runs give every store they make."""


def with_codec(factory: Callable[..., Any], codec: PayloadCodec = CODEC) -> Callable[..., Any]:
    """`factory` whose stores get `codec` unless a test passes its own."""
    return lambda **options: factory(**{"codec": codec, **options})


def codec_params(backends: list[str]) -> list[str]:
    """Each backend as it is and with the codec on (`<backend>+codec`)."""
    return [*backends, *(f"{backend}+codec" for backend in backends)]


def raw_values(client: redis.Redis, *, skip_prefix: str | None = None) -> Iterator[tuple[bytes, bytes]]:
    """Every key of the Redis (SCAN) with each value it holds, read by the key's type: GET, LRANGE,
    HGETALL (fields and values), SMEMBERS, ZRANGE, XRANGE. Not DUMP: its RDB form may LZF-compress a
    string, which would hide a plaintext from a grep. `skip_prefix`: keys not to read (a test's probes)."""
    for key in client.scan_iter(count=1000):
        if skip_prefix is not None and key.startswith(skip_prefix.encode()):
            continue
        kind = client.type(key)
        parts: list[bytes] = []
        if kind == b"string":
            parts = [client.get(key) or b""]
        elif kind == b"list":
            parts = list(client.lrange(key, 0, -1))
        elif kind == b"hash":
            parts = [b for pair in client.hgetall(key).items() for b in pair]
        elif kind == b"set":
            parts = list(client.smembers(key))
        elif kind == b"zset":
            parts = list(client.zrange(key, 0, -1))
        elif kind == b"stream":
            parts = [b for _, fields in client.xrange(key) for pair in fields.items() for b in pair]
        for part in parts:
            yield key, part


def holding(client: redis.Redis, secret: str, *, skip_prefix: str | None = None) -> list[bytes]:
    """The keys one of whose values (or its name) holds `secret` in plain bytes."""
    needle = secret.encode()
    return sorted(
        {key for key, value in raw_values(client, skip_prefix=skip_prefix) if needle in value or needle in key}
    )
