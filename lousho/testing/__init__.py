"""Test helpers shipped with lousho: the store contract suite, a private Redis server, real worker
processes, and `FleetDriver` (`lousho.testing.fleet`: the fleet's steps in process, issue #14)."""

from typing import Any

__all__ = ["FleetDriver", "SentTask"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the other helpers (a Redis server for a web app's tests) need neither
    # Celery nor the worker.
    if name in __all__:
        from lousho.testing import fleet

        return getattr(fleet, name)
    raise AttributeError(f"module 'lousho.testing' has no attribute {name!r}")
