"""What the Redis store's parts share: key names, the Lua scripts, and error translation.

Kept apart from the stores so the worker's leases and the reaper can name the
same keys (`RedisKeys.session_key(session, "lease")`) without importing a store.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script

from lousho.errors import ConfigurationError, StoreUnavailableError
from lousho.formats import SCRIPT_PROTOCOL
from lousho.redaction import redact_secrets, redact_url, url_password, url_secrets
from lousho.stores.redis_slots import group_slots, group_tag, group_tags, key_slot, shard_tags, slot_group, slot_tag

__all__ = ["RedisKeys", "connect", "describe", "load_script", "redis_errors", "run_script_many", "text"]


@dataclass(frozen=True)
class RedisKeys:
    """Key names under one prefix.

    A session's keys carry the session id as a hash tag (`{session}`) so that in
    Redis Cluster they all hash to one slot, which is what lets one Lua script
    touch them together.

    `per_slot` (a store on a Redis Cluster, issue #18): the fleet's indexes (in-flight, running,
    parked, pending approvals) are sharded by slot, each session's entry in the shard of its own
    slot, so a script that writes a session's keys and its index entry touches one slot
    (`lousho.stores.redis_slots`). On one Redis each index is one key (`inflight`, ...).
    """

    prefix: str = "lousho:"
    per_slot: bool = False

    def __post_init__(self) -> None:
        if "{" in self.prefix or "}" in self.prefix:
            raise ConfigurationError(
                f"Redis key prefix {self.prefix!r} contains '{{' or '}}'; those would replace the per-session "
                "hash tag. Use a prefix without braces"
            )

    def session_key(self, session_id: str, part: str) -> str:
        """`<prefix>{<session>}:<part>`: any per-session key (cp, msgs, hist, lease, ...)."""
        return f"{self.prefix}{{{session_id}}}:{part}"

    def head(self, session_id: str) -> str:
        return self.session_key(session_id, "cp")

    def messages(self, session_id: str) -> str:
        return self.session_key(session_id, "msgs")

    def history(self, session_id: str) -> str:
        return self.session_key(session_id, "hist")

    def session_keys(self, session_id: str) -> tuple[str, str, str]:
        """Every key the checkpoint store writes for a session."""
        return self.head(session_id), self.messages(session_id), self.history(session_id)

    def run_keys(self, session_id: str) -> list[str]:
        """The keys a fleet keeps beside a session's checkpoint (lousho/fleet/keys.py: its lease,
        results, marks, poison counts, abort flag, incarnation, requeue mark, event stream). Deleting the session
        deletes them: a worker still on the old run then has no lease to save under (issue #21). Its
        calls' leases (`lease:<call id>`) are found from the running index (`delete`, issue #16)."""
        parts = ("lease", "results", "dispatched", "attempts", "abort", "epoch", "requeued", "events")
        return [self.session_key(session_id, part) for part in parts]

    def _shard(self, of_key: str, index: str) -> str:
        """The index key that holds the entry of `of_key` (a session's or an approval's key)."""
        if not self.per_slot:
            return f"{self.prefix}{index}"
        return f"{self.prefix}{{{slot_tag(key_slot(of_key))}}}:{index}"

    def shards(self, index: str) -> list[str]:
        """Every key of an index ('inflight', 'running', 'parked', 'approvals:pending'): one on one Redis,
        one per slot in the cluster layout (most of them absent)."""
        if not self.per_slot:
            return [f"{self.prefix}{index}"]
        return [f"{self.prefix}{{{tag}}}:{index}" for tag in shard_tags()]

    def fleet_wide_of(self, name: str, member: str) -> str:
        """The key of a fleet-wide record ('workers', 'telemetry:counters', 'reaper:lock') that holds `member`
        (a worker's `<host>|<pid>`, ...): one key on one Redis; in the cluster layout, the shard of the slot
        group of `member`'s slot, `<prefix>{<group tag>}:<name>` (issue #18: no global key)."""
        if not self.per_slot:
            return f"{self.prefix}{name}"
        return f"{self.prefix}{{{group_tag(slot_group(key_slot(member)))}}}:{name}"

    def fleet_wide_shards(self, name: str) -> list[str]:
        """Every key of a fleet-wide record: one on one Redis, one per slot group in the cluster layout."""
        if not self.per_slot:
            return [f"{self.prefix}{name}"]
        return [f"{self.prefix}{{{tag}}}:{name}" for tag in group_tags()]

    def shards_in_groups(self, index: str, groups: list[int]) -> list[str]:
        """The keys of an index for the slots of `groups` (the groups of `fleet_wide_shards`, by position): on
        one Redis, its one key (group 0 is everything); in the cluster layout, a shard per slot of each group."""
        if not self.per_slot:
            return self.shards(index) if groups else []
        return [f"{self.prefix}{{{slot_tag(slot)}}}:{index}" for group in groups for slot in group_slots(group)]

    def inflight_of(self, session_id: str) -> str:
        """The in-flight index key holding `session_id`'s deadline (issue #18)."""
        return self._shard(self.head(session_id), "inflight")

    def running_of(self, session_id: str) -> str:
        """The running index key holding `session_id`'s tool calls (issue #18)."""
        return self._shard(self.head(session_id), "running")

    def parked_of(self, session_id: str) -> str:
        """The parked hash key that would hold `session_id` (issue #18)."""
        return self._shard(self.head(session_id), "parked")

    def pending_approvals_of(self, approval_id: str) -> str:
        """The pending-approvals index key holding `approval_id` (issue #18)."""
        return self._shard(self.approval(approval_id), "approvals:pending")

    @property
    def inflight(self) -> str:
        return f"{self.prefix}inflight"

    @property
    def running(self) -> str:
        """The fleet's running index (`FleetKeys.running`): entries '<host>|<pid>|<session>|<turn>:<call id>',
        named here so that deleting a session drops its entries and its calls' leases (issue #16)."""
        return f"{self.prefix}running"

    @property
    def parked(self) -> str:
        """The fleet's hash of parked sessions (`FleetKeys.parked`), named here for `delete` (issue #16)."""
        return f"{self.prefix}parked"

    def approval(self, approval_id: str) -> str:
        return f"{self.prefix}approval:{approval_id}"

    @property
    def pending_approvals(self) -> str:
        return f"{self.prefix}approvals:pending"

    @property
    def head_pattern(self) -> str:
        """SCAN pattern of every session head under the prefix (glob characters of the prefix escaped)."""
        return re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix) + "{*}:cp"

    def session_of_head(self, key: str) -> str | None:
        """The session id in a head key's name, or None for a key that is not one."""
        inner = key[len(self.prefix) :]
        if key.startswith(self.prefix) and inner.startswith("{") and inner.endswith("}:cp"):
            return inner[1:-4]
        return None


def connect(url: str, **options: Any) -> redis.Redis:
    """A client for `url` with timeouts, so a hung Redis fails a call instead of hanging a worker."""
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 30.0)
    options.setdefault("health_check_interval", 30)
    try:
        client = redis.Redis.from_url(url, **options)
    except ValueError as exc:  # its message may quote a piece of a password urllib took for a port
        raise ConfigurationError(
            f"not a Redis URL: {redact_url(url)!r}: {redact_secrets(str(exc), *url_secrets(url))} "
            "(expected redis://, rediss:// or unix://)"
        ) from None
    # redis-py ends a password at its first '/', '?' or '#': the rest would show as the socket path (issue #21)
    parsed = client.connection_pool.connection_kwargs.get("password")
    if "password" not in options and url_password(url) not in (None, parsed):
        raise ConfigurationError(
            f"the password in the Redis URL {redact_url(url)!r} holds a '/', '?' or '#' that ends it early "
            "(the rest would be read as the socket path or the host): percent-encode it (%2F, %3F, %23)"
        )
    return client


def describe(client: Any) -> str:
    """Which Redis a client talks to, for messages: host:port/db or the socket path; never the password."""
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
    if getattr(pool, "service_name", None):  # a Sentinel master: whichever server it is now (issue #18)
        return f"Redis Sentinel master {pool.service_name!r} (db {kwargs.get('db', 0)})"  # type: ignore[union-attr]
    if kwargs.get("path"):
        return f"unix socket {kwargs['path']} (db {kwargs.get('db', 0)})"
    if kwargs.get("host"):
        return f"{kwargs['host']}:{kwargs.get('port', 6379)} (db {kwargs.get('db', 0)})"
    return "the configured Redis"


def _scrub(message: str, client: Any) -> str:
    """Remove the client's password from a driver message, should one ever carry it (not the user
    name: it is no secret, and masking a short one garbled messages, 'Connection ref***sed')."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {}) or {}
    password = kwargs.get("password")
    return redact_secrets(message, password if isinstance(password, str) else None)


@contextlib.contextmanager
def redis_errors(client: Any, action: str) -> Iterator[None]:
    """Translate the driver's errors where they enter: callers only ever see `StoreUnavailableError`.

    A script is atomic on the server, so a call that fails here either ran whole or not at
    all; a save that is retried after its reply was lost is recognised by its writer id.
    """
    try:
        yield
    except redis.RedisError as exc:
        kind = "unreachable" if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) else "refused the call"
        raise StoreUnavailableError(
            f"Redis at {describe(client)} {kind} while trying to {action}: {type(exc).__name__}: "
            f"{_scrub(str(exc), client).rstrip('. ')}. Check that it runs and accepts this client (address, "
            "password, maxmemory, not a read-only replica). Nothing is ever half-written: a save that failed "
            "here was applied whole or not at all (load the session to see which)"
        ) from exc


@cache
def _script_source(part: str) -> str:
    """An entry script's source (`lua/<name>.lua`), or a library's (`lua/lib/<name>.lua`: functions
    that scripts call, named in their `-- needs:` line; issue #14)."""
    package, _, name = part.rpartition(":")
    folder = resources.files(package or "lousho.stores").joinpath("lua")
    entry = folder.joinpath(f"{name}.lua")
    return (entry if entry.is_file() else folder.joinpath("lib", f"{name}.lua")).read_text(encoding="utf-8")


def load_script(client: redis.Redis, name: str) -> Script:
    """Register `lua/<name>.lua` of `lousho.stores` (or `<package>:<name>`; libraries in `lua/lib/`); redis-py's Script
    reloads it on NOSCRIPT (e.g. after a Redis restart).

    Lua inside Redis has no `require`: a script (or a library) that calls a library function says
    so in a line `-- needs: <part>, ...` and is sent with each library's source in front of its own."""
    parts = _with_needs(name, [])
    for part in parts:
        _check_protocol(part)
    return client.register_script("\n".join(_script_source(part) for part in parts))


def run_script_many(client: Any, script: Script, calls: list[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> list[Any]:
    """Run `script` once per `(keys, args)` of `calls`, in one pipeline (one round trip on one Redis, one per node on
    a Cluster); each call's reply, or its error, in order. NOSCRIPT (a Redis restarted or flushed meanwhile) loads
    the script and sends them all again: only for scripts that may run twice (issue #29's heartbeats)."""
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        for keys, args in calls:  # EVALSHA as a plain command: a Script on a pipeline costs a SCRIPT EXISTS
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        if not any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            break
        client.script_load(script.script)
    return replies


def _check_protocol(part: str) -> None:
    """Every script says the protocol whose rules it keeps (`-- protocol: <n>`, issue #35): one of another
    protocol in this package is a packaging mistake, never run beside scripts it would break."""
    declared = re.search(r"^-- protocol: (\d+)", _script_source(part), re.MULTILINE)
    if declared is None or int(declared.group(1)) != SCRIPT_PROTOCOL:
        raise ConfigurationError(
            f"the Lua script {part!r} is of protocol {declared.group(1) if declared else 'unstated'}, not "
            f"{SCRIPT_PROTOCOL} (lousho.formats.SCRIPT_PROTOCOL): reinstall lousho; its scripts are mixed"
        )


def _with_needs(name: str, parts: list[str]) -> list[str]:
    """`parts` and then `name` with what it needs, each once, every library before its users."""
    needs = re.search(r"^-- needs: (.+)$", _script_source(name), re.MULTILINE)
    for need in [part.strip() for part in needs.group(1).split(",")] if needs else []:
        if need not in parts:
            _with_needs(need, parts)
    parts.append(name)
    return parts


def text(value: bytes | str) -> str:
    """A reply as str, whether or not the client decodes responses."""
    return value.decode() if isinstance(value, bytes) else value
