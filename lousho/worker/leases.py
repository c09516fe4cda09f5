"""Leases: which worker may advance a session (or run one tool call) right now.

A lease is `SET key token NX PX ttl`: it expires by Redis's clock, never a
worker's. A heartbeat extends it while work runs; extending and releasing
compare the token first, so a worker whose lease expired and was taken over
cannot extend or delete the new holder's. Saves are fenced on the lease token
(the save script checks it), so a paused worker cannot overwrite newer progress.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import redis
from redis.commands.core import Script

from lousho.fleet.liveness import lease_token_prefix, this_process
from lousho.stores.redis_common import load_script, redis_errors

__all__ = ["Lease"]


@dataclass
class Lease:
    """One lease on `key`, held with a random `token` for `ttl_ms`."""

    client: redis.Redis
    key: str
    ttl_ms: int
    token: str = field(default_factory=lambda: f"{lease_token_prefix(this_process())}{uuid.uuid4().hex}")
    """Random, prefixed with the holder's `<host>|<pid>`: an operator (or a test) can tell which worker holds it,
    and the reaper frees a dead process's leases by it (fleet/liveness.py)."""
    held: bool = False
    confirmed_at: float = 0.0
    """`time.monotonic()` just before the command that last took or extended the lease was sent."""

    def acquire(self) -> bool:
        started = time.monotonic()
        with redis_errors(self.client, f"take the lease {self.key}"):
            self.held = bool(self.client.set(self.key, self.token, nx=True, px=self.ttl_ms))
        self.confirmed_at = started
        return self.held

    def extend(self) -> bool:
        """Push the expiry out; False when the lease was lost (expired and maybe taken over)."""
        started = time.monotonic()
        with redis_errors(self.client, f"extend the lease {self.key}"):
            self.held = bool(self._script(self.client, "lease_extend")(keys=[self.key], args=[self.token, self.ttl_ms]))
        self.confirmed_at = started
        return self.held

    def fresh(self) -> bool:
        """Held, and taken or extended less than a third of its TTL ago by this process's clock:
        it cannot have expired yet, so there is no need to ask Redis (one round trip saved)."""
        return self.held and time.monotonic() - self.confirmed_at < self.ttl_ms / 3000

    def release(self) -> None:
        if not self.held:
            return
        with redis_errors(self.client, f"release the lease {self.key}"):
            self._script(self.client, "lease_release")(keys=[self.key], args=[self.token])
        self.held = False

    @staticmethod
    def _script(client: redis.Redis, name: str) -> Script:
        """One Script object per client and script (it hashes the source once; it reloads on NOSCRIPT)."""
        key = (id(client), name)
        if key not in _SCRIPTS:
            _SCRIPTS[key] = load_script(client, f"lousho.worker:{name}")
        return _SCRIPTS[key]


_SCRIPTS: dict[tuple[int, str], Script] = {}
