"""`lousho worker` sizes a fleet by CPU, not by how long models take (issue #29): with no flags it runs one
process per core, each holding 100 steps in flight on lousho's pool; it starts again a process that dies, and
SIGTERM ends them all with a warm shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.ops.conftest import LOUSHO, DemoFleet, cli_env, descendants


def wait_until(what: str, done: object, log: Path, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}:\n{log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.1)


def test_lousho_worker_runs_a_process_per_core_with_many_slots_and_starts_again_one_that_dies(
    demo_fleet: DemoFleet, tmp_path: Path
) -> None:
    cores, log = os.cpu_count() or 1, tmp_path / "worker.log"
    env = {**cli_env(demo_fleet), "LOUSHO_APP": "lousho.demo.fleet_app:app"}
    with open(log, "wb") as out:
        worker = subprocess.Popen([LOUSHO, "worker"], env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    try:
        wait_until("every process ready", lambda: log.read_text(errors="replace").count(" ready.") == cores, log)
        text = log.read_text(errors="replace")
        assert text.count("lousho's pool: 100 slots") == cores
        processes = descendants(worker.pid)
        assert len(processes) == cores
        assert {f"lousho-{n}@" for n in range(cores)} <= {word.split("@")[0] + "@" for word in text.split()}

        os.kill(processes[0], signal.SIGKILL)  # as the OOM killer would
        wait_until(
            "the killed process started again",
            lambda: log.read_text(errors="replace").count(" ready.") == cores + 1,
            log,
        )
        assert "starting it again" in log.read_text(errors="replace")
        assert len(descendants(worker.pid)) == cores
    finally:
        worker.send_signal(signal.SIGTERM)  # warm shutdown, forwarded to every process
        status = worker.wait(timeout=60)
    assert status == 0
    assert descendants(worker.pid) == []
