"""Re-sealing a store's values under the current payload key (issue #31): what `lousho reseal` does, through the
operations layer (issue #32).

Each session's checkpoint, history and messages are written again under the first key of the store's codec,
each bound to its place (`checkpoints.reseal`, `lousho.stores.reseal`), so data from before the keys were set,
from lousho 0.1 or under a key being retired stops depending on `LOUSHO_PAYLOAD_READ_UNSEALED` or on the old key
(docs/stores.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lousho.errors import ConfigurationError
from lousho.operations.target import Target, sync

__all__ = ["ResealedSessions", "reseal_sessions"]


@dataclass(frozen=True)
class ResealedSessions:
    key_id: str
    """The payload key the values were written with (the codec's first)."""
    values: dict[str, int]
    """Session -> how many stored values were written again (messages, head, history entries)."""


def reseal_sessions(target: Target, session_ids: Sequence[str] | None = None) -> ResealedSessions:
    """Re-seal each named session (every session of the store when None). `ConfigurationError` when the store
    has no key to write with, or cannot re-seal its values."""
    store = target.bundle
    codec, checkpoints = getattr(store, "codec", None), store.checkpoints
    if codec is None or not codec.encrypts:
        raise ConfigurationError(
            "re-sealing needs the payload key to write with: set LOUSHO_PAYLOAD_KEYS (the new key first), and "
            "LOUSHO_PAYLOAD_READ_UNSEALED=1 to read data stored before the keys or by lousho 0.1"
        )
    reseal = getattr(checkpoints, "reseal", None)
    if not callable(reseal):
        raise ConfigurationError(f"{type(checkpoints).__name__} cannot re-seal its values (it has no reseal())")
    ids = list(session_ids) if session_ids is not None else list(sync(store.sessions()))
    return ResealedSessions(next(iter(codec.keys)), {session_id: int(reseal(session_id)) for session_id in ids})
