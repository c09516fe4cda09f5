"""Redis itself crashes: a private redis-server with the AOF on is SIGKILLed mid-run and restarted on the
same socket, more than once. Workers (broker and store connections) and a real reaper process reconnect
and every run finishes.

What the crash lost is measured against a record kept outside Redis: each worker appends every
acknowledged save to a file (a line written with os.write survives its own SIGKILL too). Right after
each crash the workers are frozen (SIGSTOP) so nothing writes while the restarted server is compared
with that record, then they are let go. With `appendfsync always` nothing acknowledged may be missing.
With `everysec` a SIGKILL of the *process* loses nothing either in practice: Redis write(2)s the AOF
before it replies, and the kernel keeps what was written; the up-to-a-second window of `everysec` is
for a crash of the whole host (power, kernel), which a test on one machine cannot cause.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from lousho.errors import SDKError, StoreUnavailableError
from lousho.testing.redis_server import RedisServer
from tests.chaos.harness import (
    SEED,
    Approver,
    Background,
    ChaosFleet,
    Row,
    check_sessions,
    drop_queue,
    install_scripts,
    make_fleet,
    pick,
    random_script,
    record,
    save_log,
    settled_count,
)

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(16, 60)
CRASHES = pick(2, 4)
OUTAGE_S = pick(3.0, 8.0)
ROOT = str(Path(__file__).resolve().parents[2])

REAPER = """
import sys
from lousho.scheduler import Client, run_reaper
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url
url, prefix, queue = sys.argv[1:4]
settings = FleetSettings(queue=queue, lease_ttl_s=2.0, reaper_interval_s=0.3, requeue_backoff_s=3.0)
client = Client(broker=broker_url(url), store=RedisStore(url, prefix=prefix), settings=settings)
print("reaper up", flush=True)
run_reaper(client.store, client.app, settings)
"""


@pytest.fixture
def aof_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[RedisServer, ChaosFleet]]:
    server = RedisServer(appendonly=True, appendfsync=request.param)
    url = server.start()
    client = redis.Redis.from_url(url)
    fleet = make_fleet(url, "chaos:", client, tmp_path)
    yield server, fleet
    fleet.stop_all()
    drop_queue(client, fleet.queue)
    client.close()
    server.stop()


@pytest.mark.timeout(pick(240, 600))
@pytest.mark.parametrize("aof_fleet", ["everysec", "always"], indirect=True)
def test_redis_sigkilled_and_restarted_mid_run(aof_fleet: tuple[RedisServer, ChaosFleet], tmp_path: Path) -> None:
    server, fleet = aof_fleet
    fsync = server.appendfsync
    rng = random.Random(SEED + 20)
    saves = tmp_path / "saves"
    saves.mkdir()
    fleet.env["LOUSHO_TEST_SAVE_LOG"] = str(saves)
    sessions = [f"r{i:03d}" for i in range(SESSIONS)]
    scripts = {s: random_script(rng, s) for s in sessions}
    install_scripts(fleet, rng, scripts)
    for _ in range(3):
        fleet.start_worker()
    reaper_log = tmp_path / "reaper.log"
    with open(reaper_log, "wb") as out:
        reaper = subprocess.Popen(
            [sys.executable, "-c", REAPER, server.url, fleet.prefix, fleet.queue], cwd=ROOT, stdout=out, stderr=out
        )
    approver = Approver(fleet, SEED + 21)
    awake = threading.Event()
    awake.set()
    typed_errors: list[str] = []

    def approve() -> None:
        if not awake.is_set():
            return
        try:
            approver()
        except StoreUnavailableError as exc:  # Redis is down: a typed error, the web app retries later
            typed_errors.append(exc.code)

    helpers = Background()
    helpers.every(0.1, approve, "approver")
    acked: dict[str, int] = {}
    started = time.monotonic()
    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
        acked[session] = 1  # the accepted record: acknowledged to this web app
    lost_sessions: set[str] = set()
    lost_saves = 0
    restarts: list[float] = []
    try:
        for _ in range(CRASHES):
            time.sleep(rng.uniform(1.0, 3.0))
            server.stop(kill=True, keep_data=True)  # SIGKILL: no shutdown, no final fsync
            fleet.faults["redis-server SIGKILL"] += 1
            for message in _outage_errors(fleet):
                typed_errors.append(message)
            time.sleep(rng.uniform(0.5, OUTAGE_S))  # the fleet runs on, against a dead Redis
            awake.clear()
            for worker in fleet.alive():  # frozen only while the restarted server is compared with the record
                worker.kill(signal.SIGSTOP)
            for session, version, *_ in save_log(saves):
                acked[session] = max(acked.get(session, 0), version)
            server.start()  # same socket, same folder: the AOF is replayed
            restarts.append(time.time())
            stored = {s: (cp.version if (cp := fleet.store.checkpoints.load(s)) else 0) for s in sessions}
            for session, version in acked.items():
                if stored[session] < version:
                    lost_sessions.add(session)
                    lost_saves += version - stored[session]
            for worker in fleet.alive():  # a run whose result could not be committed during the outage runs again
                fleet.note_interrupted(worker.pid)
                worker.kill(signal.SIGCONT)
            awake.set()
        deadline = time.monotonic() + pick(150, 500)
        while time.monotonic() < deadline and settled_count(fleet, sessions) < len(sessions):
            time.sleep(0.25)
    finally:
        helpers.stop()
        for worker in fleet.alive():
            worker.kill(signal.SIGCONT)
        reaper_alive = reaper.poll() is None
        reaper.kill()
        reaper.wait(timeout=10)
    elapsed = time.monotonic() - started

    violations, figures = check_sessions(fleet, scripts, approver)
    violations = [v for v in violations if not any(v.startswith(f"{s}") for s in lost_sessions)]
    violations += approver.violations + helpers.errors
    violations += [f"not a typed error during the outage: {e}" for e in typed_errors if e != StoreUnavailableError.code]
    if not reaper_alive:
        violations.append(f"the reaper process died: {reaper_log.read_text()[-2000:]}")
    if fsync == "always" and lost_sessions:
        violations.append(f"appendfsync always lost acknowledged saves of {sorted(lost_sessions)}")
    after = [at for *_, at in save_log(saves) if at > restarts[-1]]
    figures["sessions whose last acknowledged save was missing"] = len(lost_sessions)
    figures["acknowledged saves missing"] = lost_saves
    figures["first save after the last restart"] = f"{min(after) - restarts[-1]:.2f} s" if after else "never"
    figures["typed errors during outages"] = len(typed_errors)
    record(Row(f"Redis SIGKILL + restart, AOF appendfsync {fsync}", len(sessions), "sessions", dict(fleet.faults),
               violations, elapsed, dict(figures)))  # fmt: skip
    assert violations == [], "\n".join(violations[:30]) + "\n" + fleet.worker_logs()[-8000:]


def _outage_errors(fleet: ChaosFleet) -> list[str]:
    """While Redis is down, what a web app gets from the Client: typed errors only."""
    codes = []
    client = fleet.client
    for attempt in (
        lambda: client.status("r000"),
        lambda: client.enqueue("jobs", "hi", session_id="down"),
        lambda: client.abort("down"),
        lambda: client.resume("down"),
        lambda: client.sessions(status="parked"),
        lambda: client.approvals(),
    ):
        try:
            attempt()
            codes.append("no error while Redis was down")
        except SDKError as exc:
            codes.append(exc.code)
        except Exception as exc:
            codes.append(f"{type(exc).__name__}: {exc}")
    return codes
