"""A Redis Sentinel primary SIGKILLed mid-run (issue #18): with replica acknowledgement on (`min_replicas_acked=1`:
each save waits for `WAIT 1`) no save a worker or the client was told stood is missing on the new primary; with it
off the loss is measured (it may be 0 in a run: not asserted) and every session still finishes with the guarantees.
The test's probes (scripts, counters, run logs) live on the run's standalone Redis: a failover must not take the
record of what happened with it."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lousho import Message
from lousho.errors import StoreUnavailableError
from lousho.scheduler.reaper import run_reaper
from lousho.stores.redis import RedisStore
from lousho.testing.sentinel import SentinelGroup
from lousho.worker import FleetSettings
from tests.fleet.conftest import Fleet, tool_turn
from tests.fleet.test_fleet_crashes import assert_guarantees
from tests.topologies.test_sentinel import ProbedFleet, close_fleet, require_sentinel_binary, sentinel_fleet

pytestmark = [pytest.mark.slow, pytest.mark.workers]


@pytest.fixture
def own_sentinel_group() -> Iterator[SentinelGroup]:
    require_sentinel_binary()
    with SentinelGroup() as group:
        yield group


def saves_logged(folder: Path) -> dict[str, int]:
    """The highest version of each session that a worker was told stood (its save log, outside Redis)."""
    acked: dict[str, int] = {}
    for log in folder.glob("saves-*.log"):
        for line in log.read_text().splitlines():
            session, version = line.split("\t")[:2]
            acked[session] = max(acked.get(session, 0), int(version))
    return acked


def stored_versions(store: RedisStore, sessions: list[str]) -> dict[str, int]:
    for _ in range(100):
        try:
            return {s: (cp.version if (cp := store.checkpoints.load(s)) else 0) for s in sessions}
        except StoreUnavailableError:
            time.sleep(0.1)
    raise AssertionError("the store stayed unreadable after the failover")


def wait_through_failover(fleet: Fleet, sessions: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: BaseException = AssertionError("no wait")
    while time.monotonic() < deadline:
        try:
            fleet.wait_for(sessions, timeout_s=5)
            return
        except (AssertionError, StoreUnavailableError) as exc:
            last = exc
    raise last


def run_through_a_failover(group: SentinelGroup, fleet: ProbedFleet, tmp_path: Path) -> int:
    """Ten sessions on three workers and `lousho reaper`'s loop; the primary is SIGKILLed while tools run.
    Right after the failover the workers are frozen and every save they were told stood (the client's first
    saves too) is looked for on the new primary. The saves lost; every session must then finish."""
    saves = tmp_path / "saves"
    saves.mkdir()
    fleet.env["LOUSHO_TEST_SAVE_LOG"] = str(saves)
    sessions = [f"f{i:02d}" for i in range(10)]
    for session in sessions:
        fleet.script(session, [
            tool_turn((f"{session}-a", "work", {"n": 1, "sleep_s": 0.3})),
            tool_turn((f"{session}-b", "work", {"n": 2, "sleep_s": 0.3})),
            Message.assistant("done"),
        ])  # fmt: skip
    for _ in range(3):
        fleet.start_worker()
    stop = threading.Event()
    reaper_store = RedisStore(group.url, prefix=fleet.prefix)  # its own client, as `lousho reaper` has
    settings = FleetSettings(queue=fleet.queue, reaper_interval_s=0.3, requeue_backoff_s=3.0)
    reaper = threading.Thread(target=run_reaper, args=(reaper_store, fleet.client.app, settings), kwargs={"stop": stop})
    reaper.start()
    try:
        for session in sessions:
            fleet.client.enqueue("jobs", f"job {session}", session_id=session)
        fleet.pid_running("f03-a")
        old = group.kill_primary()
        group.wait_failover(old)
        for worker in fleet.workers:
            worker.kill(signal.SIGSTOP)
        acked = {**dict.fromkeys(sessions, 1), **saves_logged(saves)}
        stored = stored_versions(fleet.store, sessions)
        lost = sum(max(0, version - stored[session]) for session, version in acked.items())
        for worker in fleet.workers:
            worker.kill(signal.SIGCONT)
        wait_through_failover(fleet, sessions, timeout_s=120)
        assert_guarantees(fleet, sessions)
        return lost
    finally:
        for worker in fleet.workers:
            worker.kill(signal.SIGCONT)
        stop.set()
        reaper.join(timeout=10)
        reaper_store.close()


@pytest.mark.timeout(180)
def test_a_primary_failover_loses_no_acknowledged_save_with_replica_acknowledgement(
    own_sentinel_group: SentinelGroup, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    fleet = sentinel_fleet(own_sentinel_group, redis_prefix, tmp_path, probe_url=redis_url, acked=1)
    try:
        assert run_through_a_failover(own_sentinel_group, fleet, tmp_path) == 0
    finally:
        close_fleet(fleet)


@pytest.mark.timeout(180)
def test_a_primary_failover_without_replica_acknowledgement_still_finishes_every_session(
    own_sentinel_group: SentinelGroup, redis_url: str, redis_prefix: str, tmp_path: Path,
    record_property: pytest.RecordProperty,
) -> None:  # fmt: skip
    fleet = sentinel_fleet(own_sentinel_group, redis_prefix, tmp_path, probe_url=redis_url, acked=0)
    try:
        lost = run_through_a_failover(own_sentinel_group, fleet, tmp_path)
    finally:
        close_fleet(fleet)
    record_property("acknowledged_saves_lost", lost)  # measured, not asserted: asynchronous replication
    print(f"acknowledged saves lost in a failover without replica acknowledgement: {lost}")
