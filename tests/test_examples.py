"""The examples run as a user runs them: a fresh interpreter, from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def test_trip_planner_fork_shows_the_divergence() -> None:
    out = run_example("trip_planner_fork.py")

    assert "forked 'trip.fork-1' from step 1" in out
    assert "diverged at step 1" in out
    assert "Booked: picnic at Belém (sun expected)." in out
    assert "Booked: Gulbenkian museum (rain expected)." in out
    assert '"weather": 1' in out  # the fork reused the patched result instead of calling the tool
    assert "arguments of book_activity at step 2" in out
