"""The mapping store's view of a user's mapping: text in, text out, and its key names (issue #16).

A `dict` holds what it is given, but `dbm` hands back bytes for str keys and values, and `shelve`
pickles whatever it is given: `TextMapping` lets the store read and write `str` whatever the mapping
does with them. `Prefixed` is the part of it under one key prefix (the approvals), as a mapping of
its own, so `MemoryApprovalStore` keeps its snapshots there unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MappingKeys", "Prefixed", "TextMapping"]


def _text(value: Any) -> str:
    """A stored value as text; bytes that are not UTF-8 keep their bytes as escapes, so a damaged record
    reads as 'not JSON' (`CorruptCheckpointError`) rather than failing the store."""
    return bytes(value).decode(errors="surrogateescape") if isinstance(value, (bytes, bytearray)) else str(value)


class TextMapping(MutableMapping[str, str]):
    """`mapping` with str keys and values: bytes it returns (dbm) are decoded as UTF-8."""

    def __init__(self, mapping: MutableMapping[Any, Any]) -> None:
        self.mapping = mapping

    def __getitem__(self, key: str) -> str:
        return _text(self.mapping[key])

    def __setitem__(self, key: str, value: str) -> None:
        self.mapping[key] = value

    def __delitem__(self, key: str) -> None:
        del self.mapping[key]

    def __iter__(self) -> Iterator[str]:
        return (_text(key) for key in list(self.mapping.keys()))

    def __len__(self) -> int:
        return len(self.mapping)

    def __contains__(self, key: object) -> bool:
        return key in self.mapping

    def under(self, prefix: str) -> Iterator[str]:
        """The keys that start with `prefix`, each without it (a scan of every key: mappings have no range)."""
        return (key[len(prefix) :] for key in self if key.startswith(prefix))

    def sync(self) -> None:
        """Write through what the mapping buffers (`shelve` and `dbm` have `sync()`; a dict has nothing to do).

        Every change the store makes ends with it, so a process that exits without closing the
        mapping loses nothing it was told was saved (dbm.dumb writes its index only on sync)."""
        flush: Callable[[], object] | None = getattr(self.mapping, "sync", None)
        if flush is not None:
            flush()


class Prefixed(MutableMapping[str, str]):
    """The keys of `mapping` under `prefix`, without it; each change is synced."""

    def __init__(self, mapping: TextMapping, prefix: str) -> None:
        self._mapping = mapping
        self._prefix = prefix

    def __getitem__(self, key: str) -> str:
        return self._mapping[self._prefix + key]

    def __setitem__(self, key: str, value: str) -> None:
        self._mapping[self._prefix + key] = value
        self._mapping.sync()

    def __delitem__(self, key: str) -> None:
        del self._mapping[self._prefix + key]
        self._mapping.sync()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._mapping.under(self._prefix)))

    def __len__(self) -> int:
        return sum(1 for _ in self._mapping.under(self._prefix))


@dataclass(frozen=True)
class MappingKeys:
    """Key names under one prefix. Session ids cannot hold `/` (`validate_session_id`), so `/` ends them."""

    prefix: str = "lousho:"

    @property
    def heads(self) -> str:
        return f"{self.prefix}cp/"

    def head(self, session_id: str) -> str:
        """The latest checkpoint's head: the checkpoint without its messages, naming the ones it uses."""
        return f"{self.heads}{session_id}"

    def history(self, session_id: str) -> str:
        """The history ring: one JSON entry per line, newest first."""
        return f"{self.prefix}hist/{session_id}"

    def message(self, session_id: str, position: int) -> str:
        """One message of the session's append-only transcript, by position."""
        return f"{self.prefix}msg/{session_id}/{position}"

    @property
    def approvals(self) -> str:
        return f"{self.prefix}approval/"
