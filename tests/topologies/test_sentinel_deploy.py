"""deploy/ for Redis Sentinel (issue #18): what can be checked without Docker. The compose overlay parses with
what it must hold (replicas, sentinels, the lousho services' Sentinel URL and replica acknowledgement), and the
sentinel's config file is what a sentinel reads: one started with it (the primary's name pointed at a private
primary) watches that primary with the file's quorum and timeouts."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis
import yaml

from lousho.settings import LoushoSettings
from lousho.stores.redis_sentinel import SentinelAddress
from lousho.testing.redis_cluster import free_port
from lousho.testing.sentinel import SentinelGroup, sentinel_binary
from tests.ops.test_deploy import DEPLOY
from tests.topologies.test_sentinel import require_sentinel_binary

CONF = DEPLOY / "sentinel" / "sentinel.conf"


def test_the_compose_overlay_gives_workers_beat_and_flower_the_sentinels_and_replica_acknowledgement() -> None:
    base = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    overlay = yaml.safe_load((DEPLOY / "docker-compose.sentinel.yml").read_text())["services"]
    sentinels = sorted(name for name in overlay if name.startswith("sentinel-"))
    replicas = [name for name in overlay if name.startswith("redis-replica-")]
    assert len(sentinels) == 3 and len(replicas) == 2  # one replica is left to confirm saves after a failover
    for name in replicas:
        assert overlay[name]["command"][1:4] == ["--replicaof", "redis", "6379"]  # the base file's Redis
    for name in sentinels:
        mounted = next(v for v in overlay[name]["volumes"] if v.startswith("./sentinel/"))
        assert (DEPLOY / mounted.split(":")[0]).resolve() == CONF.resolve()
    for name in ("worker", "beat", "flower"):
        assert name in base  # an overlay of the services the base file has
        env = overlay[name]["environment"]
        address = SentinelAddress.parse(env["LOUSHO_REDIS_URL"])
        assert sorted(host for host, _ in address.sentinels) == sentinels and address.master == "mymaster"
        settings = LoushoSettings(
            redis_url=env["LOUSHO_REDIS_URL"], min_replicas_acked=env["LOUSHO_MIN_REPLICAS_ACKED"]
        )
        assert settings.fleet.min_replicas_acked == 1
        assert settings.broker() == env["LOUSHO_REDIS_URL"]  # the broker too (celery_config gives kombu its form)


@pytest.mark.slow  # 2-7 s: out of `scripts/check --fast` (issue #33)
def test_a_sentinel_started_with_the_deploy_config_watches_the_primary_with_its_quorum() -> None:
    require_sentinel_binary()
    binary = sentinel_binary()
    assert binary is not None
    with SentinelGroup(replicas=0, sentinels=0) as group, tempfile.TemporaryDirectory() as folder:
        port = free_port()
        primary = group.data_ports[0]
        text = (
            CONF.read_text()
            .replace("port 26379", f"port {port}")
            .replace("mymaster redis 6379", f"mymaster 127.0.0.1 {primary}")
        )
        conf = Path(folder) / "sentinel.conf"
        conf.write_text(text)
        process = subprocess.Popen([binary, str(conf), "--sentinel"], cwd=folder, stdout=subprocess.DEVNULL)
        try:
            state = watched(port)
            assert state["ip"] == "127.0.0.1" and state["port"] == str(primary)
            assert (state["quorum"], state["down-after-milliseconds"], state["failover-timeout"]) == (
                "2",
                "5000",
                "60000",
            )
        finally:
            process.kill()
            process.wait(timeout=10)


def watched(port: int) -> dict[str, str]:
    deadline = time.monotonic() + 20
    while True:
        try:
            with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as sentinel:
                state = sentinel.execute_command("SENTINEL", "MASTER", "mymaster")
                return dict(zip(state[::2], state[1::2], strict=False))
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
