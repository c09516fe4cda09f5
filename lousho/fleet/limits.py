"""Fleet-wide limits (issue #29): a vendor's rate limit shared by every worker, and a per-agent maximum of
sessions in flight. What they are, their Redis keys, and how they read now (the dashboard and metrics).

A worker process holds hundreds of model turns at once (issue #29), so a vendor's requests-per-minute and
tokens-per-minute limits are met by the fleet, not by one process: each limit is one Redis key that every
worker takes from in one Lua script (`lousho.worker.limits`). Each key carries its own hash tag,
`<prefix>{limit/rate/<model>}` and `<prefix>{limit/sessions/<agent>}`, so on a Redis Cluster each limit
lives whole in one slot. A `/` is never in a session id (`validate_session_id`): these tags never meet a
session's.

Configured with `create_app(..., limits=FleetLimits(...))`; each worker publishes its limits in its
registry entry (`lousho.worker.registry`), which is where the dashboard and the metrics find them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from lousho.errors import ConfigurationError
from lousho.stores.redis_common import RedisKeys, redis_errors, text

if TYPE_CHECKING:
    from lousho.stores.redis import RedisStore

__all__ = [
    "FleetLimits",
    "LimitUsage",
    "RateLimit",
    "SlotUsage",
    "limits_usage",
    "live_limits_usage",
    "rate_limit_key",
    "rate_waiting_key",
    "session_slots_key",
    "slot_queue_key",
    "slot_waiting_key",
]


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """A vendor's limit on one model, met by the whole fleet: `requests_per_minute` and `tokens_per_minute`
    (None: no limit on that count), counted over windows of `window_s` (a minute, as vendors count; a test
    may shorten it). A window starts with the first request after the previous one ended."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    window_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"RateLimit.{name} must be a whole number of at least 1, or None")
        if not self.window_s > 0:
            raise ConfigurationError("RateLimit.window_s must be more than 0")

    @property
    def window_ms(self) -> int:
        return max(1, round(self.window_s * 1000))

    def describe(self) -> dict[str, Any]:
        """As published in a worker's registry entry."""
        return {"rpm": self.requests_per_minute, "tpm": self.tokens_per_minute, "window_s": self.window_s}


@dataclass(frozen=True, kw_only=True)
class FleetLimits:
    """The fleet-wide limits of a `create_app` (issue #29).

    `rate_limits`: model id (as the agent names it, `Agent.model`) -> `RateLimit`. Before each request to
    that model a worker takes one request and the turn's estimated tokens from the fleet's count, waiting
    (on its event loop) while the window is full; the real usage corrects the count after the answer.
    `max_sessions_in_flight`: agent name -> at most that many of its sessions worked on at once, fleet-wide.
    A session takes a slot at a model turn and keeps it until it finishes, pauses for approval, parks, is
    aborted or fails; a model turn that finds none free is sent again after `slot_retry_s`, and free slots go to
    waiting sessions in the order they first waited.
    `slot_ttl_s`: a slot not refreshed for that long (a model turn refreshes it, and every heartbeat of
    its session's work) comes back: a dead worker's session does not hold it for ever.
    `rate_limited_wait_s`: how long, in all, one model turn waits out a vendor's 429 answers before the
    turn fails (a 429 is waited out without using up the agent's `RetryPolicy` attempts).
    """

    rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)
    max_sessions_in_flight: Mapping[str, int] = field(default_factory=dict)
    slot_ttl_s: float = 60.0
    slot_retry_s: float = 1.0
    rate_limited_wait_s: float = 600.0

    def __post_init__(self) -> None:
        for agent, limit in self.max_sessions_in_flight.items():
            if not isinstance(limit, int) or limit < 1:
                raise ConfigurationError(f"max_sessions_in_flight[{agent!r}] must be a whole number of at least 1")
        for model, rate in self.rate_limits.items():
            if not isinstance(rate, RateLimit):
                raise ConfigurationError(f"rate_limits[{model!r}] must be a RateLimit, not {rate!r}")
        if not (self.slot_ttl_s > 0 and self.slot_retry_s > 0 and self.rate_limited_wait_s >= 0):
            raise ConfigurationError(
                "FleetLimits: slot_ttl_s and slot_retry_s must be more than 0, rate_limited_wait_s not below 0"
            )

    @property
    def slot_ttl_ms(self) -> int:
        return max(1, round(self.slot_ttl_s * 1000))

    def describe(self) -> dict[str, Any]:
        """As published in a worker's registry entry (`lousho.worker.registry`), read by `limits_usage`."""
        return {
            "rate": {model: rate.describe() for model, rate in sorted(self.rate_limits.items())},
            "sessions": dict(sorted(self.max_sessions_in_flight.items())),
        }


def _tag(kind: str, name: str) -> str:
    return "limit/" + kind + "/" + name.replace("{", "(").replace("}", ")")


def rate_limit_key(keys: RedisKeys, model: str) -> str:
    """The hash of `model`'s rate limit: the current window's start (server ms), its requests and tokens, and
    until when a vendor's 429 asked everyone to wait."""
    return f"{keys.prefix}{{{_tag('rate', model)}}}"


def rate_waiting_key(keys: RedisKeys, model: str) -> str:
    """Sorted set of the sessions waiting on `model`'s rate limit -> until when their wait counts (server ms)."""
    return rate_limit_key(keys, model) + ":waiting"


def session_slots_key(keys: RedisKeys, agent: str) -> str:
    """Sorted set of `agent`'s sessions holding a slot -> when the slot expires unless refreshed (server ms)."""
    return f"{keys.prefix}{{{_tag('sessions', agent)}}}"


def slot_waiting_key(keys: RedisKeys, agent: str) -> str:
    """Sorted set of `agent`'s sessions whose model turn waits for a slot -> until when that counts (server ms)."""
    return session_slots_key(keys, agent) + ":waiting"


def slot_queue_key(keys: RedisKeys, agent: str) -> str:
    """Sorted set of `agent`'s waiting sessions -> when each first waited (server ms): free slots go in that order."""
    return session_slots_key(keys, agent) + ":queue"


@dataclass(frozen=True)
class LimitUsage:
    """A rate limit as configured and as used in its current window."""

    model: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    window_s: float
    requests: int
    tokens: int
    waiting: int
    """Sessions whose model turn waits on this limit now."""


@dataclass(frozen=True)
class SlotUsage:
    """A per-agent maximum of sessions in flight, as configured and as held now."""

    agent: str
    max_sessions: int
    in_flight: int
    waiting: int
    """Sessions whose model turn waits for a slot now."""


def _configured(entries: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    rates: dict[str, dict[str, Any]] = {}
    slots: dict[str, int] = {}
    for entry in entries.values():
        limits = entry.get("limits")
        if not isinstance(limits, dict):
            continue
        rates.update({str(m): r for m, r in (limits.get("rate") or {}).items() if isinstance(r, dict)})
        slots.update({str(a): int(n) for a, n in (limits.get("sessions") or {}).items() if isinstance(n, int)})
    return rates, slots


def limits_usage(
    client: Any, keys: RedisKeys, entries: Mapping[str, Mapping[str, Any]], now_ms: int
) -> tuple[list[LimitUsage], list[SlotUsage]]:
    """The limits the live workers' registry `entries` publish, with what each uses now (Redis server
    `now_ms`): one pipeline, each command on one limit's own key."""
    rates, slots = _configured(entries)
    with redis_errors(client, "read the fleet-wide limits"):
        pipe = client.pipeline(transaction=False)
        for model in sorted(rates):
            pipe.hmget(rate_limit_key(keys, model), "start", "req", "tok")
            pipe.zcount(rate_waiting_key(keys, model), f"({now_ms}", "+inf")
        for agent in sorted(slots):
            pipe.zcount(session_slots_key(keys, agent), f"({now_ms}", "+inf")
            pipe.zcount(slot_waiting_key(keys, agent), f"({now_ms}", "+inf")
        replies = cast(list[Any], pipe.execute())
    rate_rows = []
    for i, model in enumerate(sorted(rates)):
        (start, req, tok), waiting = replies[2 * i], int(replies[2 * i + 1])
        config = rates[model]
        window_s = float(config.get("window_s") or 60.0)
        current = start is not None and int(text(start)) + window_s * 1000 > now_ms
        used = (int(text(req or b"0")), max(0, int(text(tok or b"0")))) if current else (0, 0)
        rate_rows.append(LimitUsage(model, config.get("rpm"), config.get("tpm"), window_s, *used, waiting))
    offset = 2 * len(rates)
    slot_rows = [
        SlotUsage(agent, slots[agent], int(replies[offset + 2 * i]), int(replies[offset + 2 * i + 1]))
        for i, agent in enumerate(sorted(slots))
    ]
    return rate_rows, slot_rows


def live_limits_usage(store: RedisStore) -> tuple[list[LimitUsage], list[SlotUsage]]:
    """`limits_usage` of the limits the store's live workers keep (the dashboard's fleet page, the metrics)."""
    from lousho.fleet.registry import WorkerRegistry  # the registry reads workers; the limits' keys need it not

    registry = WorkerRegistry(store)
    now_ms = registry.server_time_ms()
    live = {worker.id for worker in registry.live().workers}
    entries = {worker_id: entry for worker_id, entry in registry.entries().items() if worker_id in live}
    return limits_usage(store.client, store.keys, entries, now_ms)
