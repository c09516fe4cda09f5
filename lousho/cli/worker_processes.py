"""`lousho worker`: Celery worker processes, one per core by default, each with many slots (issue #29).

lousho's pool (`pool.py`) holds a process's steps on its event loops, one core's worth (one GIL). So `lousho worker`
with no flags starts one `celery worker` per core, each with `DEFAULT_SLOTS` slots, and watches them as
Celery's prefork parent watches its children: SIGTERM / SIGINT / SIGQUIT go to every process (a warm
shutdown on SIGTERM, as Kubernetes sends), and a process that dies while the worker runs (SIGKILL, the OOM
killer) is started again; its unacked steps are delivered again or requeued by the reaper, as after any crash.
With one process it simply becomes that `celery worker` (exec), as before.

`-P` picks another pool: Celery's `prefork`, `threads`, `solo`, ... `-P` cannot name a pool outside Celery,
so lousho's pool (and prefork, which Celery maps to an app's configured pool) go through Celery's own hook
for a pool of one's own, `-P custom` with `CELERY_CUSTOM_WORKER_POOL` (`fleet.settings.pool_arguments`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from lousho.fleet.settings import DEFAULT_SLOTS, pool_arguments

__all__ = ["default_processes", "run_worker_processes", "worker_command"]


def worker_command(
    app_spec: str, pool: str, slots: int | None, extra: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """`python -m celery -A APP worker` with lousho's flags, and the environment it needs."""
    arguments, env = pool_arguments(pool)
    if slots is None and pool == "lousho":
        slots = DEFAULT_SLOTS
    command = [sys.executable, "-m", "celery", "-A", app_spec, "worker", "-O", "fair", "--without-gossip",
               "--without-mingle", *arguments, *(["-c", str(slots)] if slots else []), *extra]  # fmt: skip
    return command, env


def _named(command: list[str], hostname: str | None, index: int) -> list[str]:
    """Each process's own Celery node name: `<name>-<index>@<host>` (two nodes of one name confuse Flower)."""
    name, _, host = (hostname or "lousho@%h").partition("@")
    return [*command, "-n", f"{name}-{index}@{host or '%h'}"]


def run_worker_processes(command: list[str], env: dict[str, str], processes: int, hostname: str | None) -> int:
    """Run `processes` copies of `command` until a signal stops them; start again any that dies meanwhile."""
    children: dict[int, subprocess.Popen[bytes]] = {}
    stopping: list[int] = []

    def start(index: int) -> None:
        # A process group of its own: a terminal's Ctrl-C reaches this process only, which forwards it once (Celery
        # reads a second SIGINT as a cold shutdown).
        children[index] = subprocess.Popen(_named(command, hostname, index), env=env, process_group=0)

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, forward)
    for index in range(processes):
        start(index)
    while not stopping or any(child.poll() is None for child in children.values()):
        for index, child in list(children.items()):
            if child.poll() is not None and not stopping:
                print(f"lousho worker: process {index} (pid {child.pid}) ended ({child.returncode}); starting it again",
                      file=sys.stderr, flush=True)  # fmt: skip
                start(index)
        time.sleep(0.2)
    return 0


def default_processes(pool: str) -> int:
    """One process per core on lousho's pool; Celery's pools make their own processes or threads (`-c`)."""
    return (os.cpu_count() or 1) if pool == "lousho" else 1
