"""A Redis Cluster primary is SIGKILLed mid-run (issue #18): the store is a private 6-node cluster (three
primaries, each with a replica; `lousho.testing.redis_cluster`), the broker the run's standalone Redis. Each
crash kills the primary that serves the most slots now; its replica takes over after `cluster-node-timeout`,
and the workers' and the reaper's cluster clients follow the new slot map. Every run must finish with the
guarantees.

What a failover lost is measured against a record kept outside Redis: each worker appends every
acknowledged save to a file. Replication is asynchronous, so a save the dead primary acknowledged but had
not yet sent to its replica is gone: counted, and its session is held to the rules from the save it has.
A paused session's approval record is several writes in different slots: a failover that lost one of them
is repaired by the reaper (`lousho.scheduler.approval_repair`), so a session still paused without its
record at the end is a violation (issue #18).
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from lousho.errors import StoreUnavailableError
from lousho.fleet.inflight import InflightIndex
from lousho.fleet.liveness import EVER_MS
from lousho.testing.redis_cluster import RedisClusterNodes
from tests.chaos.harness import (
    SEED,
    Approver,
    Background,
    ChaosFleet,
    Row,
    acknowledged_twice,
    check_sessions,
    decide_lost_approvals_again,
    decide_pending_again,
    install_scripts,
    pick,
    random_script,
    record,
    save_log,
    settled_count,
)
from tests.topologies.cluster_fleet import chaos_fleet_on, require_cluster_binaries

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(12, 60)
CRASHES = pick(1, 2)
ROOT = str(Path(__file__).resolve().parents[2])

REAPER = """
import sys
from lousho.scheduler import Client, run_reaper
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url
store_url, broker, prefix, queue = sys.argv[1:5]
settings = FleetSettings(queue=queue, lease_ttl_s=2.0, reaper_interval_s=0.3, requeue_backoff_s=3.0,
                         approval_repair_interval_s=3.0)
client = Client(broker=broker_url(broker), store=RedisStore(store_url, prefix=prefix), settings=settings)
print("reaper up", flush=True)
run_reaper(client.store, client.app, settings)
"""


@pytest.fixture
def cluster_chaos_fleet(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[tuple[RedisClusterNodes, ChaosFleet]]:
    require_cluster_binaries()
    with RedisClusterNodes() as cluster, chaos_fleet_on(cluster, redis_url, redis_client, tmp_path) as fleet:
        yield cluster, fleet


def busiest_primary(cluster: RedisClusterNodes) -> int:
    """The port of the primary that serves the most slots now, among those with a live replica (the one a
    killed primary's replica replaced has none: killing it would leave its slots unserved)."""
    served: dict[int, int] = {}
    deadline = time.monotonic() + 20
    while not served:  # a replica shows in CLUSTER SLOTS once it is attached: right after a start, not yet
        assert time.monotonic() < deadline, "no cluster primary has a replica attached"
        with redis.Redis(port=cluster.live_ports()[0], socket_timeout=2) as node:
            slots = node.execute_command("CLUSTER", "SLOTS")
        for start, end, primary, *replicas in slots:
            if replicas:
                port = int(primary[1])
                served[port] = served.get(port, 0) + int(end) - int(start) + 1
        time.sleep(0 if served else 0.2)
    return max(served, key=lambda port: served[port])


@pytest.mark.timeout(pick(240, 600))
def test_cluster_primary_sigkilled_mid_run(
    cluster_chaos_fleet: tuple[RedisClusterNodes, ChaosFleet], redis_url: str, tmp_path: Path
) -> None:
    cluster, fleet = cluster_chaos_fleet
    rng = random.Random(SEED + 40)
    saves = tmp_path / "saves"
    saves.mkdir()
    fleet.env["LOUSHO_TEST_SAVE_LOG"] = str(saves)
    sessions = [f"k{i:03d}" for i in range(SESSIONS)]
    scripts = {s: random_script(rng, s) for s in sessions}
    install_scripts(fleet, rng, scripts)
    for _ in range(3):
        fleet.start_worker()
    reaper_log = tmp_path / "reaper.log"
    with open(reaper_log, "wb") as out:
        reaper = subprocess.Popen(
            [sys.executable, "-c", REAPER, cluster.url, redis_url, fleet.prefix, fleet.queue],
            cwd=ROOT, stdout=out, stderr=out,
        )  # fmt: skip
    approver = Approver(fleet, SEED + 41)
    awake = threading.Event()
    awake.set()
    typed_errors: list[str] = []
    decided_again: list[int] = []

    def approve() -> None:
        if not awake.is_set():
            return
        try:
            approver()
            decided_again.append(decide_pending_again(fleet, approver))
        except StoreUnavailableError as exc:  # the slot's primary is gone: a typed error, retried later
            typed_errors.append(exc.code)

    helpers = Background()
    helpers.every(0.1, approve, "approver")
    acked = dict.fromkeys(sessions, 1)
    started = time.monotonic()
    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    lost_sessions: set[str] = set()
    lost_saves, lost_decisions, recoveries = 0, 0, []
    try:
        for _ in range(CRASHES):
            time.sleep(rng.uniform(1.0, 3.0))
            victim = busiest_primary(cluster)
            cluster.kill(victim)  # SIGKILL: its replica has what was replicated, nothing more
            fleet.faults["cluster primary SIGKILL"] += 1
            recoveries.append(cluster.wait_failover(victim, timeout_s=60))  # its replica serves its slots now
            awake.clear()
            for worker in fleet.alive():  # frozen only while the store is compared with the record
                worker.kill(signal.SIGSTOP)
            for session, version, *_ in save_log(saves):
                acked[session] = max(acked.get(session, 0), version)
            stored = _stored_versions(fleet, sessions)
            for session, version in acked.items():
                if stored[session] < version:
                    lost_sessions.add(session)
                    lost_saves += version - stored[session]
            lost_decisions += decide_lost_approvals_again(fleet, approver)
            for worker in fleet.alive():  # a run whose commit failed during the failover runs again
                fleet.note_interrupted(worker.pid)
                worker.kill(signal.SIGCONT)
            awake.set()
        deadline = time.monotonic() + pick(150, 500)
        while time.monotonic() < deadline and _settled(fleet, sessions) < len(sessions):
            time.sleep(0.25)  # a session whose approval record a failover lost waits for the reaper's repair
    finally:
        helpers.stop()
        for worker in fleet.alive():
            worker.kill(signal.SIGCONT)
        reaper_alive = reaper.poll() is None
        reaper.kill()
        reaper.wait(timeout=10)
    elapsed = time.monotonic() - started

    redone = acknowledged_twice(fleet, saves)  # lost in a failover and redone before the test looked
    lost_sessions |= redone
    landed = learn_decisions_that_landed(fleet, approver)
    violations, figures = check_sessions(fleet, scripts, approver)
    orphaned = paused_without_their_approval(fleet, sessions)
    violations = [v for v in violations if not any(v.startswith(f"{s}") for s in lost_sessions)]
    violations += [f"{s}: still paused on an approval record the failover lost in part" for s in sorted(orphaned)]
    violations += approver.violations + helpers.errors
    violations += [
        f"not a typed error during the failover: {e}" for e in typed_errors if e != "LOUSHO_STORE_UNAVAILABLE"
    ]
    if not reaper_alive:
        violations.append(f"the reaper process died: {reaper_log.read_text()[-2000:]}")
    figures["acknowledged saves lost (asynchronous replication)"] = lost_saves
    figures["sessions that lost one"] = len(lost_sessions)
    figures["sessions that redid a lost save before the check (a version acknowledged twice)"] = len(redone)
    figures["approval decisions lost in a failover (shown pending again, decided again)"] = lost_decisions
    figures["approvals pending again at another time (decided again)"] = sum(decided_again)
    figures["decisions that landed though their call failed (typed)"] = landed
    repaired = repaired_approval_records(reaper_log.read_text())
    for repair, what in REPAIRS.items():
        figures[f"approval records repaired by the reaper: {what}"] = repaired[repair]
    figures["failover (SIGKILL to the replica serving the slots)"] = ", ".join(f"{s:.1f} s" for s in recoveries)
    figures["typed errors during failovers"] = len(typed_errors)
    record(Row("Redis Cluster primary SIGKILL (replica takes over)", len(sessions), "sessions", dict(fleet.faults),
               violations, elapsed, dict(figures)))  # fmt: skip
    reaper_tail = reaper_log.read_text()[-3000:]
    assert violations == [], (
        "\n".join(violations[:30]) + "\n" + fleet.worker_logs()[-8000:] + "\nreaper:\n" + reaper_tail
    )


REPAIRS = {
    "lost": "approval gone, written again",
    "unlisted": "pending but unlisted, listed again",
    "unapplied": "marked applied, result lost, applied again",
    "undelivered": "decided, out of the in-flight index, sent again",
}


def repaired_approval_records(reaper_log: str) -> Counter[str]:
    """The repairs the reaper's log names (`approval repair: ... <session> (<repair>), ...`), by kind."""
    lines = [line for line in reaper_log.splitlines() if "approval repair:" in line]
    return Counter(m.group(1) for line in lines for m in re.finditer(r"\S+ \((lost|unlisted|unapplied|undelivered)\)", line))


def paused_without_their_approval(fleet: ChaosFleet, sessions: list[str]) -> set[str]:
    """Sessions paused on an approval whose record the failover lost in part: the approval, the pending
    index's entry or the paused checkpoint live in different slots (maybe on different primaries), and a dead
    primary took one of them with it while the others survived. Four ways, each a loss of asynchronous
    replication that the reaper repairs (`lousho.scheduler.approval_repair`, docs/topologies.md#redis-cluster):
    the approval is gone; it is pending but no listing shows it (its index entry is gone); it is marked
    applied while the checkpoint still waits on it (the checkpoint's save of the decision is gone); or it is
    decided while the session is out of the in-flight index (`resolve_approval`'s write after the decision)."""
    listed = {s.id for s in fleet.client.approvals()}
    inflight = dict(InflightIndex.of(fleet.store, 0).due(EVER_MS))
    found = set()
    for session in sessions:
        checkpoint = fleet.store.checkpoints.load(session)
        approval_id = checkpoint.approval_id if checkpoint is not None else None
        if checkpoint is None or checkpoint.status != "awaiting-approval" or approval_id is None:
            continue
        snapshot = fleet.store.approvals.load(approval_id)
        if (
            snapshot is None
            or (snapshot.status == "pending" and approval_id not in listed)
            or snapshot.applied_at is not None
            or (snapshot.status != "pending" and inflight.get(session) is None)
        ):
            found.add(session)
    return found


def learn_decisions_that_landed(fleet: ChaosFleet, approver: Approver) -> int:
    """Decisions the approver made whose call failed with a typed error during a failover, but that were
    written (a later step of `resolve_approval` failed): a web app reads the approval back to see which; so does
    the ledger, from the approver's own note. How many there were."""
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", fleet.prefix) + "approval:*"
    learned = 0
    for key in list(fleet.store.client.scan_iter(match=pattern, count=1000)):
        snapshot = fleet.store.approvals.load(key.decode()[len(f"{fleet.prefix}approval:") :])
        if snapshot is None or snapshot.status == "pending" or snapshot.tool_call.id in approver.decisions:
            continue
        if (snapshot.note or "").startswith("decided by the chaos approver"):
            approver.decisions[snapshot.tool_call.id] = snapshot.status == "approved"
            approver.notes[snapshot.tool_call.id] = snapshot.note or ""
            learned += 1
    return learned


def _stored_versions(fleet: ChaosFleet, sessions: list[str]) -> dict[str, int]:
    """Each session's stored checkpoint version, read again while the clients learn the new slot map."""
    for _ in range(50):
        try:
            return {s: (cp.version if (cp := fleet.store.checkpoints.load(s)) else 0) for s in sessions}
        except StoreUnavailableError:
            time.sleep(0.2)
    raise AssertionError("the store stayed unreadable after the failover")


def _settled(fleet: ChaosFleet, sessions: list[str]) -> int:
    try:
        return settled_count(fleet, sessions)
    except StoreUnavailableError:
        return 0
