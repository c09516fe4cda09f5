"""One Ctrl-C ends `lousho demo` (fleet and in-process) from any point, with every process it started ended and one
line printed: no traceback, no second Ctrl-C needed (issue #15). Its 3 seconds are bounded by construction (the
reaper thread's join, then `QUICK_STOP_S` of warm shutdown before SIGKILL: lousho/demo/fleet.py); the test asserts
no hang, not this machine's speed (issue #33).

Each test runs the real command in a process group of its own and sends SIGINT to the whole group, as a
terminal's Ctrl-C does; the processes below the command are read from /proc all along, so each one it started
is checked by pid afterwards. No Redis is configured: the demo uses the local store of the test's own
LOUSHO_HOME, a daemon that is no child of the command, stopped when the test ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lousho.local_redis import LocalRedis
from tests.ops.conftest import LOUSHO, descendants

pytestmark = [pytest.mark.slow, pytest.mark.workers]

EXIT_WITHIN_S = 30.0
"""A demo still running this long after one Ctrl-C hangs (issue #15's bug waited for ever)."""
GONE_WITHIN_S = 30.0
"""How long what the demo ended may stay in /proc after the demo exits (issue #33): a SIGKILLed process is listed
until the kernel has torn it down, which on a loaded machine took longer than the 0.2 s this test once allowed. A
process the demo left running (a worker, the reaper) runs on past any bound, so this waits for no such thing."""


def alive(pid: int) -> bool:
    """Whether `pid` is a live process. A zombie waiting for its parent's wait() counts as ended, and so does a
    process with no memory left (an empty /proc/PID/cmdline): it is inside the kernel's exit and can never run
    code again; only kernel threads have no memory otherwise, and none is below the demo."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        memory = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return state not in ("Z", "X") and memory != b""


def started_at(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with its pid, unique."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def running(pids: list[int]) -> dict[int, str]:
    """Each pid with its /proc stat line (name, state, parent) and command line, for a failure's message."""
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found[pid] = f"{Path(f'/proc/{pid}/stat').read_text()[:120]} | {command}"
    return found


class Demo:
    """`lousho demo ...` in its own process group, its output and every process below it collected as it runs."""

    def __init__(self, args: list[str], home: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"}
        env.update(LOUSHO_HOME=str(home), PYTHONUNBUFFERED="1", COLUMNS="200")
        self.home = home
        self.process = subprocess.Popen(
            [LOUSHO, "demo", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a process group of its own: the test's Ctrl-C reaches it and its group only
        )
        self.stdout: list[str] = []
        self.seen: dict[int, str] = {}
        self.left: list[int] = []
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._watch, daemon=True),
        ]
        for thread in self._readers:
            thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.stdout.append(line)

    def _watch(self) -> None:
        while self.process.poll() is None:
            self.see()
            time.sleep(0.02)

    def see(self) -> None:
        """Note every process below the demo now, by its start time: a pid reused by another process (pid_max is
        32768 on this machine: a busy run reuses pids within seconds) is never mistaken for it (issue #33: a
        command line was not enough; a process seen as it exited, with none, matched a kernel thread's)."""
        for pid in descendants(self.process.pid):
            with contextlib.suppress(OSError, IndexError):
                self.seen[pid] = started_at(pid)

    def still_running(self) -> list[int]:
        """The processes noted below the demo that still run (the same start time: no reused pid), but the local
        store's: its watchdog is forked off by a starter the demo runs, so it is below the demo for the instant
        of that fork and may be noted then, and it outlives the demo by design (a CI run failed so; issue #33)."""
        watchdog = LocalRedis(self.home).watchdog_pid()
        store = {watchdog, *descendants(watchdog)} if watchdog is not None else set()
        left = []
        for pid, started in self.seen.items():
            with contextlib.suppress(OSError, IndexError):
                if pid not in store and alive(pid) and started_at(pid) == started:
                    left.append(pid)
        return sorted(left)

    def gone(self, timeout_s: float = GONE_WITHIN_S) -> list[int]:
        """Wait until no process noted below the demo runs, at most `timeout_s`; those still running then."""
        deadline = time.monotonic() + timeout_s
        while (left := self.still_running()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def wait_for(self, text: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.stdout):
            assert self.process.poll() is None, f"the demo ended before {text!r}:\n{''.join(self.stdout)[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} after {timeout_s}s:\n{''.join(self.stdout)[-3000:]}"
            time.sleep(0.02)

    def ctrl_c(self) -> tuple[float, str]:
        """SIGINT to the demo's process group (a terminal's Ctrl-C); (seconds until it exited, its stderr)."""
        self.see()
        sent = time.monotonic()
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=EXIT_WITHIN_S + 10)
            took = time.monotonic() - sent
            self.left = self.gone()  # one it SIGKILLed at the very end may still be torn down: wait, not look once
            assert self.process.stderr is not None
            return took, self.process.stderr.read()
        finally:
            self.end()

    def end(self) -> None:
        """Whatever happened, nothing of the demo's outlives the test (by pid): what it left is in `left`."""
        for pid in [*descendants(self.process.pid), *self.still_running(), self.process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        for thread in self._readers:
            thread.join(timeout=5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """The demo's LOUSHO_HOME; its local store is stopped (by pid) when the test ends."""
    yield tmp_path / "home"
    LocalRedis(tmp_path / "home").stop()


def assert_stopped_cleanly(demo: Demo, took: float, stderr: str) -> None:
    out = "".join(demo.stdout)
    assert took < EXIT_WITHIN_S, f"took {took:.1f}s to exit after Ctrl-C\n{out[-2000:]}\n{stderr[-2000:]}"
    assert demo.process.returncode != 0
    assert "Traceback" not in out + stderr, out[-3000:] + stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert lines == ["error: [LOUSHO_INTERRUPTED] the demo was stopped; every process it started has ended"], stderr
    assert demo.left == [], f"processes the demo started still ran {GONE_WITHIN_S:.0f}s after it: {running(demo.left)}"


FLEET_MOMENTS = {
    "while it starts": "lousho fleet demo",
    "while its workers boot": "lousho fleet demo",
    "as the workers are ready": "are ready",
    "while the replacement worker starts": "SIGKILL ->",
    "while a human approves": "a human approved",
}


@pytest.mark.parametrize("moment", list(FLEET_MOMENTS))
def test_one_ctrl_c_ends_the_fleet_demo_from_any_point_leaving_no_process(moment: str, home: Path) -> None:
    demo = Demo([], home)
    try:
        demo.wait_for(FLEET_MOMENTS[moment])
        if moment == "while its workers boot":
            time.sleep(1.0)  # celery is importing the app in both workers
        took, stderr = demo.ctrl_c()
    finally:
        demo.end()
    assert_stopped_cleanly(demo, took, stderr)
    if moment == "while the replacement worker starts":  # the hang of issue #15: the replacement was starting
        assert any("SIGKILL ->" in line for line in demo.stdout)


@pytest.mark.parametrize("moment", ["while the child process runs", "while the run is resumed"])
def test_one_ctrl_c_ends_the_in_process_demo_leaving_no_process(moment: str, home: Path) -> None:
    demo = Demo(["--in-process"], home)
    try:
        demo.wait_for("A worker process starts")
        if moment == "while the run is resumed":
            demo.wait_for("Another process resumes it")
        took, stderr = demo.ctrl_c()
    finally:
        demo.end()
    assert_stopped_cleanly(demo, took, stderr)
