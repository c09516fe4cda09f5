"""Stores: where checkpoints and approvals live. Each bundle has `.checkpoints` and `.approvals`.

The SQL, file and Redis stores load on first use, so `import lousho` does not import
SQLAlchemy or redis-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lousho.stores.memory import MemoryApprovalStore, MemoryCheckpointStore, MemoryStore, memory_store

if TYPE_CHECKING:
    from lousho.stores.file import FileStore
    from lousho.stores.redis import RedisStore
    from lousho.stores.sql import SqliteStore, SqlStore

__all__ = [
    "FileStore",
    "MemoryApprovalStore",
    "MemoryCheckpointStore",
    "MemoryStore",
    "RedisStore",
    "SqlStore",
    "SqliteStore",
    "memory_store",
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
