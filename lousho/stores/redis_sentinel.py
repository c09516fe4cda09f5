"""Redis Sentinel for the store and the broker (issue #18): one URL names the sentinels and the master.

```
redis+sentinel://[[user]:password@]host:26379[,host2:26379...]/<master name>[/<db>]
```

The sentinels are asked which server is the master of `<master name>` now; the password (if any) is the
data servers' (`requirepass`), the sentinels take none (give `RedisStore(redis.sentinel.Sentinel(...)
.master_for(...))` for sentinels with their own password). The same URL names the Celery broker:
`create_app(broker=...)` and `Client(broker=...)` turn it into kombu's form
(`sentinel://host:26379/<db>;sentinel://host2:26379/<db>` with `broker_transport_options={"master_name": ...}`,
`kombu_broker`), so the store and the broker follow the same master through a failover.

After a failover redis-py's Sentinel connections ask the sentinels again: a command that fails on the
dead master (ConnectionError) or on a master demoted to a replica (READONLY) disconnects, and the client's
retries reconnect to the new master; what still fails while no master is elected reaches the caller as
`StoreUnavailableError` (`redis_errors`), as any outage does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis
from redis.sentinel import Sentinel

from lousho.errors import ConfigurationError
from lousho.redaction import redact_url

__all__ = ["SENTINEL_SCHEME", "SentinelAddress", "connect_sentinel", "is_sentinel_url", "kombu_broker"]

SENTINEL_SCHEME = "redis+sentinel://"
_FORM = "redis+sentinel://[:password@]host:26379[,host:26379...]/<master name>[/<db>]"


@dataclass(frozen=True)
class SentinelAddress:
    """What a `redis+sentinel://` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelAddress:
        if not is_sentinel_url(url):
            raise ConfigurationError(f"not a Redis Sentinel URL: {redact_url(url)!r} (expected {_FORM})")
        rest = url[len(SENTINEL_SCHEME) :].partition("?")[0]
        auth, _, location = rest.rpartition("@")
        hosts, _, path = location.partition("/")
        parts = [part for part in path.split("/") if part]
        if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise ConfigurationError(f"the Sentinel URL {redact_url(url)!r} names no master: write {_FORM}")
        sentinels = []
        for address in hosts.split(","):
            host, _, port = address.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ConfigurationError(f"the Sentinel URL {redact_url(url)!r} has a bad address: write {_FORM}")
            sentinels.append((host.strip("[]"), int(port)))
        user, _, password = auth.rpartition(":") if auth else ("", "", "")
        return cls(
            sentinels=tuple(sentinels),
            master=unquote(parts[0]),
            db=int(parts[1]) if len(parts) == 2 else 0,
            username=unquote(user) or None,
            password=unquote(password) or None,
        )


def is_sentinel_url(url: str) -> bool:
    return url.lower().startswith(SENTINEL_SCHEME)


def connect_sentinel(url: str, **options: Any) -> redis.Redis:
    """A client for the master the URL's sentinels name now, and after every failover. `options` are the
    master connections' (timeouts as `connect` sets them); the sentinels are asked with short timeouts."""
    address = SentinelAddress.parse(url)
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 30.0)
    options.setdefault("health_check_interval", 30)
    options.setdefault("db", address.db)
    if address.password is not None:
        options.setdefault("password", address.password)
    if address.username is not None:
        options.setdefault("username", address.username)
    sentinel_options = {"socket_connect_timeout": 2.0, "socket_timeout": 2.0}
    sentinel = Sentinel(list(address.sentinels), sentinel_kwargs=sentinel_options)  # type: ignore[no-untyped-call]
    master: redis.Redis = sentinel.master_for(address.master, **options)  # type: ignore[no-untyped-call]
    return master


def kombu_broker(url: str) -> tuple[str, dict[str, Any]]:
    """kombu's broker URL for a `redis+sentinel://` URL, and the transport options it needs (`master_name`)."""
    address = SentinelAddress.parse(url)
    auth = url[len(SENTINEL_SCHEME) :].partition("?")[0].rpartition("@")[0]
    userinfo = f"{auth}@" if auth else ""
    # each alternative carries the db: kombu reads the connection's own from the first
    hosts = ";".join(f"sentinel://{userinfo}{host}:{port}/{address.db}" for host, port in address.sentinels)
    return hosts, {"master_name": address.master}
