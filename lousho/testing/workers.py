"""Real Celery worker processes for tests, the demo and benchmarks: started, killed, cleaned up.

Every worker started here is ended here (by `stop()`, `kill()`, or at exit), by pid.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lousho.fleet.settings import pool_arguments

__all__ = ["WorkerProcess", "spawn_worker", "start_worker"]

_LIVE: set[WorkerProcess] = set()


@dataclass(eq=False)
class WorkerProcess:
    """One `celery worker` process (solo pool: the task runs in this very process)."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` (default SIGKILL: no cleanup, no ack, like the OOM killer)."""
        if self.alive():
            os.kill(self.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.process.wait(timeout=30)
            _LIVE.discard(self)

    def stop(self, timeout_s: float = 15.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it does not end in time."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        _LIVE.discard(self)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def ready(self) -> bool:
        """Whether the worker said it is ready (consuming its queue)."""
        return "ready." in self.log()


def start_worker(
    app: str,
    *,
    queue: str | None = None,
    name: str = "worker",
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    pool: str = "solo",
    concurrency: int = 1,
    ready_timeout_s: float = 60.0,
    log_dir: str | None = None,
    python: str | None = None,
) -> WorkerProcess:
    """Start `celery -A <app> worker` consuming `queue` (default: the app's own, issue #15) and wait until it is
    ready: it has published the agents it serves (`lousho.worker.registry`). `python`: the interpreter (default
    this one; another venv's runs the lousho installed there, e.g. a previous release's, issue #35)."""
    worker = spawn_worker(
        app, queue=queue, name=name, env=env, cwd=cwd, pool=pool, concurrency=concurrency, log_dir=log_dir,
        python=python,
    )  # fmt: skip
    _wait_ready(worker, ready_timeout_s)
    return worker


def spawn_worker(
    app: str,
    *,
    queue: str | None = None,
    name: str = "worker",
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    pool: str = "solo",
    concurrency: int = 1,
    log_dir: str | None = None,
    python: str | None = None,
) -> WorkerProcess:
    """Start `celery -A <app> worker` consuming `queue`, without waiting for it (`WorkerProcess.ready()` says
    when it is): a caller that must stay responsive, such as the demo on Ctrl-C (issue #15), waits itself."""
    folder = Path(log_dir or tempfile.mkdtemp(prefix="lousho-worker-"))
    log_path = folder / f"{name}.log"
    arguments, pool_env = pool_arguments(pool)
    command = [
        python or sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        *arguments,  # "lousho" or "prefork" through Celery's hook for a pool of one's own (issue #29)
        f"--concurrency={concurrency}",
        *(["-Q", queue] if queue else []),
        "-n",
        f"{name}@%h",
        "--without-gossip",
        "--without-mingle",
        "-l",
        "INFO",
    ]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command,
            env={**os.environ, **pool_env, **(env or {})},
            cwd=cwd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = WorkerProcess(name=name, process=process, log_path=log_path)
    _LIVE.add(worker)
    return worker


def _wait_ready(worker: WorkerProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker.ready():
            return
        if not worker.alive():
            raise RuntimeError(f"worker {worker.name} exited before it was ready:\n{worker.log()[-3000:]}")
        time.sleep(0.05)
    worker.kill()
    raise RuntimeError(f"worker {worker.name} was not ready after {timeout_s}s:\n{worker.log()[-3000:]}")


@atexit.register
def _end_forgotten_workers() -> None:
    for worker in list(_LIVE):
        worker.kill()
