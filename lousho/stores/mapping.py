"""The mapping store: checkpoints, their history and approvals in any mapping of str to str (issue #16).

The Python counterpart of the reference's `LocalStorageCheckpointStore(storage)`: give it a `dict`, a
`shelve` or a `dbm` file (which hands back bytes: read as UTF-8 text), or anything else that is a
`MutableMapping`, and it is a whole store bundle, history ring and fork included.

```python
store = mapping_store({})                          # or memory_store(storage={})
store = mapping_store(shelve.open("runs.shelf"))   # closed by store.close()
store = dbm_store("./.lousho/runs.db")             # what the CLI opens for LOUSHO_STORE_URL=dbm://./.lousho/runs.db
```

Records are JSON text, laid out as `lousho.stores.mapping_checkpoints` says; approvals are
`<prefix>approval/<id>` -> the snapshot's JSON, kept by `MemoryApprovalStore`'s code. The mapping
belongs to one process: its threads may share the store (one lock around every access), but two
processes writing one `shelve` or `dbm` file would damage it; use SqliteStore or FileStore for that.
"""

from __future__ import annotations

import dbm
import os
import threading
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from lousho.errors import StoreUnavailableError
from lousho.store_bundle import SessionsOfCheckpoints
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.mapping_checkpoints import MappingCheckpointStore
from lousho.stores.mapping_keys import MappingKeys, Prefixed, TextMapping
from lousho.stores.memory import MemoryApprovalStore

__all__ = ["MappingApprovalStore", "MappingCheckpointStore", "MappingStore", "dbm_store", "mapping_store", "open_url"]


class MappingApprovalStore(MemoryApprovalStore):
    """Approval snapshots in the mapping, under `<prefix>approval/`; each change is synced."""


class MappingStore(SessionsOfCheckpoints):
    """A store bundle (`lousho.StoreBundle`) in one mapping: `.checkpoints`, `.approvals`, `sessions()`,
    `prune()`, `delete()`.

    - `mapping`: keys and values are str (bytes are read as UTF-8, as `dbm` returns them).
    - `history_limit`: saves kept per session in the history ring (default 50, 0 keeps none).
    - `prefix`: every key starts with it, so the mapping may hold other things too.
    - `owns`: `close()` closes the mapping (True for a `dbm_store`; a mapping you pass stays yours).
    - `codec`: compresses and encrypts messages, heads' secret fields and approvals (issue #17, off by default).
    """

    checkpoints: MappingCheckpointStore
    approvals: MappingApprovalStore

    def __init__(
        self,
        mapping: MutableMapping[Any, Any],
        *,
        history_limit: int = 50,
        prefix: str = "lousho:",
        owns: bool = False,
        codec: PayloadCodec = PLAIN,
    ) -> None:
        self.mapping = mapping
        self.prefix = prefix
        self._owns = owns
        text, keys, lock = TextMapping(mapping), MappingKeys(prefix), threading.RLock()
        self.codec = codec = codec.for_store(f"mapping:{prefix}")  # issue #31: bound to the store's prefix
        self.checkpoints = MappingCheckpointStore(text, keys=keys, lock=lock, history_limit=history_limit, codec=codec)
        self.approvals = MappingApprovalStore(Prefixed(text, keys.approvals), lock=lock, codec=codec)

    def close(self) -> None:
        """Close the mapping when this store opened it (`dbm_store`, a `dbm://` URL); else nothing."""
        close = getattr(self.mapping, "close", None)
        if self._owns and close is not None:
            close()

    def __enter__(self) -> MappingStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MappingStore({type(self.mapping).__name__}, prefix={self.prefix!r})"


def mapping_store(
    mapping: MutableMapping[Any, Any], *, history_limit: int = 50, prefix: str = "lousho:", codec: PayloadCodec = PLAIN
) -> MappingStore:
    """A store bundle in `mapping` (a dict, a `shelve`, a `dbm`); the mapping stays yours to close."""
    return MappingStore(mapping, history_limit=history_limit, prefix=prefix, codec=codec)


def dbm_store(
    path: str | os.PathLike[str], *, history_limit: int = 50, prefix: str = "lousho:", codec: PayloadCodec = PLAIN
) -> MappingStore:
    """A store bundle in the `dbm` file at `path` (created if missing, in whichever dbm flavour Python has:
    `dbm.gnu`, `dbm.ndbm`, else `dbm.dumb`; its folder too); `close()` closes it. One process at a time."""
    file = Path(path).expanduser()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        opened = dbm.open(str(file), "c")  # noqa: SIM115 - the store owns it: MappingStore.close()
    except (OSError, dbm.error[0]) as error:
        raise StoreUnavailableError(f"cannot open the dbm file {file}: {error}") from None
    return MappingStore(opened, history_limit=history_limit, prefix=prefix, owns=True, codec=codec)


def open_url(url: str, *, prefix: str = "lousho:", codec: PayloadCodec = PLAIN) -> MappingStore:
    """`dbm://<path>` (the store registry's opener): `dbm:///abs/path.db` or `dbm://./relative.db`."""
    from lousho.stores.registry import local_path

    return dbm_store(local_path(url, "dbm"), prefix=prefix, codec=codec)
