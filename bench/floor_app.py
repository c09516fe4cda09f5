"""The fleet's floor: a bare Celery task that enqueues the next one (`celery -A bench.floor_app worker`).

Same broker and the very settings a lousho app runs with (`celery_config`: JSON, acks_late,
reject on worker lost, prefetch 1, task events on), served by the same kind of worker (solo
pool). A chain of `hops` tasks ends by pushing `{"chain", "t"}` to `<prefix>bench:floor-done`.
Configured by `LOUSHO_BENCH_REDIS`, `LOUSHO_BENCH_PREFIX`, `LOUSHO_BENCH_QUEUE`, and `LOUSHO_BENCH_BROKER`
(a broker other than that Redis: RabbitMQ, `bench.broker`).
"""

from __future__ import annotations

import json
import os
import time

import redis as redis_py
from celery import Celery

from bench.common import profile_between_signals
from lousho.fleet.settings import celery_config
from lousho.worker import FleetSettings, broker_url

URL = os.environ["LOUSHO_BENCH_REDIS"]
PREFIX = os.environ["LOUSHO_BENCH_PREFIX"]
SETTINGS = FleetSettings(queue=os.environ["LOUSHO_BENCH_QUEUE"])
HOP = "bench.hop"

app = Celery("lousho-floor", set_as_current=False)
app.conf.update(celery_config(os.environ.get("LOUSHO_BENCH_BROKER") or broker_url(URL), SETTINGS))
redis = redis_py.Redis.from_url(URL)
profile_between_signals()  # bench.profile_hop (issue #20)


def send_hop(client_app: Celery, chain: str, remaining: int) -> None:
    """Send hop `remaining` of `chain` (as lousho sends its steps: by name, to the queue, with an id)."""
    client_app.send_task(
        HOP, args=[chain, remaining], task_id=f"{chain}/hop/{remaining}", queue=client_app.conf.task_default_queue
    )


@app.task(name=HOP)  # type: ignore[untyped-decorator]
def hop(chain: str, remaining: int) -> None:
    if remaining > 1:
        send_hop(app, chain, remaining - 1)
    else:
        redis.rpush(f"{PREFIX}bench:floor-done", json.dumps({"chain": chain, "t": time.time()}))
