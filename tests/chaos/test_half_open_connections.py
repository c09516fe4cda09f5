"""Redis goes silent without closing anything: every open connection of every worker (broker: consume,
ack, publish, events; store) is blackholed mid-run, as a failover behind a virtual IP or a NAT that
forgets its flows does; new connections work. This is how Celery workers on Redis "stop consuming"
(celery #9054 and its kin): before lousho's broker_transport_options had a socket timeout and a retry,
no session of this test ever finished (docs/reliability.md has the measurements).

The store's own timeout decides how long a worker waits on a dead store connection: RedisStore's
default is 30 s; this test sets 5 s (`RedisStore(url, socket_timeout=5)`) to stay short.

To see the workers stall as they did before, run it with the old transport options:
`LOUSHO_CHAOS_CELERY_CONF='{"broker_transport_options": {"visibility_timeout": 3600}}'`.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from lousho.testing.redis_server import RedisServer
from tests.chaos.blackhole import Blackhole
from tests.chaos.harness import (
    SEED,
    ChaosFleet,
    Row,
    check_sessions,
    drop_queue,
    finished_count,
    install_scripts,
    make_fleet,
    pick,
    random_script,
    record,
    settled_count,
)
from tests.chaos.test_security import free_port

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(20, 60)
CUTS = pick(1, 3)


@pytest.fixture
def proxied_fleet(tmp_path: Path) -> Iterator[tuple[Blackhole, ChaosFleet]]:
    port = free_port()
    server = RedisServer(extra_args=("--port", str(port), "--bind", "127.0.0.1"))
    server.start()
    proxy = Blackhole(("127.0.0.1", port))
    proxy.start()
    direct = redis.Redis(host="127.0.0.1", port=port)  # the test's own view, and the reaper's, bypass the proxy
    fleet = make_fleet(f"redis://127.0.0.1:{port}/0", "bh:", direct, tmp_path)
    fleet.env["LOUSHO_TEST_FLEET_REDIS"] = f"redis://127.0.0.1:{proxy.port}/0"
    fleet.env["LOUSHO_TEST_STORE_OPTIONS"] = '{"socket_timeout": 5}'
    fleet.env["LOUSHO_TEST_PROBE_REDIS"] = f"redis://127.0.0.1:{port}/0"  # a tool's run counts even if its store is cut
    if os.environ.get("LOUSHO_CHAOS_CELERY_CONF"):
        fleet.env["LOUSHO_TEST_CELERY_CONF"] = os.environ["LOUSHO_CHAOS_CELERY_CONF"]
    yield proxy, fleet
    fleet.stop_all()
    proxy.stop()
    drop_queue(direct, fleet.queue)
    direct.close()
    server.stop()


@pytest.mark.timeout(pick(200, 600))
def test_workers_recover_when_every_redis_connection_goes_silent(proxied_fleet: tuple[Blackhole, ChaosFleet]) -> None:
    proxy, fleet = proxied_fleet
    rng = random.Random(SEED + 40)
    sessions = [f"h{i:03d}" for i in range(SESSIONS)]
    scripts = {s: random_script(rng, s, gates=False) for s in sessions}
    install_scripts(fleet, rng, scripts)
    for _ in range(3):
        fleet.start_worker()
    fleet.start_reaper(interval_s=0.3)
    started = time.monotonic()
    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    recovery: list[float] = []
    for _ in range(CUTS):
        time.sleep(rng.uniform(1.0, 2.0))
        before = finished_count(fleet, sessions)
        for worker in fleet.alive():  # whatever a worker was running may be cut short
            fleet.note_interrupted(worker.pid)
        fleet.faults["connections silently dropped"] += proxy.cut()
        fleet.faults["blackouts"] += 1
        cut_at = time.monotonic()
        while time.monotonic() - cut_at < pick(150, 200) and finished_count(fleet, sessions) == before < len(sessions):
            time.sleep(0.25)
        recovery.append(time.monotonic() - cut_at)
        for worker in fleet.alive():
            fleet.note_interrupted(worker.pid)
    deadline = time.monotonic() + pick(150, 300)
    while time.monotonic() < deadline and settled_count(fleet, sessions) < len(sessions):
        time.sleep(0.25)
    elapsed = time.monotonic() - started

    violations, figures = check_sessions(fleet, scripts)
    logs = fleet.worker_logs()
    figures["first session finished after a blackout"] = ", ".join(f"{r:.1f} s" for r in recovery)
    # Celery's log of an ack that raised, and lousho's of a turn's acks that could not leave Redis (broker_qos.py)
    figures["acks that failed"] = logs.count("Couldn't ack") + logs.count("acknowledged messages from Redis")
    figures["stale BRPOP/pub-sub connections dropped"] = logs.count("dropping stale connection")
    figures["workers alive"] = len(fleet.alive())
    record(Row("half-open connections (every Redis connection blackholed)", len(sessions), "sessions",
               dict(fleet.faults), violations, elapsed, dict(figures)))  # fmt: skip
    assert violations == [], "\n".join(violations[:30]) + "\n" + logs[-6000:]
