"""`Target`: what every operation acts on, a store bundle and, on a fleet, the `Client` that wakes its workers
(issue #32). The CLI opens one from its settings (`open_target`); the dashboard is given one.

Also `sync`, which every operation and both front ends use: a store's answer, awaited when the store is async.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lousho.checkpoint import Checkpoint, maybe_await, validate_session_id
from lousho.errors import ConfigurationError, SessionNotFoundError, StoreNotFoundError
from lousho.store_bundle import StoreBundle

if TYPE_CHECKING:
    from lousho.scheduler.client import Client
    from lousho.settings import LoushoSettings
    from lousho.stores.redis import RedisStore

__all__ = ["Target", "existing_store_path", "load_session", "open_target", "sync"]


@dataclass(frozen=True)
class Target:
    """A store bundle, and on a fleet the `Client` that decides, wakes and aborts its runs."""

    bundle: StoreBundle
    client: Client | None = None

    @property
    def fleet_store(self) -> RedisStore | None:
        """The RedisStore when the bundle is a fleet's (None otherwise): parked marks, workers, leases live there."""
        from lousho.stores.redis import RedisStore

        return self.bundle if isinstance(self.bundle, RedisStore) else None

    def fleet_client(self, what: str) -> Client:
        """The fleet's Client; `ConfigurationError` saying what to do instead off a fleet."""
        if self.client is None:
            raise ConfigurationError(f"{what} needs the fleet (a Redis store and its workers); {self.bundle!r} is not")
        return self.client

    def parked_reasons(self) -> dict[str, str]:
        """Session -> why the fleet parked it (empty off a fleet)."""
        store = self.fleet_store
        if store is None:
            return {}
        from lousho.fleet.keys import FleetKeys
        from lousho.stores.redis_common import redis_errors, text

        with redis_errors(store.client, "read the parked sessions"):
            marks = cast(dict[bytes | str, bytes | str], store.client.hgetall(FleetKeys(store).parked))
        return {text(name): text(reason) for name, reason in marks.items()}

    def close(self) -> None:
        """End the target's connections (a PostgreSQL pool, a Redis client): a command's end with it."""
        close = getattr(self.bundle, "close", None)
        if callable(close):
            close()


def open_target(settings: LoushoSettings, *, must_exist: bool = False) -> Target:
    """The target the settings name: their store, and on a fleet's Redis the `Client` on it. `must_exist`
    (every read-only command): a local store (sqlite, dbm, file) that is not there raises `StoreNotFoundError`
    naming the path, and nothing is created (issue #32)."""
    from lousho.stores.redis import RedisStore

    if must_exist and settings.store_url:
        existing_store_path(settings.store_url)
    store = settings.store()
    if not isinstance(store, RedisStore):
        return Target(store)
    store.close()  # the fleet's store is the Client's (with its in-flight deadline), as `lousho approve` uses it
    client = settings.client()
    return Target(client.store, client)


_LOCAL_SCHEMES = ("sqlite", "dbm", "file")


def existing_store_path(url: str) -> Path | None:
    """The local path a sqlite, dbm or file URL names, when it exists; `StoreNotFoundError` when it does not.
    None for any other URL (a server's store: the server says whether it is there)."""
    from lousho.redaction import redact_url
    from lousho.stores.registry import local_path

    scheme = url.partition("://")[0].lower()
    if scheme not in _LOCAL_SCHEMES:
        return None
    raw = local_path(url, scheme)
    if scheme == "sqlite":
        if raw in ("/", "/:memory:"):
            return None
        raw = raw[1:]
    path = Path(raw)
    candidates = [path] if scheme != "dbm" else [path, *path.parent.glob(f"{path.name}.*")]  # dbm adds suffixes
    if not any(candidate.exists() for candidate in candidates):
        raise StoreNotFoundError(str(path), redact_url(url))
    return path


def load_session(target: Target, session_id: str) -> Checkpoint:
    """The session's latest checkpoint; `SessionNotFoundError` when it has none."""
    checkpoint: Checkpoint | None = sync(target.bundle.checkpoints.load(validate_session_id(session_id)))
    if checkpoint is None:
        raise SessionNotFoundError(session_id, repr(target.bundle))
    return checkpoint


def sync(value: Any) -> Any:
    """A store method's answer, awaited when the store is async. The CLI and the dashboard's handlers are sync;
    called on a thread that runs an event loop (an async route of the dashboard), it awaits on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(maybe_await(value))
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, maybe_await(value)).result()
