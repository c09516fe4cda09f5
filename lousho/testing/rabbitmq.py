"""A private RabbitMQ node for tests, demos and benchmarks: started, stopped, restarted, cleaned up (issue #18).

The node is the machine's own `rabbitmq-server`, started with a node name, AMQP port, distribution port
and data folder of its own (`RABBITMQ_NODENAME`, `RABBITMQ_NODE_PORT`, `RABBITMQ_DIST_PORT`,
`RABBITMQ_MNESIA_BASE`, ...) and no plugins, so nothing else on the machine sees or disturbs it, and a
test may stop it and start it again on the same data (what a broker restart keeps: durable queues and
their persistent messages). Its Erlang cookie is its own too: `HOME` is its folder.

Debian's `/usr/sbin/rabbitmq-server` is a wrapper that switches to the `rabbitmq` user and writes to the
system's log folder; the scripts it wraps (`/usr/lib/rabbitmq/bin`) are used instead when they exist.

Every node started here is ended here: by `stop()`, by the context manager, and, for a run that forgets,
by an `atexit` hook; always by the process group this module started (never by name).
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
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kombu import connection as kombu_connection

__all__ = ["RabbitMQNode", "private_rabbitmq", "rabbitmq_server_executable"]

_UNWRAPPED_SCRIPTS = Path("/usr/lib/rabbitmq/bin")
"""Where Debian's package keeps the scripts its `/usr/sbin` wrapper runs as the `rabbitmq` user."""
_Connection: Any = kombu_connection.Connection  # kombu is untyped
_LIVE: set[RabbitMQNode] = set()
_LIVE_LOCK = threading.Lock()


def rabbitmq_server_executable() -> str | None:
    """The `rabbitmq-server` script to run a private node with, or None when the machine has none."""
    unwrapped = _UNWRAPPED_SCRIPTS / "rabbitmq-server"
    if unwrapped.exists() and os.access(unwrapped, os.X_OK):
        return str(unwrapped)
    return shutil.which("rabbitmq-server") or (
        "/usr/sbin/rabbitmq-server" if os.access("/usr/sbin/rabbitmq-server", os.X_OK) else None
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RabbitMQNode:
    """One private RabbitMQ node on 127.0.0.1, in its own temporary folder.

    `url` is its AMQP URL (user guest, which RabbitMQ lets in from localhost); it stays the same across
    `restart()`. `config_lines` are extra `rabbitmq.conf` lines (e.g. `consumer_timeout = 60000`)."""

    def __init__(
        self,
        *,
        executable: str | None = None,
        config_lines: tuple[str, ...] = (),
        startup_timeout_s: float = 60.0,
    ) -> None:
        found = executable or rabbitmq_server_executable()
        if found is None:
            raise FileNotFoundError("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        self.executable = found
        self.config_lines = config_lines
        self.startup_timeout_s = startup_timeout_s
        self.node_name = f"lousho-test-{uuid.uuid4().hex[:10]}@localhost"
        self.port = _free_port()
        self.dist_port = _free_port()
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def data_dir(self) -> str:
        if self._dir is None:
            raise RuntimeError("the node was never started")
        return str(self._dir)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> str:
        """Start the node (a no-op while it runs) and return its URL once it takes AMQP connections."""
        if self.running:
            return self.url
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="lousho-rabbitmq-"))
            (self._dir / "rabbitmq.conf").write_text(
                "\n".join([f"listeners.tcp.default = 127.0.0.1:{self.port}", *self.config_lines]) + "\n"
            )
            (self._dir / "enabled_plugins").write_text("[].\n")  # no management plugin: nothing to wait for
        with open(self._dir / "node.log", "ab") as log:
            self._process = subprocess.Popen(
                [self.executable], cwd=self._dir, env=self._env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._wait_until_ready()
        return self.url

    def stop(self, *, kill: bool = False, keep_data: bool = False) -> None:
        """End the node (`rabbitmqctl stop`, or SIGKILL when `kill`), then remove its folder unless `keep_data`."""
        self._end_process(kill=kill)
        if not keep_data and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def restart(self, *, kill: bool = False) -> str:
        """Stop and start again on the same port and data folder (durable queues and persistent messages stay)."""
        self._end_process(kill=kill)
        return self.start()

    def ctl(self, *args: str, timeout_s: float = 30.0) -> str:
        """Run `rabbitmqctl -n <node> <args>` against this node; its output (CalledProcessError if it fails)."""
        command = [str(Path(self.executable).with_name("rabbitmqctl")), "-n", self.node_name, *args]
        done = subprocess.run(
            command, env=self._env(), cwd=self._dir, capture_output=True, text=True, timeout=timeout_s, check=True
        )
        return done.stdout

    def __enter__(self) -> RabbitMQNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _env(self) -> dict[str, str]:
        folder = self.data_dir
        return {
            **os.environ,
            "HOME": folder,  # the node writes its own Erlang cookie here, and the CLI tools read it
            "RABBITMQ_CONF_ENV_FILE": f"{folder}/rabbitmq-env.conf",  # not the system's (it names the system node)
            "RABBITMQ_NODENAME": self.node_name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": f"{folder}/mnesia",
            "RABBITMQ_LOG_BASE": f"{folder}/log",
            "RABBITMQ_CONFIG_FILE": f"{folder}/rabbitmq.conf",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{folder}/enabled_plugins",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def _wait_until_ready(self) -> None:
        """Wait until an AMQP connection opens; a node that exits or never answers is reported with its log."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if not self.running:
                raise RuntimeError(f"rabbitmq-server exited at start: {self._log_tail()}")
            with _Connection(self.url, connect_timeout=1) as probe:
                try:
                    probe.connect()
                    return
                except (OSError, *probe.connection_errors):  # not listening yet, or still booting
                    pass
            if time.monotonic() > deadline:
                self._end_process(kill=True)
                raise RuntimeError(
                    f"rabbitmq-server did not answer within {self.startup_timeout_s}s: {self._log_tail()}"
                )
            time.sleep(0.2)

    def _end_process(self, *, kill: bool) -> None:
        process, self._process = self._process, None
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if process is None or process.poll() is not None:
            return
        if not kill:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.ctl("stop")  # a clean shutdown: queues and messages written out
        with contextlib.suppress(ProcessLookupError):  # the node's group: the script, beam and its helpers
            os.killpg(process.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        _wait_group_gone(process.pid)

    def _log_tail(self) -> str:
        try:
            return (Path(self.data_dir) / "node.log").read_text(errors="replace")[-3000:]
        except OSError as exc:
            return f"(no log: {exc})"


def _wait_group_gone(pgid: int, timeout_s: float = 10.0) -> None:
    """Wait until no process of the node's group is left (beam outlives its script for a moment)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def private_rabbitmq(*, config_lines: tuple[str, ...] = ()) -> Iterator[RabbitMQNode]:
    """Yield a started private node; stop it and remove its folder after."""
    node = RabbitMQNode(config_lines=config_lines)
    node.start()
    try:
        yield node
    finally:
        node.stop()


@atexit.register
def _stop_forgotten_nodes() -> None:
    """A run that forgot to stop a node still leaves no rabbitmq-server behind."""
    with _LIVE_LOCK:
        nodes = list(_LIVE)
    for node in nodes:
        node.stop(kill=True)
