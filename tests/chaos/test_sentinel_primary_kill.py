"""A Redis Sentinel primary is SIGKILLed mid-run (issue #18), with and without replica acknowledgement.

Store and broker are one `redis+sentinel://` URL on a private group (a primary, two replicas, a sentinel;
`lousho.testing.sentinel`): workers, the client and a real `lousho reaper` process follow the master the
sentinel names. Each crash kills the master; a replica takes over about a second later (down-after 1000 ms),
and the killed server rejoins, empty, as a replica (so two replicas stay for the next crash).

What a failover lost is measured against a record kept outside Redis: each worker appends every
save it was told stood to a file, and every commit of a call's result. Right after each failover the workers are
frozen (SIGSTOP) while the new master is compared with that record. With `min_replicas_acked=1` (each save waits for
`WAIT 1`) nothing may be missing, and no version may be acknowledged twice (a lost save and its repeat would both
be); without it, replication is asynchronous and what is missing is counted, and its sessions are held to the rules
from the save they have. The workers follow the new master before the test sees it and may redo a lost save or
result first: a version acknowledged twice, or a result committed twice, shows that loss (`acknowledged_twice`).
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from lousho.errors import StoreUnavailableError
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.testing.sentinel import SentinelGroup
from lousho.worker import FleetSettings
from tests.chaos.harness import (
    SEED,
    Approver,
    Background,
    ChaosFleet,
    Row,
    acknowledged_twice,
    check_each_version_acked_once,
    check_sessions,
    decide_lost_approvals_again,
    decide_pending_again,
    drop_queue,
    install_scripts,
    pick,
    random_script,
    record,
    save_log,
    settled_count,
)
from tests.topologies.test_sentinel import require_sentinel_binary

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(12, 60)
CRASHES = pick(1, 3)
ACK_TIMEOUT_MS = 2000
ROOT = str(Path(__file__).resolve().parents[2])

REAPER = """
import sys
from lousho.scheduler import Client, run_reaper
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings
url, prefix, queue = sys.argv[1:4]
settings = FleetSettings(queue=queue, lease_ttl_s=2.0, reaper_interval_s=0.3, requeue_backoff_s=3.0)
client = Client(broker=url, store=RedisStore(url, prefix=prefix), settings=settings)
print("reaper up", flush=True)
run_reaper(client.store, client.app, settings)
"""


class SplitClient:
    """The test's Redis client as the harness uses it: commands on the fleet's session keys (hash-tagged, `{`)
    go to the Sentinel master, the test's own probes (scripts, counters, run logs) to the standalone Redis,
    where a failover cannot lose them: a probe is not what is under test."""

    def __init__(self, fleet_client: redis.Redis, standalone: redis.Redis) -> None:
        self.fleet_client, self.standalone = fleet_client, standalone

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else kwargs.get("match", "")
            target = self.fleet_client if isinstance(first, str) and "{" in first else self.standalone
            return getattr(target, name)(*args, **kwargs)

        return call


@dataclass
class SentinelChaosFleet(ChaosFleet):
    split: Any = None

    @property
    def redis(self) -> Any:
        return self.split


@pytest.fixture
def sentinel_chaos_fleet(
    request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[tuple[SentinelGroup, ChaosFleet, int]]:
    require_sentinel_binary()
    acked = int(request.param)
    with SentinelGroup() as group:
        prefix = f"chaos-{uuid.uuid4().hex[:8]}:"
        queue = f"lousho-chaos-{uuid.uuid4().hex[:12]}"
        env = {
            "LOUSHO_TEST_FLEET_REDIS": group.url,  # the store and the broker (the outbox stays on)
            "LOUSHO_TEST_PROBE_REDIS": redis_url,
            "LOUSHO_TEST_FLEET_PREFIX": prefix,
            "LOUSHO_TEST_FLEET_QUEUE": queue,
            "LOUSHO_TEST_LEASE_TTL_S": "2.0",
            "LOUSHO_TEST_TRACK": "1",
            "LOUSHO_TEST_STORE_OPTIONS": json.dumps(
                {"min_replicas_acked": acked, "replica_ack_timeout_ms": ACK_TIMEOUT_MS}
            ),
            "PYTHONPATH": ROOT,
        }
        store = RedisStore(group.url, prefix=prefix)
        settings = FleetSettings(
            queue=queue, lease_ttl_s=2.0, min_replicas_acked=acked, replica_ack_timeout_ms=ACK_TIMEOUT_MS
        )
        client = Client(broker=group.url, store=store, settings=settings)
        fleet = SentinelChaosFleet(
            env=env, queue=queue, prefix=prefix, store=store, client=client, log_dir=str(tmp_path),
            split=SplitClient(store.client, redis_client),
        )  # fmt: skip
        try:
            yield group, fleet, acked
        finally:
            fleet.stop_all()
            client.app.close()
            store.close()
            drop_queue(redis_client, queue)
            for key in list(redis_client.scan_iter(match=f"{prefix}*", count=1000)):
                redis_client.delete(key)


@pytest.mark.timeout(pick(240, 600))
@pytest.mark.parametrize("sentinel_chaos_fleet", [1, 0], ids=["replica-ack-on", "replica-ack-off"], indirect=True)
def test_sentinel_primary_sigkilled_mid_run(
    sentinel_chaos_fleet: tuple[SentinelGroup, ChaosFleet, int], tmp_path: Path
) -> None:
    group, fleet, acked = sentinel_chaos_fleet
    rng = random.Random(SEED + 50 + acked)
    saves = tmp_path / "saves"
    saves.mkdir()
    fleet.env["LOUSHO_TEST_SAVE_LOG"] = str(saves)
    sessions = [f"n{i:03d}" for i in range(SESSIONS)]
    scripts = {s: random_script(rng, s) for s in sessions}
    install_scripts(fleet, rng, scripts)
    for _ in range(3):
        fleet.start_worker()
    reaper_log = tmp_path / "reaper.log"
    with open(reaper_log, "wb") as out:
        reaper = subprocess.Popen(
            [sys.executable, "-c", REAPER, group.url, fleet.prefix, fleet.queue], cwd=ROOT, stdout=out, stderr=out
        )
    approver = Approver(fleet, SEED + 51)
    awake = threading.Event()
    awake.set()
    typed_errors: list[str] = []
    decided_again: list[int] = []

    def approve() -> None:
        if not awake.is_set():
            return
        try:
            approver()
            if not acked:  # a decision a failover lost shows pending again: the human decides it again (as on a Cluster)
                decided_again.append(decide_pending_again(fleet, approver))
        except StoreUnavailableError as exc:  # no master for a moment: a typed error, retried later
            typed_errors.append(exc.code)

    helpers = Background()
    helpers.every(0.1, approve, "approver")
    started = time.monotonic()
    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    lost: dict[str, int] = {}
    recoveries: list[float] = []
    lost_decisions = 0
    try:
        for _ in range(CRASHES):
            time.sleep(rng.uniform(1.0, 3.0))
            killed_at = time.monotonic()
            old = group.kill_primary()  # SIGKILL: the replicas have what was replicated, nothing more
            fleet.faults["sentinel primary SIGKILL"] += 1
            group.wait_failover(old, timeout_s=60)
            recoveries.append(time.monotonic() - killed_at)
            awake.clear()
            for worker in fleet.alive():  # frozen only while the store is compared with the record
                worker.kill(signal.SIGSTOP)
            for session, versions in _lost_saves(fleet, sessions, saves).items():
                lost[session] = lost.get(session, 0) + versions
            if not acked:  # with `min_replicas_acked` a decision is WAITed: one shown pending again stays a violation
                lost_decisions += decide_lost_approvals_again(fleet, approver)
            for worker in fleet.alive():  # a run whose save failed during the failover runs again
                fleet.note_interrupted(worker.pid)
                worker.kill(signal.SIGCONT)
            awake.set()
            group.restart(old)  # it rejoins as a replica of the new master
        deadline = time.monotonic() + pick(150, 500)
        while time.monotonic() < deadline and _settled(fleet, sessions) < len(sessions):
            time.sleep(0.25)
    finally:
        helpers.stop()
        for worker in fleet.alive():
            worker.kill(signal.SIGCONT)
        reaper_alive = reaper.poll() is None
        reaper.kill()
        reaper.wait(timeout=10)
    elapsed = time.monotonic() - started

    unacknowledged = _allow_repeats_after_unacknowledged_writes(fleet)
    redone = set() if acked else acknowledged_twice(fleet, saves)  # with `WAIT`, a version acked twice is a violation
    for session in redone:
        lost.setdefault(session, 0)
    violations, figures = check_sessions(fleet, scripts, approver)
    if acked:
        violations += [f"{s}: {n} acknowledged save(s) lost in a failover" for s, n in sorted(lost.items())]
        violations += check_each_version_acked_once(saves)
    else:  # asynchronous replication: a lost save is measured; its session is held to the rules from the save it has,
        # and it must still finish, unless the failover lost it whole (its enqueue): that one is gone, and counted
        violations = [v for v in violations if not any(v.startswith(s) for s in lost) or _stuck(v)]
        figures["sessions lost whole (their enqueue)"] = sum(fleet.client.status(s).status == "unknown" for s in lost)
        figures["approval decisions lost in a failover (shown pending again, decided again)"] = lost_decisions
        figures["approvals pending again at another time (decided again)"] = sum(decided_again)
    violations += approver.violations + helpers.errors
    violations += [f"not a typed error during the failover: {e}" for e in typed_errors if not e.startswith("LOUSHO_")]
    if not reaper_alive:
        violations.append(f"the reaper process died: {reaper_log.read_text()[-2000:]}")
    figures["acknowledged saves lost"] = sum(lost.values())
    figures["sessions that redid a lost save before the check (a version acknowledged twice)"] = len(redone)
    figures["sessions that lost one"] = len(lost)
    figures["time to a new master"] = ", ".join(f"{s:.1f} s" for s in recoveries)
    figures["typed errors during failovers"] = len(typed_errors)
    figures["steps whose write was not acknowledged (typed error)"] = unacknowledged
    scenario = f"Redis Sentinel primary SIGKILL, replica ack {'on' if acked else 'off'}"
    record(Row(scenario, len(sessions), "sessions", dict(fleet.faults), violations, elapsed, dict(figures)))
    assert violations == [], "\n".join(violations[:30]) + "\n" + fleet.worker_logs()[-8000:]


_WRITE_FAILED = re.compile(r"session '([^']+)': \[(LOUSHO_SAVE_NOT_REPLICATED|LOUSHO_STORE_UNAVAILABLE)\]")


def _allow_repeats_after_unacknowledged_writes(fleet: ChaosFleet) -> int:
    """A step whose save or result commit ended in a typed error (no master, or `WAIT` short of its
    replicas) was not told it stood: the write may vanish in the next failover and the session repeat
    that step, so each call of such a session may run once more per such error (the harness's ledger
    counts only runs a fault cut short). What was acknowledged is held to the strict rule instead:
    `_lost_saves`, `check_each_version_acked_once`. The number of such errors."""
    failed = Counter(m.group(1) for m in _WRITE_FAILED.finditer(fleet.worker_logs()))
    for call, session in fleet.call_session.items():
        fleet.interrupted[call] += failed.get(session, 0)
    return sum(failed.values())


def _lost_saves(fleet: ChaosFleet, sessions: list[str], saves: Path) -> dict[str, int]:
    """Per session, how many versions it was told stood that the new master lacks."""
    acked = dict.fromkeys(sessions, 1)  # the client's first save of each job
    for session, version, *_ in save_log(saves):
        acked[session] = max(acked.get(session, 0), version)
    for _ in range(100):
        try:
            stored = {s: (cp.version if (cp := fleet.store.checkpoints.load(s)) else 0) for s in sessions}
            break
        except StoreUnavailableError:
            time.sleep(0.1)
    else:
        raise AssertionError("the store stayed unreadable after the failover")
    return {s: acked[s] - stored[s] for s in sessions if stored[s] < acked[s]}


def _settled(fleet: ChaosFleet, sessions: list[str]) -> int:
    """Sessions finished or parked, and those a failover lost whole (no checkpoint): none of them moves any more."""
    try:
        gone = set(sessions) - set(fleet.store.checkpoints.sessions())
        return settled_count(fleet, sessions) + len(gone)
    except StoreUnavailableError:
        return 0


def _stuck(violation: str) -> bool:
    """A session that is still there and did not finish: a lost save excuses what it redid, never that."""
    return "not finished (" in violation and "not finished (unknown" not in violation
