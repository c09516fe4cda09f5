"""Fleets whose store is a private Redis Cluster and whose broker is the run's standalone Redis (issue #18), for
tests/topologies/test_cluster.py and the chaos scenario tests/chaos/test_cluster_primary_kill.py."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.testing.redis_cluster import RedisClusterNodes, cluster_binaries
from lousho.worker import FleetSettings, broker_url
from tests.chaos.harness import ChaosFleet, drop_queue
from tests.fleet.conftest import ROOT


def require_cluster_binaries() -> None:
    """Skip, naming what is missing, without redis-server or redis-cli; fail in CI (`CI` set)."""
    server, cli = cluster_binaries()
    missing = [name for name, path in (("redis-server", server), ("redis-cli", cli)) if path is None]
    if missing:
        reason = f"{' and '.join(missing)} not found: the Redis Cluster tests need them (apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(f"in CI every topology is tested: {reason}")
        pytest.skip(reason)


class SplitClient:
    """The test's Redis client as the chaos harness uses it: commands on the fleet's session keys (hash-tagged,
    `{`) go to the cluster; the test's own probes (scripts, counters, run logs, kill triggers) and the broker's
    queue to the standalone Redis, where a failover cannot fail them: a probe is not what is under test."""

    def __init__(self, cluster: redis.Redis, standalone: redis.Redis) -> None:
        self.cluster, self.standalone = cluster, standalone

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else kwargs.get("match", "")
            first = first.decode(errors="replace") if isinstance(first, bytes) else first  # a key SCAN returned
            target = self.cluster if isinstance(first, str) and "{" in first else self.standalone
            return getattr(target, name)(*args, **kwargs)

        return call


@dataclass
class ClusterChaosFleet(ChaosFleet):
    split: Any = None

    @property
    def redis(self) -> Any:
        return self.split


@contextlib.contextmanager
def chaos_fleet_on(
    cluster: RedisClusterNodes, redis_url: str, redis_client: redis.Redis, log_dir: Path
) -> Iterator[ClusterChaosFleet]:
    """The chaos suite's fleet (tracking on, lease 2 s) with its store on `cluster`; its probes and queue on
    `redis_url`, under a prefix of its own; every worker, queue and probe key removed at the end."""
    prefix = f"chaos-{uuid.uuid4().hex[:8]}:"
    queue = f"lousho-chaos-{uuid.uuid4().hex[:12]}"
    env = {
        "LOUSHO_TEST_FLEET_REDIS": cluster.url,
        "LOUSHO_TEST_FLEET_BROKER": broker_url(redis_url),
        "LOUSHO_TEST_PROBE_REDIS": redis_url,
        "LOUSHO_TEST_FLEET_PREFIX": prefix,
        "LOUSHO_TEST_FLEET_QUEUE": queue,
        "LOUSHO_TEST_LEASE_TTL_S": "2.0",
        "LOUSHO_TEST_TRACK": "1",
        "PYTHONPATH": ROOT,
    }
    store = RedisStore(cluster.url, prefix=prefix)
    client = Client(broker=broker_url(redis_url), store=store, settings=FleetSettings(queue=queue, lease_ttl_s=2.0))
    fleet = ClusterChaosFleet(
        env=env, queue=queue, prefix=prefix, store=store, client=client, log_dir=str(log_dir),
        split=SplitClient(store.client, redis_client),
    )  # fmt: skip
    try:
        yield fleet
    finally:
        fleet.stop_all()
        client.app.close()
        drop_queue(redis_client, queue)
        for key in list(redis_client.scan_iter(match=f"{prefix}*", count=1000)):
            redis_client.delete(key)
        with contextlib.suppress(redis.RedisError):  # a cluster left down by a test goes with its nodes
            for key in list(store.client.scan_iter(match=f"{prefix}*", count=1000)):
                store.client.delete(key)
        store.close()
