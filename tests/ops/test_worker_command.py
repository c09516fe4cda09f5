"""`lousho worker` sizes a fleet by CPU, not by how long models take (issue #29): with no flags it runs one
process per core, each holding 100 steps in flight on lousho's pool; it starts again a process that dies, and
SIGTERM ends them all with a warm shutdown. The commands are docs/fleet.md's, run as printed (the app: the
demo's, where the docs name the reader's `myapp.lousho_app:app`)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.docs.walkthrough import bash_block_after
from tests.ops.conftest import LOUSHO, ROOT, DemoFleet, cli_env, descendants

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

DOC_COMMANDS = bash_block_after(ROOT / "docs" / "fleet.md", "### Many steps in flight per process")
APP = "lousho.demo.fleet_app:app"


def argv(command: str) -> list[str]:
    words = shlex.split(command.replace("myapp.lousho_app:app", APP))
    assert words[:2] == ["lousho", "worker"], command
    return [LOUSHO, *words[1:]]


def wait_until(what: str, done: Callable[[], bool], log: Path, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what}:\n{log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.1)


@contextmanager
def running(command: str, fleet: DemoFleet, folder: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`command` started; on the way out SIGTERM (a warm shutdown) must end it, and all below it, with status 0."""
    log = folder / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(argv(command), env=cli_env(fleet), cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    try:
        yield worker, log
    finally:
        worker.send_signal(signal.SIGTERM)
        status = worker.wait(timeout=60)
    assert status == 0, log.read_text(errors="replace")[-3000:]
    assert descendants(worker.pid) == []


def ready_count(log: Path) -> int:
    return log.read_text(errors="replace").count(" ready.")


def test_lousho_worker_runs_a_process_per_core_with_many_slots_and_starts_again_one_that_dies(
    demo_fleet: DemoFleet, tmp_path: Path
) -> None:
    cores = os.cpu_count() or 1
    assert DOC_COMMANDS[0] == "lousho worker --app myapp.lousho_app:app"
    with running(DOC_COMMANDS[0], demo_fleet, tmp_path) as (worker, log):
        wait_until("every process ready", lambda: ready_count(log) == cores, log)
        text = log.read_text(errors="replace")
        assert text.count("lousho's pool: 100 slots") == cores
        processes = descendants(worker.pid)
        assert len(processes) == cores
        # a node name each, unique on the host: <queue or app>-<pid of the command>-<n>@<host> (issue #32)
        assert all(f"-{worker.pid}-{n}@" in text for n in range(cores)), text[-3000:]

        os.kill(processes[0], signal.SIGKILL)  # as the OOM killer would
        wait_until("the killed process started again", lambda: ready_count(log) == cores + 1, log)
        assert "starting it again" in log.read_text(errors="replace")
        assert len(descendants(worker.pid)) == cores


@pytest.mark.parametrize(("command", "says"), [
    (DOC_COMMANDS[1], "lousho's pool: 500 slots"),
    (DOC_COMMANDS[2], "concurrency: 50 (thread)"),
])  # fmt: skip
def test_lousho_worker_runs_one_process_with_the_slots_and_the_pool_asked_for(
    command: str, says: str, demo_fleet: DemoFleet, tmp_path: Path
) -> None:
    with running(command, demo_fleet, tmp_path) as (worker, log):
        wait_until("ready", lambda: ready_count(log) == 1, log)
        assert says in log.read_text(errors="replace")
        assert descendants(worker.pid) == []  # the worker itself: no process above or beside it
