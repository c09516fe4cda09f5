"""deploy/ for Redis Cluster and the Kubernetes files of Sentinel and Cluster (issue #18): what can be checked
without Docker or Kubernetes. The compose overlay's six nodes, started here from its own command and joined by
its own `cluster-init` command (hosts mapped to this machine's ports), form a cluster that the lousho services'
settings open as their store, with the base file's Redis as their broker; the Kubernetes objects parse with
what they must hold, and the lousho pods read each topology's URLs."""

from __future__ import annotations

import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from lousho import Checkpoint
from lousho.errors import StoreUnavailableError
from lousho.fleet.settings import broker_url
from lousho.settings import LoushoSettings
from lousho.stores.redis_sentinel import SentinelAddress
from lousho.testing.redis_cluster import cluster_binaries, free_port
from tests.ops.test_deploy import DEPLOY, k8s_docs
from tests.topologies.cluster_fleet import require_cluster_binaries

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

OVERLAY = DEPLOY / "docker-compose.cluster.yml"
POD_SOURCES = ("worker", "beat", "flower")


def topology(name: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for d in k8s_docs()
        if d["metadata"]["labels"].get("lousho.dev/topology") == name
    }


@pytest.fixture
def compose_nodes() -> Iterator[dict[str, int]]:
    """The overlay's six nodes, each started from its own command on a free port: name -> port."""
    require_cluster_binaries()
    server, _ = cluster_binaries()
    services = yaml.safe_load(OVERLAY.read_text())["services"]
    names = sorted(n for n in services if n.startswith("redis-node-"))
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="lousho-compose-cluster-") as folder:
        ports = {}
        for name in names:
            ports[name] = port = free_port()
            data = Path(folder) / name
            data.mkdir()
            command = [str(server), *[a.replace("/data/", f"{data}/") for a in services[name]["command"][1:]]]
            command += [
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(data),
                "--cluster-announce-ip",
                "127.0.0.1",
            ]
            processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            for port in ports.values():
                wait_ping(port)
            yield ports
        finally:
            for process in processes:
                process.kill()
                process.wait(timeout=10)


def wait_ping(port: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            with redis.Redis(port=port, socket_timeout=1) as client:
                if client.ping():
                    return
        except redis.ConnectionError:
            assert time.monotonic() < deadline, f"node on {port} did not start"
            time.sleep(0.05)


def test_the_cluster_overlays_nodes_joined_by_its_init_command_are_the_services_store(
    compose_nodes: dict[str, int], redis_url: str, redis_prefix: str
) -> None:
    services = yaml.safe_load(OVERLAY.read_text())["services"]
    _, cli = cluster_binaries()
    init = services["cluster-init"]["command"][2]
    for name, port in sorted(compose_nodes.items(), key=lambda item: -len(item[0])):
        init = init.replace(f"-h {name}", f"-p {port}").replace(f"{name}:6379", f"127.0.0.1:{port}")
    init = init.replace("redis-cli", shlex.quote(str(cli)))
    done = subprocess.run(["sh", "-c", init], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    store_url = services["worker"]["environment"]["LOUSHO_STORE_URL"]
    for name, port in compose_nodes.items():
        store_url = store_url.replace(f"{name}:6379", f"127.0.0.1:{port}")

    settings = LoushoSettings(store_url=store_url, redis_url=redis_url, prefix=redis_prefix)
    deadline = time.monotonic() + 30
    while True:  # the slots are served once the nodes agree on the new configuration
        try:
            store = settings.redis_store()
            store.checkpoints.save("s-compose", Checkpoint(session_id="s-compose", version=1))
            break
        except (redis.RedisError, StoreUnavailableError):
            assert time.monotonic() < deadline, "the overlay's cluster never served its slots"
            time.sleep(0.5)

    assert type(store.client).__name__ == "RedisCluster"
    assert (loaded := store.checkpoints.load("s-compose")) is not None and loaded.version == 1
    assert settings.broker() == broker_url(redis_url)  # the base file's Redis stays the broker
    for name in POD_SOURCES:
        assert services[name]["depends_on"]["cluster-init"]["condition"] == "service_completed_successfully"
    store.client.close()


def test_the_lousho_pods_read_the_topology_config_after_the_base_config() -> None:
    pods = {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == "Deployment"}
    for name in ("lousho-worker", "lousho-beat", "lousho-flower"):
        sources = pods[name]["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        base = sources.index({"configMapRef": {"name": "lousho-config"}})
        topology_config = sources.index({"configMapRef": {"name": "lousho-topology", "optional": True}})
        assert topology_config > base, name  # a later source wins: the topology's URLs over the base ones


def test_the_kubernetes_cluster_has_six_nodes_joined_with_a_replica_each_and_gives_the_pods_its_store() -> None:
    ours = topology("cluster")
    nodes = ours["StatefulSet", "redis-cluster"]["spec"]
    assert nodes["replicas"] == 6 and ours["Service", "redis-cluster"]["spec"]["clusterIP"] == "None"
    assert nodes["selector"]["matchLabels"].items() <= nodes["template"]["metadata"]["labels"].items()
    command = " ".join(nodes["template"]["spec"]["containers"][0]["command"])
    assert "--cluster-enabled yes" in command and "--cluster-announce-hostname" in command
    init = " ".join(ours["Job", "redis-cluster-init"]["spec"]["template"]["spec"]["containers"][0]["command"])
    assert all(f"redis-cluster-{i}.redis-cluster:6379" in init for i in range(6)) and "--cluster-replicas 1" in init
    store_url = ours["ConfigMap", "lousho-topology"]["data"]["LOUSHO_STORE_URL"]
    assert store_url.startswith("redis+cluster://redis-cluster-0.redis-cluster:6379")
    assert "LOUSHO_REDIS_URL" not in ours["ConfigMap", "lousho-topology"]["data"]  # the broker stays redis.yaml's


def test_the_kubernetes_sentinel_watches_the_primary_pod_and_gives_the_pods_one_url_and_replica_ack() -> None:
    ours = topology("sentinel")
    data, sentinels = ours["StatefulSet", "redis-data"]["spec"], ours["StatefulSet", "redis-sentinel"]["spec"]
    assert data["replicas"] == 3 and sentinels["replicas"] == 3
    conf = ours["ConfigMap", "redis-sentinel-config"]["data"]["sentinel.conf"]
    assert "sentinel monitor mymaster redis-data-0.redis-data 6379 2" in conf
    start = " ".join(data["template"]["spec"]["containers"][0]["command"])
    assert "--replicaof redis-data-0.redis-data 6379" in start
    config = ours["ConfigMap", "lousho-topology"]["data"]
    address = SentinelAddress.parse(config["LOUSHO_REDIS_URL"])
    assert address.master == "mymaster"
    assert sorted(host for host, _ in address.sentinels) == [f"redis-sentinel-{i}.redis-sentinel" for i in range(3)]
    settings = LoushoSettings(
        redis_url=config["LOUSHO_REDIS_URL"], min_replicas_acked=config["LOUSHO_MIN_REPLICAS_ACKED"]
    )
    assert settings.fleet.min_replicas_acked == 1 and settings.broker() == config["LOUSHO_REDIS_URL"]
