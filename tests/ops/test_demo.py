"""`lousho demo` end to end, as a user runs it: a subprocess with no Redis configured (so it starts its own)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from tests.ops.conftest import LOUSHO, run_clean


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_lousho_demo_kills_a_worker_recovers_and_finishes_every_session() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"}
    started = time.monotonic()
    done = run_clean([LOUSHO, "demo"], env=env, timeout_s=110)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert "Traceback" not in out + done.stderr
    assert "All 3 sessions finished" in out
    killed = re.search(
        r"Worker (w\d) \(pid (\d+)\) was killed with SIGKILL while running find_restaurants \(call (\w+)\) of (trip-\w+)",
        out,
    )
    assert killed, out[-4000:]
    call, session = killed.group(3), killed.group(4)
    assert f"Recovered: the reaper requeued {session}" in out
    assert f"{call} ran 2 times in all" in out
    for city in ("Lisbon", "Oslo", "Rome"):
        assert f"Your day in {city}: sunny, lunch at Casa {city} (booked for 2)." in out
    assert "a human approved appr_" in out
    assert "Each of the 9 model turns was asked once" in out
    assert "lousho sessions" in out and "lousho history" in out
    assert elapsed < 60, elapsed
    queue = re.search(r"queue (lousho-demo-[0-9a-f]+)", out)
    assert queue is not None
    assert processes_mentioning(queue.group(1)) == []  # every worker the demo started has ended


def test_lousho_demo_in_process_crashes_a_process_and_resumes_it() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_")}
    done = run_clean([LOUSHO, "demo", "--in-process"], env=env, timeout_s=60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = " ".join(done.stdout.split())
    assert "killed with SIGKILL" in out and "Finished (stop)" in out
