"""Stores: where checkpoints and approvals live. Each is a `lousho.StoreBundle` (`.checkpoints`, `.approvals`,
`sessions()`, `prune()`, `delete()`), and a store URL opens one (`lousho.stores.registry`, issue #16).

The SQL, file and Redis stores load on first use, so `import lousho` does not import
SQLAlchemy or redis-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lousho.stores.codec import PayloadCodec
from lousho.stores.mapping import MappingStore, dbm_store, mapping_store
from lousho.stores.memory import MemoryApprovalStore, MemoryCheckpointStore, MemoryStore, memory_store
from lousho.stores.registry import open_store, register_store

if TYPE_CHECKING:
    from lousho.stores.file import FileStore
    from lousho.stores.redis import RedisStore
    from lousho.stores.sql import SqliteStore, SqlStore

__all__ = [
    "FileStore",
    "MappingStore",
    "MemoryApprovalStore",
    "MemoryCheckpointStore",
    "MemoryStore",
    "PayloadCodec",
    "RedisStore",
    "SqlStore",
    "SqliteStore",
    "dbm_store",
    "mapping_store",
    "memory_store",
    "open_store",
    "register_store",
]

_LAZY = {
    "SqlStore": "lousho.stores.sql",
    "SqliteStore": "lousho.stores.sql",
    "FileStore": "lousho.stores.file",
    "RedisStore": "lousho.stores.redis",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'lousho.stores' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
