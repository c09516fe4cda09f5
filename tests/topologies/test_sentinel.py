"""The fleet on Redis Sentinel (issue #18): store and broker both named by one `redis+sentinel://` URL, on a
private group (a primary, two replicas, a sentinel; `lousho.testing.sentinel`).

The URL forms; replica acknowledgement (`min_replicas_acked`: `WAIT` after each save); a failover that demotes
the store's master; the fleet's crash test (a SIGKILL mid-tool), the approval across a worker restart and the
zombie scenario through Sentinel; the docs' example. A primary SIGKILLed mid-run: test_sentinel_failover.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from lousho import Message
from lousho.checkpoint import Checkpoint
from lousho.errors import ConfigurationError, SaveNotReplicatedError, StoreUnavailableError
from lousho.fleet.settings import celery_config
from lousho.fleet.transport import rejected_key
from lousho.scheduler import Client
from lousho.settings import LoushoSettings
from lousho.stores.redis import RedisStore
from lousho.stores.redis_approvals import RedisApprovalStore
from lousho.stores.redis_checkpoints import RedisCheckpointStore
from lousho.stores.redis_sentinel import SentinelAddress, kombu_broker
from lousho.stores.registry import open_store
from lousho.testing.sentinel import SentinelGroup, sentinel_binary
from lousho.testing.store_contract import StoreContract
from lousho.testing.store_contract.samples import sample_snapshot
from lousho.worker import FleetSettings, create_app
from lousho.worker.outbox import Outbox
from tests.chaos import test_lost_and_duplicate_messages as lost_and_duplicate
from tests.chaos import test_zombie_workers as zombies
from tests.chaos.harness import ChaosFleet, record
from tests.fleet.conftest import ROOT, tool_turn
from tests.fleet.test_fleet_approvals_and_abort import (
    test_an_approval_is_resolved_from_another_process_and_finishes_on_another_worker as approval_across_workers,
)
from tests.fleet.test_fleet_crashes import assert_guarantees
from tests.ops.conftest import run_clean
from tests.topologies.test_topologies_doc import python_blocks

pytestmark = [pytest.mark.slow, pytest.mark.workers]


def require_sentinel_binary() -> None:
    if sentinel_binary() is None:
        reason = "redis-server not found: the Redis Sentinel tests need it (apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(f"in CI every topology is tested: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def sentinel_group() -> Iterator[SentinelGroup]:
    """One group for this module's tests that kill no server (each has its own prefix)."""
    require_sentinel_binary()
    with SentinelGroup() as group:
        yield group


@pytest.fixture
def own_sentinel_group() -> Iterator[SentinelGroup]:
    require_sentinel_binary()
    with SentinelGroup() as group:
        yield group


@dataclass
class ProbedFleet(ChaosFleet):
    """A `Fleet` (with the chaos suite's fault ledger) whose test probes (scripts, counters, run logs) live on another Redis than the store: a
    failover must not take the record of what happened with it."""

    probe: redis.Redis | None = None

    @property
    def redis(self) -> redis.Redis:
        return self.probe if self.probe is not None else self.store.client


def sentinel_fleet(
    group: SentinelGroup, prefix: str, log_dir: Path, *, probe_url: str = "", acked: int = 0
) -> ProbedFleet:
    """Workers, client and store on the group's URL (store and broker alike: the outbox stays on)."""
    queue = f"lousho-test-{uuid.uuid4().hex[:12]}"
    env = {
        "LOUSHO_TEST_FLEET_REDIS": group.url,
        "LOUSHO_TEST_FLEET_PREFIX": prefix,
        "LOUSHO_TEST_FLEET_QUEUE": queue,
        "LOUSHO_TEST_STORE_OPTIONS": json.dumps({"min_replicas_acked": acked, "replica_ack_timeout_ms": 2000}),
        "PYTHONPATH": ROOT,
    }
    if probe_url:
        env["LOUSHO_TEST_PROBE_REDIS"] = probe_url
    store = RedisStore(group.url, prefix=prefix)
    settings = FleetSettings(queue=queue, lease_ttl_s=2.0, min_replicas_acked=acked, replica_ack_timeout_ms=2000)
    client = Client(broker=group.url, store=store, settings=settings)
    probe = redis.Redis.from_url(probe_url) if probe_url else None
    return ProbedFleet(
        env=env, queue=queue, prefix=prefix, store=store, client=client, log_dir=str(log_dir), probe=probe
    )


def close_fleet(fleet: ProbedFleet) -> None:
    fleet.stop_all()
    fleet.client.app.close()
    fleet.store.close()
    if fleet.probe is not None:
        for key in list(fleet.probe.scan_iter(match=f"{fleet.prefix}*", count=1000)):
            fleet.probe.delete(key)
        fleet.probe.close()


@pytest.fixture
def fleet_on_sentinel(sentinel_group: SentinelGroup, redis_prefix: str, tmp_path: Path) -> Iterator[ProbedFleet]:
    fleet = sentinel_fleet(sentinel_group, redis_prefix, tmp_path)
    yield fleet
    close_fleet(fleet)


# -- the URL forms ------------------------------------------------------------------------------------


def test_a_sentinel_url_names_its_sentinels_master_db_and_password() -> None:
    address = SentinelAddress.parse("redis+sentinel://:s%40cret@h1:26379,h2:26380/mymaster/2")
    assert address.sentinels == (("h1", 26379), ("h2", 26380))
    assert (address.master, address.db, address.password) == ("mymaster", 2, "s@cret")
    broker, options = kombu_broker("redis+sentinel://h1:26379,h2:26380/mymaster/2")
    assert broker == "sentinel://h1:26379/2;sentinel://h2:26380/2"
    assert options == {"master_name": "mymaster"}
    config = celery_config("redis+sentinel://h1:26379/mymaster", FleetSettings())
    assert config["broker_url"] == "sentinel://h1:26379/0"
    assert config["broker_transport_options"]["master_name"] == "mymaster"
    assert config["broker_transport_options"]["visibility_timeout"] == 3600  # lousho's own options are kept


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://h1:26379",
        "redis+sentinel://h1:26379/",
        "redis+sentinel://h1/mymaster",
        "redis+sentinel://h1:1/m/x",
    ],
)
def test_a_sentinel_url_without_master_or_port_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="redis\\+sentinel://"):
        RedisStore(url)


def test_lousho_store_url_and_redis_url_open_a_sentinel_store(sentinel_group: SentinelGroup, redis_prefix: str) -> None:
    for store in (
        open_store(sentinel_group.url, prefix=redis_prefix),  # LOUSHO_STORE_URL
        LoushoSettings(redis_url=sentinel_group.url, prefix=redis_prefix).redis_store(),  # LOUSHO_REDIS_URL
    ):
        assert isinstance(store, RedisStore)
        assert "Redis Sentinel master 'mymaster'" in repr(store)  # never a server's address: it moves
        store.checkpoints.save("opened", checkpoint("opened", 1))
        assert store.checkpoints.load("opened") is not None
        store.checkpoints.delete("opened")
        store.close()


def test_replica_acknowledgement_refuses_nonsense_settings(sentinel_group: SentinelGroup) -> None:
    with pytest.raises(ConfigurationError, match="min_replicas_acked"):
        RedisStore(sentinel_group.url, min_replicas_acked=-1)
    with pytest.raises(ConfigurationError, match="replica_ack_timeout_ms"):
        RedisStore(sentinel_group.url, min_replicas_acked=1, replica_ack_timeout_ms=0)


# -- replica acknowledgement --------------------------------------------------------------------------


def checkpoint(session: str, version: int) -> Checkpoint:
    return Checkpoint(session_id=session, agent_name="jobs", version=version, messages=[Message.user(f"v{version}")])


def test_an_acknowledged_save_is_on_every_replica_it_waited_for(
    sentinel_group: SentinelGroup, redis_prefix: str
) -> None:
    store = RedisStore(sentinel_group.url, prefix=redis_prefix, min_replicas_acked=2)
    replicas = [
        redis.Redis(port=p, socket_timeout=5) for p in sentinel_group.data_ports if p != sentinel_group.primary_port()
    ]
    try:
        for version in range(1, 30):
            store.checkpoints.save("acked", checkpoint("acked", version))
            heads = [replica.get(store.keys.head("acked")) for replica in replicas]  # read at once, no waiting
            assert all(head is not None and f'"v":{version},'.encode() in head for head in heads), version
    finally:
        store.checkpoints.delete("acked")
        for replica in replicas:
            replica.close()
        store.close()


def test_an_acknowledged_decision_is_on_every_replica_it_waited_for(
    sentinel_group: SentinelGroup, redis_prefix: str
) -> None:
    """A human's decision is a write a failover must not lose either: with replica acknowledgement the pause's
    approval and its decision return only once every replica asked for has them (issue #18)."""
    store = RedisStore(sentinel_group.url, prefix=redis_prefix, min_replicas_acked=2)
    replicas = [
        redis.Redis(port=p, socket_timeout=5) for p in sentinel_group.data_ports if p != sentinel_group.primary_port()
    ]
    try:
        for n in range(10):
            snapshot = sample_snapshot(f"appr_acked{n}", "acked")
            store.approvals.save(snapshot)
            assert all(r.exists(store.keys.approval(snapshot.id)) for r in replicas), n  # read at once, no waiting
            store.approvals.decide(snapshot.id, approved=True, note=f"yes {n}")
            stored = [r.get(store.keys.approval(snapshot.id)) or b"" for r in replicas]
            assert all(b'"approved"' in raw and f"yes {n}".encode() in raw for raw in stored), n
    finally:
        store.close()


def test_a_decision_fewer_replicas_confirm_raises_save_not_replicated(
    sentinel_group: SentinelGroup, redis_prefix: str
) -> None:
    store = RedisStore(sentinel_group.url, prefix=redis_prefix)
    store.approvals.save(sample_snapshot("appr_short", "short"))
    asking = store.with_replica_ack(3, 100)  # two replicas run: the third never confirms
    try:
        with pytest.raises(SaveNotReplicatedError, match="approval 'appr_short'"):
            asking.approvals.decide("appr_short", approved=True, note=None)
        decided = store.approvals.load("appr_short")  # the primary has it: load to see which way it went
        assert decided is not None and decided.status == "approved"
    finally:
        store.close()


def test_a_save_fewer_replicas_confirm_raises_save_not_replicated_and_is_not_counted_as_done(
    sentinel_group: SentinelGroup, redis_prefix: str
) -> None:
    store = RedisStore(sentinel_group.url, prefix=redis_prefix, min_replicas_acked=3, replica_ack_timeout_ms=100)
    assert_a_save_short_of_replicas_is_refused(store, "2 of the 3 replicas")


def assert_a_save_short_of_replicas_is_refused(store: RedisStore, said: str) -> None:
    """A save fewer replicas confirm than `store` asks raises `SaveNotReplicatedError` (the message says `said`),
    is on the primary, and the next save builds on it; the store is closed after."""
    try:
        with pytest.raises(SaveNotReplicatedError, match=said) as raised:
            store.checkpoints.save("short", checkpoint("short", 1))
        assert isinstance(raised.value, StoreUnavailableError)  # handled as an outage: the step is not done
        assert raised.value.code == "LOUSHO_SAVE_NOT_REPLICATED"
        stored = store.checkpoints.load("short")  # the primary has it: the error says to load and see
        assert stored is not None and stored.version == 1
        plain = store.with_replica_ack(0, 1000)
        plain.checkpoints.save("short", checkpoint("short", 2))  # the next save builds on what stands
        assert store.checkpoints.load("short").version == 2  # type: ignore[union-attr]
    finally:
        store.checkpoints.delete("short")
        store.close()


def test_the_outbox_stays_on_when_store_and_broker_name_the_same_sentinel_master(
    sentinel_group: SentinelGroup, redis_prefix: str
) -> None:
    store = RedisStore(sentinel_group.url, prefix=redis_prefix)
    settings = FleetSettings(queue=f"lousho-test-{uuid.uuid4().hex[:8]}")
    app = create_app(agents=[], store=store, broker=sentinel_group.url, settings=settings)
    outbox = Outbox(app, store, settings)
    try:
        assert app.conf.broker_url.startswith("sentinel://127.0.0.1:")
        assert outbox.direct  # the step scripts push onto the queue the workers pop: same master, same db
    finally:
        outbox.close()
        app.close()
        store.close()


def manual_failover(group: SentinelGroup) -> None:
    """`SENTINEL FAILOVER`, asked again while the sentinel has no replica it deems fit yet (NOGOODSLAVE: its
    view of the replicas is refreshed by INFO every few seconds after a start)."""
    deadline = time.monotonic() + 20
    with redis.Redis(port=group.sentinel_ports[0], socket_timeout=5) as sentinel:
        while True:
            try:
                sentinel.execute_command("SENTINEL", "FAILOVER", group.master)
                return
            except redis.ResponseError as exc:
                if "NOGOODSLAVE" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def test_a_store_writes_on_when_a_failover_demotes_the_master_it_is_connected_to(
    own_sentinel_group: SentinelGroup, redis_prefix: str
) -> None:
    """A manual failover leaves the old master running, as a replica: the store's open connection to it
    gets READONLY, which redis-py's Sentinel connection turns into a reconnect to the new master."""
    group = own_sentinel_group
    store = RedisStore(group.url, prefix=redis_prefix, min_replicas_acked=1, replica_ack_timeout_ms=5000)
    try:
        store.checkpoints.save("moved", checkpoint("moved", 1))
        old = group.primary_port()
        # the sentinel may promote either replica; the save waited for one only, so the test waits for both
        # to hold version 1 (a CI run lost it to a failover that promoted the replica that had not got it yet)
        for port in (p for p in group.data_ports if p != old):
            with redis.Redis(port=port, socket_timeout=5) as replica:
                deadline = time.monotonic() + 30
                while not replica.exists(store.keys.head("moved")) and time.monotonic() < deadline:
                    time.sleep(0.05)
        manual_failover(group)
        new = group.wait_failover(old)
        with redis.Redis(port=old, socket_timeout=5) as demoted:  # alive, and made a replica by the sentinel
            deadline = time.monotonic() + 30
            while demoted.info("replication")["role"] != "slave" and time.monotonic() < deadline:
                time.sleep(0.1)
            assert demoted.info("replication")["role"] == "slave"
        store.checkpoints.save("moved", checkpoint("moved", 2))
        stored = store.checkpoints.load("moved")
        assert stored is not None and stored.version == 2
        with redis.Redis(port=new, socket_timeout=5) as master:
            assert master.exists(store.keys.head("moved")) == 1
    finally:
        store.close()


# -- the fleet's crash tests through Sentinel ---------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_fleet_on_sentinel_finishes_every_session_when_a_worker_is_killed_mid_tool(
    fleet_on_sentinel: ProbedFleet,
) -> None:
    fleet = fleet_on_sentinel
    sessions = [f"s{i:02d}" for i in range(8)]
    for session in sessions:
        fleet.script(session, [tool_turn((f"{session}-a", "work", {"n": 2})), Message.assistant(f"{session} done")])
    fleet.script("slow", [tool_turn(("slow-k", "work", {"n": 3, "sleep_s": 3.0})), Message.assistant("slow done")])
    fleet.store.client.lpush(fleet.queue, b"not a task message")  # junk on the queue: set aside, no worker stops
    workers = [fleet.start_worker(), fleet.start_worker()]
    fleet.start_reaper()
    for session in [*sessions, "slow"]:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    fleet.worker_with_pid(fleet.pid_running("slow-k")).kill(signal.SIGKILL)  # dies in the middle of the tool
    fleet.start_worker()
    fleet.wait_for([*sessions, "slow"], timeout_s=90)

    assert_guarantees(fleet, [*sessions, "slow"])
    runs = fleet.counts("runs")
    assert runs.pop("slow-k") == 2  # no recorded result when it died: it ran again, once
    assert set(runs.values()) == {1}
    assert all("transport:   sentinel://" in w.log() for w in workers)  # the broker is reached through Sentinel
    assert fleet.store.client.lrange(rejected_key(fleet.queue), 0, -1) == [b"not a task message"]


@pytest.mark.timeout(120)
def test_an_approval_decided_from_another_process_finishes_across_a_worker_restart_on_sentinel(
    fleet_on_sentinel: ProbedFleet,
) -> None:
    fleet_on_sentinel.env["LOUSHO_TEST_FLEET_BROKER"] = fleet_on_sentinel.env["LOUSHO_TEST_FLEET_REDIS"]
    approval_across_workers(fleet_on_sentinel)


@pytest.mark.timeout(180)
def test_zombie_workers_never_land_a_stale_write_on_sentinel_with_replica_acknowledgement(
    sentinel_group: SentinelGroup, redis_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos suite's zombie scenario, smaller: workers frozen past their lease while others take over,
    then woken; with `WAIT` after each save, a stale save is still refused (fenced) and nothing is waited for."""
    fleet = sentinel_fleet(sentinel_group, redis_prefix, tmp_path, acked=1)
    fleet.env.update(LOUSHO_TEST_LEASE_TTL_S="2.0", LOUSHO_TEST_TRACK="1")
    for name, value in {"SESSIONS": 8, "PAUSES": 3}.items():
        monkeypatch.setattr(zombies, name, value)
    monkeypatch.setattr(
        zombies, "record", lambda row: record(dataclasses.replace(row, scenario=f"{row.scenario}, Redis Sentinel"))
    )
    try:
        zombies.test_zombie_workers_never_land_a_stale_write(fleet, tmp_path)
    finally:
        close_fleet(fleet)


@pytest.mark.timeout(180)
def test_dropped_and_repeated_messages_change_nothing_on_sentinel(
    sentinel_group: SentinelGroup, redis_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos suite's duplicate-delivery scenario, smaller, with store and broker through Sentinel: every
    send of workers, client and reaper dropped or sent twice, seeded; each session ends as it would have."""
    fleet = sentinel_fleet(sentinel_group, redis_prefix, tmp_path)
    fleet.env.update(LOUSHO_TEST_LEASE_TTL_S="2.0", LOUSHO_TEST_TRACK="1")
    monkeypatch.setattr(lost_and_duplicate, "SESSIONS", 10)
    monkeypatch.setattr(
        lost_and_duplicate,
        "record",
        lambda row: record(dataclasses.replace(row, scenario=f"{row.scenario}, Redis Sentinel")),
    )
    try:
        lost_and_duplicate.test_dropped_and_repeated_messages_change_nothing(fleet)
    finally:
        close_fleet(fleet)


# -- docs/topologies.md ---------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_the_sentinel_example_finishes_a_job_whose_approval_is_decided_after_a_failover(tmp_path: Path) -> None:
    require_sentinel_binary()
    [block] = python_blocks("Redis Sentinel")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_")}  # the block says what it uses
    done = run_clean([sys.executable, "-c", block], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, timeout_s=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["Your day in Oslo: sunny, lunch at Casa Oslo (booked for 2).", "True"]


def test_the_replica_ack_bench_measures_each_setting_in_one_run() -> None:
    require_sentinel_binary()
    from bench.replica_ack import measure, render

    figures = measure(rounds=1, steps=3)
    assert sorted(figures.median_ms) == [0, 1, 2] and figures.saves == 3
    assert all(ms > 0 for ms in figures.median_ms.values())
    assert [line.split("|")[1].strip() for line in render(figures).splitlines()[2:5]] == ["0", "1", "2"]


class TestRedisStoreThroughSentinelWithReplicaAck(StoreContract):
    """The whole store contract on a `redis+sentinel://` store whose every save waits for both replicas."""

    @pytest.fixture
    def store_factory(self, sentinel_group: SentinelGroup, redis_prefix: str) -> Callable[..., RedisStore]:
        return lambda **options: RedisStore(
            sentinel_group.url, **{"prefix": redis_prefix, "min_replicas_acked": 2, **options}
        )

    def write_raw(self, checkpoints: RedisCheckpointStore, session_id: str, raw: str | bytes) -> None:
        checkpoints.put_raw(session_id, raw)

    def write_raw_approval(self, approvals: RedisApprovalStore, approval_id: str, raw: str) -> None:
        approvals.put_raw(approval_id, raw)

    def read_raw(self, checkpoints: RedisCheckpointStore, session_id: str) -> Any:
        return checkpoints.client.get(checkpoints.keys.head(session_id))
