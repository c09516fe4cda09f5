"""Store URLs: which store bundle a URL's scheme opens (issue #16).

`LOUSHO_STORE_URL` (and `lousho --store-url`) go through `open_store`: the scheme before `://` (or
before `+`, as in `postgresql+psycopg://`) names an opener, `opener(url, prefix=...) -> StoreBundle`.
A new backend is one module with such an opener, one `register_store` line, and one run of the
contract suite (`lousho.testing.store_contract`). The built-in openers are named as `"module:function"`
and imported on first use, so `import lousho` loads no SQLAlchemy, redis-py or dbm.

```python
from lousho.stores.registry import open_store, register_store

register_store("mystore", "myapp.stores:open_url", example="mystore://bucket")   # or the function itself
store = open_store("mystore://bucket")
```
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from lousho.errors import ConfigurationError
from lousho.redaction import redact_url
from lousho.store_bundle import StoreBundle
from lousho.stores.codec import PayloadCodec

__all__ = ["StoreOpener", "local_path", "open_store", "register_store", "store_schemes"]


class StoreOpener(Protocol):
    """Opens the store a URL names; `prefix` is the key prefix (`LOUSHO_PREFIX`) for stores that use one."""

    def __call__(self, url: str, *, prefix: str = "lousho:") -> StoreBundle: ...


@dataclass(frozen=True)
class _Entry:
    opener: StoreOpener | str
    example: str


_OPENERS: dict[str, _Entry] = {}


def register_store(schemes: str | Iterable[str], opener: StoreOpener | str, *, example: str) -> None:
    """Let `open_store` open URLs of `schemes` with `opener` (a function, or `"module:function"` imported on
    first use); `example` is shown in the error for an unknown URL. A scheme registered again is replaced."""
    for scheme in [schemes] if isinstance(schemes, str) else schemes:
        _OPENERS[scheme.lower()] = _Entry(opener, example)


def store_schemes() -> dict[str, str]:
    """Each registered scheme and its example URL."""
    return {scheme: entry.example for scheme, entry in _OPENERS.items()}


def open_store(url: str, *, prefix: str = "lousho:", codec: PayloadCodec | None = None) -> StoreBundle:
    """The store bundle `url` names; an unknown scheme raises `ConfigurationError` listing the known ones.
    The URL is shown only with its password masked. `codec`: the payload codec (issue #17; None: the one
    `LOUSHO_PAYLOAD_KEYS` / `LOUSHO_PAYLOAD_COMPRESS` name, if any), passed to the opener when it is on."""
    scheme = url.partition("://")[0].lower() if "://" in url else url.partition(":")[0].lower()
    entry = _OPENERS.get(scheme) or _OPENERS.get(scheme.partition("+")[0])
    if entry is None:
        examples = ", ".join(dict.fromkeys(e.example for e in _OPENERS.values()))
        raise ConfigurationError(f"unknown store URL {redact_url(url)!r}: use {examples}")
    opener = _resolve(entry.opener)
    codec = PayloadCodec.from_env() if codec is None else codec
    if codec.active:
        if not _takes_codec(opener):
            raise ConfigurationError(
                f"the store opener of {scheme!r} takes no codec, but LOUSHO_PAYLOAD_KEYS or LOUSHO_PAYLOAD_COMPRESS "
                "turns the payload codec on: give the opener a `codec` keyword, or unset them (issue #17)"
            )
        return opener(url, prefix=prefix, codec=codec)  # type: ignore[call-arg]
    return opener(url, prefix=prefix)


def _takes_codec(opener: StoreOpener) -> bool:
    """Whether `opener` accepts `codec=` (the built-in ones do; one registered before issue #17 may not)."""
    try:
        parameters = inspect.signature(opener).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let the call say
        return True
    return any(p.name == "codec" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _resolve(opener: StoreOpener | str) -> StoreOpener:
    if not isinstance(opener, str):
        return opener
    module, _, name = opener.partition(":")
    found: StoreOpener = getattr(importlib.import_module(module), name)
    return found


def local_path(url: str, scheme: str) -> str:
    """The path of a `scheme://<path>` URL naming a local file or folder (`file:///abs`, `dbm://./rel.db`).

    Such a URL takes no user or password: one would become part of the path, and be shown in it."""
    if redact_url(url) != url:
        raise ConfigurationError(
            f"the store URL {redact_url(url)!r} names a file or folder: it takes no user or password"
        )
    start = f"{scheme}://"
    if not url.lower().startswith(start):
        raise ConfigurationError(f"the store URL {url!r} does not start with {start}: write {start}<path>")
    return url[len(start) :] or "."


register_store(("redis", "rediss", "unix"), "lousho.stores.redis:open_url", example="redis://host:port/db")
register_store("sqlite", "lousho.stores.sql:open_sqlite_url", example="sqlite:///path.db")
register_store(("postgresql", "postgres"), "lousho.stores.sql:open_url", example="postgresql://user@host/db")
register_store("file", "lousho.stores.file:open_url", example="file:///dir")
register_store("dbm", "lousho.stores.mapping:open_url", example="dbm:///path.db")
