"""RabbitMQ restarts mid-run (issue #18): the fleet's broker is a private RabbitMQ node, its store the run's
Redis. In the middle of the run the node is stopped and started again on the same data folder (long mode
also SIGKILLs it once): the workers and a real reaper process reconnect, every session finishes with every
guarantee, and no acknowledged save is written twice.

During the outage the store is up: work that was running goes on and saves, its next step cannot be sent
(the outbox is off on RabbitMQ: a step's next task goes through Celery's publish, which fails), and the
web app's `Client` gets typed errors. A job enqueued during the outage is saved before its message is
refused: the reaper sends it once the broker is back. What was on a queue is on disk (durable queues,
persistent messages) and comes back with the node; what was lost, the reaper sends again.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from lousho.errors import SDKError, StoreUnavailableError
from lousho.testing.rabbitmq import RabbitMQNode
from tests.chaos.harness import (
    SEED,
    Approver,
    Background,
    ChaosFleet,
    Row,
    check_each_version_acked_once,
    check_sessions,
    install_scripts,
    pick,
    random_script,
    record,
    save_log,
    settled_count,
)
from tests.fixtures.rabbitmq import AmqpChaosFleet, amqp_fleet, delete_queues

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(8, 60)
RESTARTS = pick(["stop"], ["stop", "SIGKILL", "stop"])
ROOT = str(Path(__file__).resolve().parents[2])

REAPER = """
import sys
from lousho.scheduler import Client, run_reaper
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings
url, prefix, queue, broker = sys.argv[1:5]
settings = FleetSettings(queue=queue, lease_ttl_s=2.0, reaper_interval_s=0.3, requeue_backoff_s=3.0)
client = Client(broker=broker, store=RedisStore(url, prefix=prefix), settings=settings)
print("reaper up", flush=True)
run_reaper(client.store, client.app, settings)
"""


@pytest.fixture
def rabbitmq_chaos(
    rabbitmq_node: RabbitMQNode, redis_url: str, redis_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[tuple[RabbitMQNode, ChaosFleet]]:
    """A chaos fleet on a RabbitMQ node of this test's own (it restarts it) and the run's Redis."""
    fleet = amqp_fleet(
        rabbitmq_node.url, redis_url, redis_prefix, redis_client, tmp_path, AmqpChaosFleet,
        LOUSHO_TEST_LEASE_TTL_S="2.0", LOUSHO_TEST_TRACK="1",
    )  # fmt: skip
    yield rabbitmq_node, fleet
    fleet.stop_all()
    fleet.client.app.close()
    if rabbitmq_node.running:
        delete_queues(rabbitmq_node.url, fleet.queue)


@pytest.mark.slow
@pytest.mark.timeout(pick(240, 600))
def test_rabbitmq_restarted_mid_run(rabbitmq_chaos: tuple[RabbitMQNode, ChaosFleet], tmp_path: Path) -> None:
    node, fleet = rabbitmq_chaos
    rng = random.Random(SEED + 30)
    saves = tmp_path / "saves"
    saves.mkdir()
    fleet.env["LOUSHO_TEST_SAVE_LOG"] = str(saves)
    sessions = [f"q{i:03d}" for i in range(SESSIONS)]
    scripts = {s: random_script(rng, s) for s in [*sessions, *(f"down{i}" for i in range(len(RESTARTS)))]}
    install_scripts(fleet, rng, scripts)
    for _ in range(3):
        fleet.start_worker()
    reaper, reaper_log = _start_reaper(fleet, node.url, tmp_path)
    approver = Approver(fleet, SEED + 31)
    helpers = Background()
    helpers.every(0.1, approver, "approver")
    typed_errors: list[str] = []
    restarts: list[tuple[float, float]] = []  # (down at, back up at), unix time
    started = time.monotonic()
    try:
        for session in sessions:
            fleet.client.enqueue("jobs", f"job {session}", session_id=session)
        for n, how in enumerate(RESTARTS):
            time.sleep(rng.uniform(1.0, 2.5))
            for worker in fleet.alive():  # a run cut short by the lost connection may run again
                fleet.note_interrupted(worker.pid)
            down_at = time.time()
            node.stop(kill=how == "SIGKILL", keep_data=True)
            fleet.faults[f"RabbitMQ {'SIGKILL' if how == 'SIGKILL' else 'stop'} + restart"] += 1
            typed_errors += _outage_errors(fleet, f"down{n}")
            sessions.append(f"down{n}")  # saved, its message refused: the reaper must send it
            time.sleep(rng.uniform(0.5, 2.0))
            node.start()  # same port, same data folder
            restarts.append((down_at, time.time()))
        deadline = time.monotonic() + pick(150, 500)
        while time.monotonic() < deadline and settled_count(fleet, sessions) < len(sessions):
            time.sleep(0.25)
    finally:
        helpers.stop()
        reaper_alive = reaper.poll() is None
        reaper.kill()
        reaper.wait(timeout=10)
    elapsed = time.monotonic() - started

    violations, figures = check_sessions(fleet, scripts, approver)
    violations += approver.violations + helpers.errors + check_each_version_acked_once(saves)
    violations += [f"not a typed error during the outage: {e}" for e in typed_errors if e != StoreUnavailableError.code]
    if not reaper_alive:
        violations.append(f"the reaper process died: {reaper_log.read_text()[-2000:]}")
    down_at, up_at = restarts[-1]
    after = [at for *_, at in save_log(saves) if at > up_at]
    figures["outage (stop to node back up)"] = f"{up_at - down_at:.1f} s"
    figures["time to recover (node up to first save)"] = f"{min(after) - up_at:.2f} s" if after else "never"
    figures["typed errors during outages"] = len(typed_errors)
    figures["workers alive at the end"] = len(fleet.alive())
    record(Row("RabbitMQ broker stop/restart mid-run (Redis store)", len(sessions), "sessions", dict(fleet.faults),
               violations, elapsed, dict(figures)))  # fmt: skip
    assert violations == [], "\n".join(violations[:30]) + "\n" + fleet.worker_logs()[-8000:]
    assert len(fleet.alive()) == 3  # every worker reconnected: none died of the outage


def _start_reaper(fleet: ChaosFleet, broker: str, folder: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The real reaper (`run_reaper`) in a process of its own, on the RabbitMQ broker."""
    log = folder / "reaper.log"
    with open(log, "wb") as out:
        command = [
            sys.executable,
            "-c",
            REAPER,
            fleet.env["LOUSHO_TEST_FLEET_REDIS"],
            fleet.prefix,
            fleet.queue,
            broker,
        ]
        return subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out), log


def _outage_errors(fleet: ChaosFleet, session: str) -> list[str]:
    """While the broker is down, what a web app gets from the Client: typed errors only. The enqueue is
    refused after its accepted record is saved (the reaper sends it later)."""
    codes = []
    try:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
        codes.append("an enqueue went through while the broker was down")
    except SDKError as exc:
        codes.append(exc.code)
    except Exception as exc:
        codes.append(f"{type(exc).__name__}: {exc}")
    return codes
