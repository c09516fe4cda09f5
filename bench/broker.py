"""`python -m bench.broker [--quick] [--markdown FILE]`: the fleet's per-step latency with RabbitMQ as the
broker and Redis as the store, against Redis alone, in the same run (issue #18).

Fleets of one worker each (one prefork child: `lousho worker`'s pool; or the solo pool, as `python -m bench`
runs its workers), fed alternately, each repeat a fresh session of `turns` tool turns (2 x turns + 1 task
hops), from `Client.enqueue` to the finished save:

- lousho on RabbitMQ (the outbox is off by itself: each step's next task goes through Celery's publish);
- the floor on RabbitMQ: a bare Celery task that sends the next one, with lousho's Celery settings;
- lousho on Redis alone (the outbox on) and the floor on Redis, as `python -m bench` measures them;
- lousho on each broker with the solo pool.

The ratios are paired repeat by repeat. RabbitMQ is a private node of the machine's `rabbitmq-server`
(`lousho.testing.rabbitmq`); Redis is REDIS_URL or a private redis-server. Every worker, node, queue
and key the benchmark made is ended or deleted.
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
from typing import Any

import redis
from kombu import Connection

from bench.common import delete_prefix, fmt, stats
from bench.fleet import APPS, ROOT, Fleet
from lousho.fleet.settings import celery_config
from lousho.scheduler import Client
from lousho.testing.rabbitmq import private_rabbitmq
from lousho.testing.redis_server import redis_url
from lousho.testing.workers import WorkerProcess, start_worker

NOTES = """Notes. The machine's cores may be shared with other work: read the medians. With the prefork pool
(`lousho worker`'s default), lousho's steps on RabbitMQ go through Celery's publish (no outbox), as the RabbitMQ
floor's hops do. With the solo pool on RabbitMQ, a hop often waits hundreds of milliseconds, up to about 2 s,
between a task's end and the next task's start (Celery's worker, not lousho: a bare chain on a solo worker stalls
the same way); run workers on RabbitMQ with prefork or threads, not `--pool solo`.
"""


@dataclass
class BrokerFleet(Fleet):
    """A bench `Fleet` whose Celery broker is `broker` (empty: the store's Redis) and whose workers run
    Celery's `pool` (one process or thread each)."""

    broker: str = ""
    pool: str = "solo"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.broker:
            return
        if self.kind == "lousho":
            self.lousho.app.close()
            self.lousho = Client(broker=self.broker, store=self.store, settings=self.settings)
            self.app = self.lousho.app
        else:
            self.app.conf.update(celery_config(self.broker, self.settings))

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, **({"LOUSHO_BENCH_BROKER": self.broker} if self.broker else {})}

    def _start(self, name: str) -> WorkerProcess:
        return start_worker(
            APPS[self.kind], queue=self.queue, name=name, env=self.env, cwd=str(ROOT), log_dir=self.log_dir,
            pool=self.pool,
        )  # fmt: skip

    def close(self) -> None:
        super().close()
        if self.broker:
            with Connection(self.broker, connect_timeout=5) as connection:
                connection.channel().queue_delete(self.queue)


def measure(fleets: dict[str, Fleet], turns: int, repeats: int) -> dict[str, list[float]]:
    """ms per task hop of each fleet, `repeats` times (after a warm-up), the order rotating."""
    names = list(fleets)
    per_hop: dict[str, list[float]] = {name: [] for name in names}
    hops = 2 * turns + 1
    for fleet in fleets.values():
        fleet.scale(1)
    for repeat in range(repeats + 1):  # the first is a warm-up
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            fleet = fleets[name]
            started = time.time()
            fleet.start(f"lat-{uuid.uuid4().hex[:10]}", turns)
            (done,) = fleet.wait_done(1, timeout_s=60 + hops)
            if repeat:
                per_hop[name].append((done["t"] - started) * 1000 / hops)
    return per_hop


def run(turns: int, repeats: int) -> dict[str, Any]:
    with redis_url() as url, private_rabbitmq() as node, tempfile.TemporaryDirectory(prefix="lousho-bench-") as logs:
        client = redis.Redis.from_url(url)
        prefix = f"lousho-bench-{uuid.uuid4().hex[:8]}:"

        def fleet(kind: str, broker: str, pool: str) -> Fleet:
            return BrokerFleet(url, client, f"{prefix}{uuid.uuid4().hex[:4]}:", kind, logs, broker=broker, pool=pool)

        fleets: dict[str, Fleet] = {
            "lousho, RabbitMQ broker, prefork": fleet("lousho", node.url, "prefork"),
            "floor, RabbitMQ broker, prefork": fleet("floor", node.url, "prefork"),
            "lousho, Redis alone, prefork": fleet("lousho", "", "prefork"),
            "floor, Redis alone, prefork": fleet("floor", "", "prefork"),
            "lousho, RabbitMQ broker, solo": fleet("lousho", node.url, "solo"),
            "lousho, Redis alone, solo": fleet("lousho", "", "solo"),
        }
        try:
            per_hop = measure(fleets, turns, repeats)
        finally:
            for each in fleets.values():
                each.close()
            delete_prefix(client, prefix)
            client.close()

    def ratio(top: str, bottom: str) -> dict[str, Any]:
        return stats([a / b for a, b in zip(per_hop[top], per_hop[bottom], strict=True)])

    return {
        "turns": turns,
        "hops": 2 * turns + 1,
        "repeats": repeats,
        "per_hop_ms": {name: stats(values) for name, values in per_hop.items()},
        "ratios": {
            "lousho / floor, RabbitMQ, prefork": ratio(
                "lousho, RabbitMQ broker, prefork", "floor, RabbitMQ broker, prefork"
            ),
            "lousho / floor, Redis alone, prefork": ratio(
                "lousho, Redis alone, prefork", "floor, Redis alone, prefork"
            ),
            "lousho on RabbitMQ / on Redis alone, prefork": ratio(
                "lousho, RabbitMQ broker, prefork", "lousho, Redis alone, prefork"
            ),
            "lousho on RabbitMQ / on Redis alone, solo": ratio(
                "lousho, RabbitMQ broker, solo", "lousho, Redis alone, solo"
            ),
        },
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# The fleet's per-step latency, RabbitMQ broker against Redis alone ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"`python -m bench.broker`: one session of {result['turns']} tool turns ({result['hops']} task hops) per repeat "
        f"on one worker (one prefork child, or the solo pool), {result['repeats']} repeats, the fleets alternating; "
        f"{result['machine']}. The store is Redis in every row. Median (min-max).",
        "",
        "| fleet | ms per task hop |",
        "| - | - |",
        *(f"| {name} | {fmt(stat)} |" for name, stat in result["per_hop_ms"].items()),
        "",
        "| ratio, paired by repeat | median (min-max) |",
        "| - | - |",
        *(f"| {name} | {fmt(stat)}x |" for name, stat in result["ratios"].items()),
        "",
        NOTES,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.broker", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few short sessions (a smoke run)")
    parser.add_argument("--markdown", type=Path, help="also write the tables as Markdown to this file")
    options = parser.parse_args(argv)
    result = run(turns=2 if options.quick else 20, repeats=2 if options.quick else 8)
    print(json.dumps({k: v for k, v in result.items() if k != "per_hop_ms"}, default=str, indent=1)[:4000])
    print(markdown(result))
    if options.markdown:
        options.markdown.write_text(markdown(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
