"""Prometheus metrics of a lousho fleet (issue #19; `pip install 'lousho[metrics]'`).

Two sources, one registry (`metrics_registry`):

- what worker processes measure: `lousho_step_seconds`, a histogram of each task's time by `kind`
  (model_turn, tool_call, advance) and `outcome` (the word the task returned: finished,
  tools-dispatched, turn-enqueued, lease-lost, running-elsewhere, ...). A worker measures it once
  `LOUSHO_METRICS=1` is set (`lousho.telemetry.hooks`); prefork workers write it into
  `PROMETHEUS_MULTIPROC_DIR` (prometheus_client's multiprocess mode), and whatever serves `/metrics`
  on that host reads the folder (`lousho metrics`, `LOUSHO_METRICS_PORT`, or the dashboard's);
- what the store says at scrape time (`StoreCollector`): sessions by status, in flight, parked,
  approvals waiting and the oldest one's age, and the fleet's event counts (reaper requeues, lease
  takeovers, poison results: `lousho.telemetry.counters`).

For the dashboard (or any ASGI app): `app.mount("/metrics", metrics_app(store))`.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, cast

from lousho.errors import ConfigurationError
from lousho.fleet.limits import live_limits_usage
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors
from lousho.stores.redis_records import status_of
from lousho.telemetry.counters import FleetCounters
from lousho.telemetry.extras import missing_extra

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Histogram, make_asgi_app
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.multiprocess import MultiProcessCollector
except ImportError as exc:  # an optional extra: say how to get it where it is first needed
    raise missing_extra("metrics", "metrics", exc) from exc

__all__ = ["STATUSES", "StoreCollector", "metrics_app", "metrics_registry", "observe_step"]

STATUSES = ("in-progress", "awaiting-approval", "finished")
"""The statuses a checkpoint has (`lousho.checkpoint.Status`); parked is the fleet's, counted apart."""
STEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_MGET_CHUNK = 500

_step_seconds: Histogram | None = None


def observe_step(kind: str, outcome: str, seconds: float) -> None:
    """Record one task's time: `kind` (model_turn, tool_call, advance), `outcome` (what it returned)."""
    global _step_seconds
    if _step_seconds is None:  # made on first use, in the process (and multiprocess mode) that measures
        _step_seconds = Histogram(
            "lousho_step_seconds",
            "Time of one lousho task on a worker, by kind (model_turn, tool_call, advance) and outcome",
            ["kind", "outcome"],
            buckets=STEP_BUCKETS_S,
        )
    _step_seconds.labels(kind=kind, outcome=outcome).observe(seconds)


class StoreCollector:
    """What the store says, read at each scrape: cheap counts (ZCARD, HLEN, HGETALL), and the sessions
    by status (one SCAN of the heads on Redis; other stores' `sessions(status=...)`), re-read at most
    every `sessions_every_s` since it grows with the store."""

    def __init__(self, store: Any, *, sessions_every_s: float = 10.0) -> None:
        self.store = store
        self.sessions_every_s = sessions_every_s
        self._sessions: tuple[float, dict[str, int]] | None = None

    def describe(self) -> list[Metric]:
        """Nothing: registering the collector must not read the store (nor start the sessions' cache)."""
        return []

    def collect(self) -> Iterator[Metric]:
        by_status = GaugeMetricFamily(
            "lousho_sessions", "Sessions by the status of their checkpoint", labels=["status"]
        )
        for status, count in self.sessions_by_status().items():
            by_status.add_metric([status], count)
        yield by_status
        waiting, oldest_s = self.approvals_waiting()
        yield GaugeMetricFamily("lousho_approvals_waiting", "Approvals waiting for a decision", value=waiting)
        yield GaugeMetricFamily(
            "lousho_approval_oldest_age_seconds", "Age of the oldest approval waiting (0 when none)", value=oldest_s
        )
        if isinstance(self.store, RedisStore):
            yield from self._fleet(self.store)

    def sessions_by_status(self) -> dict[str, int]:
        now = time.monotonic()
        if self._sessions is None or now - self._sessions[0] >= self.sessions_every_s:
            counts = _redis_statuses(self.store) if isinstance(self.store, RedisStore) else self._statuses()
            self._sessions = (now, counts)
        return dict(self._sessions[1])

    def _statuses(self) -> dict[str, int]:
        return {status: len(self.store.sessions(status=status)) for status in STATUSES}

    def approvals_waiting(self) -> tuple[int, float]:
        """How many approvals wait, and the oldest one's age in seconds."""
        if isinstance(self.store, RedisStore):
            keys, client = self.store.keys, self.store.client
            with redis_errors(client, "count the pending approvals"):
                pipe = client.pipeline(transaction=False)
                for shard in keys.shards("approvals:pending"):  # one key, or one per slot on a Cluster (issue #18)
                    pipe.zcard(shard)
                    pipe.zrange(shard, 0, 0, withscores=True)
                replies = pipe.execute()
                seconds, micros = cast(tuple[int, int], client.time())
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            count = sum(int(n) for n in replies[0::2])
            created_ms = sorted(int(score) for oldest in replies[1::2] for _, score in oldest if score > 0)
            return count, max(0.0, (now_ms - created_ms[0]) / 1000) if created_ms else 0.0
        pending = self.store.approvals.pending()
        if not isinstance(pending, Iterable):  # an async store's: not read from a scrape
            close = getattr(pending, "close", None)
            if close is not None:
                close()
            return 0, 0.0
        ages = [_age_s(snapshot.created_at) for snapshot in pending]
        return len(ages), max(ages, default=0.0)

    def _fleet(self, store: RedisStore) -> Iterator[Metric]:
        keys, client = store.keys, store.client
        with redis_errors(client, "count the in-flight and parked sessions"):
            pipe = client.pipeline(transaction=False)
            inflight_shards = keys.shards("inflight")  # one key, or one per slot on a Cluster (issue #18)
            for shard in inflight_shards:
                pipe.zcard(shard)
            for shard in keys.shards("parked"):
                pipe.hlen(shard)
            sizes = [int(n) for n in pipe.execute()]
            in_flight, parked = sum(sizes[: len(inflight_shards)]), sum(sizes[len(inflight_shards) :])
        yield GaugeMetricFamily("lousho_sessions_in_flight", "Sessions the fleet is moving", value=in_flight)
        yield GaugeMetricFamily("lousho_sessions_parked", "Sessions parked until a human resumes them", value=parked)
        helps = {
            "reaper_requeues": "Sessions the reaper requeued after their worker went quiet",
            "lease_takeovers": "Steps that found their lease taken over by another worker and stood down",
            "poison_results": "Tool calls given a poison result after killing their worker max_attempts times",
            "messages_handed_back": "Step messages a worker handed back unrun: of a newer protocol, or for a session "
            "of a newer format (issue #35)",
        }
        for name, value in FleetCounters.of(store).read().items():
            yield CounterMetricFamily(f"lousho_{name}", helps[name], value=value)
        yield from _limits(store)


def _limits(store: RedisStore) -> Iterator[Metric]:
    """The fleet-wide limits the live workers keep, as configured and as used now (issue #29)."""
    rates, slots = live_limits_usage(store)
    gauges = {
        name: GaugeMetricFamily(f"lousho_rate_limit_{name}", help, labels=["model"])
        for name, help in (
            ("requests", "Requests made to the model in its rate limit's current window, fleet-wide"),
            ("requests_max", "The model's rate limit: requests per window (0: none)"),
            ("tokens", "Tokens counted against the model's rate limit in its current window, fleet-wide"),
            ("tokens_max", "The model's rate limit: tokens per window (0: none)"),
            ("window_seconds", "The model's rate limit window"),
            ("waiting", "Sessions whose model turn waits on the model's rate limit"),
        )
    }
    for rate in rates:
        values = (rate.requests, rate.requests_per_minute or 0, rate.tokens, rate.tokens_per_minute or 0)
        for name, value in zip(("requests", "requests_max", "tokens", "tokens_max"), values, strict=True):
            gauges[name].add_metric([rate.model], value)
        gauges["window_seconds"].add_metric([rate.model], rate.window_s)
        gauges["waiting"].add_metric([rate.model], rate.waiting)
    yield from gauges.values()
    held = GaugeMetricFamily("lousho_agent_sessions_in_flight", "An agent's sessions holding a slot", labels=["agent"])
    most = GaugeMetricFamily(
        "lousho_agent_sessions_in_flight_max", "An agent's maximum of sessions in flight", labels=["agent"]
    )
    waiting = GaugeMetricFamily(
        "lousho_agent_sessions_waiting", "An agent's sessions waiting for a slot", labels=["agent"]
    )
    for slot in slots:
        held.add_metric([slot.agent], slot.in_flight)
        most.add_metric([slot.agent], slot.max_sessions)
        waiting.add_metric([slot.agent], slot.waiting)
    yield from (held, most, waiting)


def _redis_statuses(store: RedisStore) -> dict[str, int]:
    """One SCAN of the session heads, their statuses read in chunks."""
    counts = dict.fromkeys(STATUSES, 0)
    client = store.client
    with redis_errors(client, "count sessions by status"):
        heads = [key for key in client.scan_iter(match=store.keys.head_pattern, count=1000)]
        for start in range(0, len(heads), _MGET_CHUNK):
            pipe = client.pipeline(transaction=False)  # GETs, not MGET: on a Cluster heads span slots (issue #18)
            for head in heads[start : start + _MGET_CHUNK]:
                pipe.get(head)
            for raw in cast(list[bytes | str | None], pipe.execute()):
                status = status_of(raw) if raw is not None else None
                if status is not None:
                    counts[status] = counts.get(status, 0) + 1
    return counts


def _age_s(created_at: str) -> float:
    try:
        created = datetime.fromisoformat(created_at)
    except ValueError:
        return 0.0
    created = created if created.tzinfo else created.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - created).total_seconds())


class _ThisProcess:
    """This process's own metrics (prometheus_client's default registry), in another registry."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


class _WorkersFiles(MultiProcessCollector):
    """prometheus_client's collector of the worker processes' files, skipping a file still at 0 bytes: a worker
    creates its file, then sizes it, and a scrape in between failed whole (`struct.error`); a worker killed in
    that moment left the empty file for good, and every later scrape failed (prometheus/client_python#1199,
    seen in a loaded CI run, issue #33). Such a file holds nothing yet."""

    def collect(self) -> Any:
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            try:
                if os.path.getsize(path) > 0:
                    files.append(path)
            except OSError:  # removed since listed (`mark_process_dead`'s clean-up)
                continue
        return self.merge(files, accumulate=True)  # type: ignore[no-untyped-call]  # untyped in prometheus_client


def metrics_registry(store: Any = None, *, multiprocess_dir: str | None = None) -> CollectorRegistry:
    """A registry with the store's metrics (`StoreCollector`, when `store` is given: any store bundle,
    the fleet's gauges and counters on a `RedisStore`) and the workers' (`lousho_step_seconds`) read from
    `multiprocess_dir` (default `PROMETHEUS_MULTIPROC_DIR`); with no folder, this process's own metrics."""
    registry = CollectorRegistry()
    folder = multiprocess_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        if not os.path.isdir(folder):
            raise ConfigurationError(
                f"the metrics folder {folder!r} does not exist: create it before the workers start "
                "(PROMETHEUS_MULTIPROC_DIR, the same folder for every worker process on the host)"
            )
        _WorkersFiles(registry, path=folder)  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    else:
        registry.register(_ThisProcess())
    if store is not None:
        registry.register(StoreCollector(store))
    return registry


def metrics_app(store: Any = None, *, multiprocess_dir: str | None = None) -> Any:
    """An ASGI app serving `metrics_registry(store, multiprocess_dir=...)` in Prometheus' text format:
    `fastapi_app.mount("/metrics", metrics_app(store))` (the dashboard mounts it so)."""
    return make_asgi_app(registry=metrics_registry(store, multiprocess_dir=multiprocess_dir))
