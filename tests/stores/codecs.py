"""The payload codec the store contract runs with (issue #17): compression and AES-GCM under a key id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
