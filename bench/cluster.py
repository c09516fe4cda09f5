"""`python -m bench.cluster [--quick] [--markdown FILE]`: the fleet with its store on a 3-primary Redis Cluster
against one Redis, in the same run (issue #18).

1. Throughput: `sessions` sessions of `turns` tool turns enqueued at once on 4 worker processes (solo pool), from
   the first enqueue to the last finished save; the fleets alternate repeat by repeat:
   - store and broker on one Redis (the outbox on: a step's script pushes its next task);
   - store and broker on one Redis with the outbox off (every step through Celery's publish): what a Cluster
     store costs for the outbox alone, since a Cluster store's broker is another server;
   - store on the Cluster (a private 6-node cluster: 3 primaries, 3 replicas), broker on the one Redis.
2. The reaper's pass (`reap_once`) with 0, 1,000 and 10,000 idle sessions (in the in-flight index, none due):
   on one Redis the index is one key; on the Cluster it has a shard per slot, 16,384 ZRANGEBYSCOREs a pass.
3. The reaper's approval repair (`repair_approval_records`, once every `approval_repair_interval_s`, 30 s by
   default) with 0, 1,000 and 10,000 stored sessions, none paused: paused sessions are in no index, so it is a
   SCAN of the session heads and a GET of each (a paused session adds the reads of its approval record).

Worker processes and cluster nodes are ended by pid; every key and queue made is deleted.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis

from bench.broker import BrokerFleet
from bench.common import delete_prefix, fmt, stats
from bench.fleet import Fleet, forget_queue
from lousho.checkpoint import Checkpoint
from lousho.fleet.inflight import InflightIndex
from lousho.messages import Message
from lousho.scheduler import reap_once
from lousho.scheduler.approval_repair import repair_approval_records
from lousho.stores.redis import RedisStore
from lousho.testing.redis_cluster import RedisClusterNodes
from lousho.testing.redis_server import redis_url
from lousho.worker import FleetSettings, broker_url

WORKERS = 4
IDLE_COUNTS = (0, 1_000, 10_000)
QUICK_COUNTS = (0, 100, 1_000)
"""`--quick`'s idle and stored sessions: the smoke test checks the tables' shape, not the figures (issue #33's
time: 10,000 sessions written and read twice on both stores was the slowest test of the suite)."""


@dataclass
class ClusterFleet(BrokerFleet):
    """A bench `Fleet` whose store is on a Redis Cluster (`url`, `client`) and broker on `broker_client`'s Redis."""

    broker_client: Any = None

    def close(self) -> None:
        for worker in self.workers:
            worker.stop(timeout_s=10)
        self.workers = []
        forget_queue(self.broker_client, self.queue)


def measure_throughput(fleets: dict[str, Fleet], sessions: int, turns: int, repeats: int) -> dict[str, list[float]]:
    """Sessions per second of each fleet, `repeats` times (after a warm-up), the order rotating."""
    names = list(fleets)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for fleet in fleets.values():
        fleet.scale(WORKERS)
    for repeat in range(repeats + 1):  # the first is a warm-up
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            fleet = fleets[name]
            started = time.time()
            for index in range(sessions):
                fleet.start(f"tp-{repeat}-{index}-{uuid.uuid4().hex[:6]}", turns)
            done = fleet.wait_done(sessions, timeout_s=120 + sessions * turns)
            if repeat:
                rates[name].append(sessions / (max(d["t"] for d in done) - started))
    return rates


def reaper_pass_ms(store: RedisStore, idle: int, passes: int) -> list[float]:
    """ms of `reap_once` with `idle` sessions in the in-flight index, none due (their deadlines an hour away)."""
    index = InflightIndex.of(store, 3_600_000)
    far = index.server_time_ms() + 3_600_000
    for start in range(0, idle, 1000):
        pipe = store.client.pipeline(transaction=False)
        for n in range(start, min(idle, start + 1000)):
            session = f"idle-{n}"
            pipe.zadd(store.keys.inflight_of(session), {session: far})
        pipe.execute()
    settings = FleetSettings(queue="lousho-bench-no-queue", reaper_interval_s=0.1)
    timings = []
    for _ in range(passes + 1):  # the first is a warm-up
        for lock in store.keys.fleet_wide_shards("reaper:lock"):
            store.client.delete(lock)
        started = time.perf_counter()
        requeued = reap_once(store, None, settings)
        timings.append((time.perf_counter() - started) * 1000)
        assert requeued == [], requeued  # idle: nothing is due
    for shard in store.keys.shards("inflight") if idle else []:
        store.client.delete(shard)
    return timings[1:]


def repair_pass_ms(store: RedisStore, stored: int, passes: int) -> list[float]:
    """ms of the approval repair with `stored` finished sessions in the store (none paused: none to repair)."""
    for n in range(stored):
        session = f"stored-{n}"
        messages = [Message.user("book a table"), Message.assistant("booked")]
        store.checkpoints.save(session, Checkpoint(session_id=session, version=1, status="finished", messages=messages))
    settings = FleetSettings(queue="lousho-bench-no-queue")
    timings = []
    for _ in range(passes + 1):  # the first is a warm-up
        started = time.perf_counter()
        repaired = repair_approval_records(store, settings)
        timings.append((time.perf_counter() - started) * 1000)
        assert repaired == [], repaired  # nothing is paused
    for n in range(stored):
        store.checkpoints.delete(f"stored-{n}")
    return timings[1:]


def run(sessions: int, turns: int, repeats: int, passes: int, counts: tuple[int, ...] = IDLE_COUNTS) -> dict[str, Any]:
    with (
        redis_url() as url,
        RedisClusterNodes() as cluster,
        tempfile.TemporaryDirectory(prefix="lousho-bench-") as logs,
    ):
        client = redis.Redis.from_url(url)
        cluster_client = cast(redis.Redis, cluster.client())
        prefix = f"lousho-bench-{uuid.uuid4().hex[:8]}:"
        fleets: dict[str, Fleet] = {
            "one Redis (outbox on)": BrokerFleet(url, client, f"{prefix}a:", "lousho", logs, label="one Redis"),
            "one Redis, outbox off": BrokerFleet(
                url, client, f"{prefix}b:", "lousho", logs, extra_env={"LOUSHO_BENCH_OUTBOX": "0"}
            ),
            "Cluster store, Redis broker": ClusterFleet(
                cluster.url, cluster_client, f"{prefix}c:", "lousho", logs, broker=broker_url(url), broker_client=client
            ),
        }
        try:
            rates = measure_throughput(fleets, sessions, turns, repeats)
            stores = {
                "one Redis": RedisStore(client, prefix=f"{prefix}r:"),
                "Cluster": RedisStore(cluster_client, prefix=f"{prefix}r:"),
            }
            reaper = {
                where: {str(idle): stats(reaper_pass_ms(store, idle, passes)) for idle in counts}
                for where, store in stores.items()
            }
            repair = {
                where: {str(stored): stats(repair_pass_ms(store, stored, passes)) for stored in counts}
                for where, store in stores.items()
            }
        finally:
            for fleet in fleets.values():
                fleet.close()
            delete_prefix(client, prefix)
            for key in list(cluster_client.scan_iter(match=f"{prefix}*", count=1000)):
                cluster_client.delete(key)
            client.close()
            cluster_client.close()

    def ratio(top: str, bottom: str) -> dict[str, Any]:
        return stats([a / b for a, b in zip(rates[top], rates[bottom], strict=True)])

    return {
        "sessions": sessions,
        "turns": turns,
        "repeats": repeats,
        "workers": WORKERS,
        "sessions_per_s": {name: stats(values) for name, values in rates.items()},
        "ratios": {
            "Cluster store / one Redis": ratio("Cluster store, Redis broker", "one Redis (outbox on)"),
            "Cluster store / one Redis, outbox off": ratio("Cluster store, Redis broker", "one Redis, outbox off"),
        },
        "counts": list(counts),
        "reaper_pass_ms": reaper,
        "repair_pass_ms": repair,
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
    }


def markdown(result: dict[str, Any]) -> str:
    reaper, repair, counts = result["reaper_pass_ms"], result["repair_pass_ms"], result["counts"]
    return "\n".join(
        [
            f"# The fleet on a Redis Cluster store against one Redis ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
            "",
            f"`python -m bench.cluster`: {result['sessions']} sessions of {result['turns']} tool turns enqueued at once, "
            f"{result['workers']} worker processes (solo pool), {result['repeats']} repeats, the fleets alternating; "
            f"{result['machine']}, every process on this one machine. The Cluster is 6 redis-server nodes (3 primaries, "
            "3 replicas); its fleet's broker is the one Redis (kombu has no Cluster transport), so its outbox is off. "
            "Median (min-max).",
            "",
            "| fleet | sessions/s |",
            "| - | - |",
            *(f"| {name} | {fmt(stat)} |" for name, stat in result["sessions_per_s"].items()),
            "",
            "| ratio, paired by repeat | median (min-max) |",
            "| - | - |",
            *(f"| {name} | {fmt(stat)}x |" for name, stat in result["ratios"].items()),
            "",
            "The reaper's pass (`reap_once`, ms) with idle sessions in the in-flight index (none due):",
            "",
            "| idle sessions | one Redis | Cluster (16,384 shards) |",
            "| - | - | - |",
            *(
                f"| {idle:,} | {fmt(reaper['one Redis'][str(idle)])} | {fmt(reaper['Cluster'][str(idle)])} |"
                for idle in counts
            ),
            "",
            "The reaper's approval repair (`repair_approval_records`, ms; once every `approval_repair_interval_s`, 30 s "
            "by default) with stored sessions, none paused:",
            "",
            "| stored sessions | one Redis | Cluster |",
            "| - | - | - |",
            *(
                f"| {stored:,} | {fmt(repair['one Redis'][str(stored)])} | {fmt(repair['Cluster'][str(stored)])} |"
                for stored in counts
            ),
            "",
            "Notes. Three primaries on one 2-core machine share its cores with the workers: the Cluster's figures here show "
            "its costs (no outbox: each step's next task is one more broker round trip; redis-py's cluster client "
            "spends more CPU per command), not the capacity three machines would add. The reaper reads every shard "
            "each pass whatever the load (one script call per primary: lousho/fleet/lua/due_in_shards.lua), so its "
            "pass has a floor on the Cluster; idle sessions add little to it, since a pass reads only due entries. "
            "The approval repair finds paused sessions, which no index lists, by a SCAN of every session head and a "
            "GET of each (on a Cluster, of every primary): it grows with the sessions stored, finished ones included "
            "until they are pruned, hence its own interval (lousho/scheduler/approval_repair.py).",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few short sessions (a smoke run)")
    parser.add_argument("--markdown", type=Path, help="also write the tables as Markdown to this file")
    options = parser.parse_args(argv)
    quick = options.quick
    result = run(
        sessions=8 if quick else 40,
        turns=2 if quick else 5,
        repeats=1 if quick else 4,
        passes=2 if quick else 5,
        counts=QUICK_COUNTS if quick else IDLE_COUNTS,
    )
    print(json.dumps(result, default=str, indent=1)[:4000])
    print(markdown(result))
    if options.markdown:
        options.markdown.write_text(markdown(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
