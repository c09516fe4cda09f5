"""Re-sealing a store's values under the current payload key (issue #31): what `lousho reseal` does, through the
operations layer (issue #32).

Each session's checkpoint, history and messages, and its approvals (pending or decided), are written again under
the first key of the store's codec, each bound to its place (`checkpoints.reseal`, `approvals.reseal`,
`lousho.stores.reseal`), so data from before the keys were set,
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
    approvals: int = 0
    """How many approvals were written again (every approval of the store with `--all`, else the sessions')."""


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
    reseal_approvals = getattr(store.approvals, "reseal", None)
    if not callable(reseal_approvals):
        raise ConfigurationError(f"{type(store.approvals).__name__} cannot re-seal its approvals (no reseal())")
    ids = list(session_ids) if session_ids is not None else list(sync(store.sessions()))
    values = {session_id: int(reseal(session_id)) for session_id in ids}
    # Approvals after the sessions (issue #31): with --all every approval, a decided one of a pruned session too.
    approvals = int(reseal_approvals(None if session_ids is None else set(ids)))
    return ResealedSessions(next(iter(codec.keys)), values, approvals)
