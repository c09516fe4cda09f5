"""An embedded default that lasts (issue #15): with no Redis configured, every `lousho` command (and the demo) shares
one local store under LOUSHO_HOME that persists between commands, starts on demand, stops when idle, and gives way
to a configured REDIS_URL / LOUSHO_REDIS_URL. Real commands in real processes, a real redis-server; each test has a
home of its own and stops its store by pid (no process is left running)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from lousho.local_redis import LocalRedis
from lousho.testing.redis_server import RedisServer
from tests.ops.conftest import LOUSHO, descendants, run_clean

WRITE = """
import sys
from lousho.settings import LoushoSettings
from lousho.testing.store_contract import sample_checkpoint
store = LoushoSettings().redis_store()
store.checkpoints.save(sys.argv[1], sample_checkpoint(sys.argv[1]))
print(LoushoSettings().require_redis_url(), flush=True)
if sys.argv[2:] == ["hold"]:  # connected until told: a client of the store until then
    sys.stdin.readline()
"""


def env_for(home: Path, **values: str) -> dict[str, str]:
    """An environment with no Redis configured (none of the caller's LOUSHO_ settings), this home, and `values`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"}
    return {**env, "LOUSHO_HOME": str(home), **values}


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds `text` (the home's path: the local store's watchdog and server)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (
                    text.encode() in (entry / "cmdline").read_bytes()
                    and "Z" not in (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                ):
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    yield home
    LocalRedis(home).stop()
    assert processes_mentioning(str(home)) == [], "the local store outlived its stop"


def write_session(home: Path, session: str, **env: str) -> str:
    done = run_clean([sys.executable, "-c", WRITE, session], env=env_for(home, **env), timeout_s=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def lousho(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    done = run_clean([LOUSHO, *args], env=env_for(home, **env), timeout_s=60)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done


@pytest.mark.slow  # 2-7 s: out of `scripts/check --fast` (issue #33)
def test_with_no_redis_configured_commands_share_one_local_store_that_lasts_between_them(home: Path) -> None:
    url = write_session(home, "chat-local")  # one process writes and exits...
    assert url == LocalRedis(home).url
    listed = lousho(home, "sessions").stdout  # ...the next command, a process of its own, finds it
    assert "chat-local" in listed and "awaiting-approval" in listed
    assert "Table for 2" in lousho(home, "show", "chat-local").stdout
    assert "chat-local" in lousho(home, "history", "chat-local").stdout
    local = LocalRedis(home)
    watchdog = local.watchdog_pid()
    assert watchdog is not None and local.answers()  # it lasts after the commands ended: no command's child
    assert str(local.data_dir).startswith(str(home))

    local.stop()  # stopped (or stopped when idle): its data stays, and the next command starts it again
    assert local.watchdog_pid() is None and not local.answers()
    assert "chat-local" in lousho(home, "sessions").stdout
    assert local.watchdog_pid() not in (None, watchdog)


def test_the_local_store_is_under_the_users_data_folder_unless_lousho_home_says(tmp_path: Path) -> None:
    show = "from lousho.local_redis import lousho_home; print(lousho_home())"
    env = {k: v for k, v in os.environ.items() if k not in ("LOUSHO_HOME", "XDG_DATA_HOME")}
    home = {**env, "HOME": str(tmp_path)}
    assert subprocess.check_output([sys.executable, "-c", show], env=home, text=True).strip() == str(
        tmp_path / ".local" / "share" / "lousho"
    )
    xdg = {**home, "XDG_DATA_HOME": str(tmp_path / "data")}
    assert subprocess.check_output([sys.executable, "-c", show], env=xdg, text=True).strip() == str(
        tmp_path / "data" / "lousho"
    )
    own = {**xdg, "LOUSHO_HOME": str(tmp_path / "mine")}
    assert subprocess.check_output([sys.executable, "-c", show], env=own, text=True).strip() == str(tmp_path / "mine")


@pytest.mark.parametrize("variable", ["REDIS_URL", "LOUSHO_REDIS_URL"])
def test_a_configured_redis_wins_over_the_local_store(variable: str, home: Path) -> None:
    with RedisServer() as server:
        assert write_session(home, "chat-configured", **{variable: server.url}) == server.url
        assert server.client().keys("lousho:*")  # written there
        assert "chat-configured" in lousho(home, "sessions", **{variable: server.url}).stdout
    assert LocalRedis(home).watchdog_pid() is None  # and no local store was started
    assert not (home / "redis" / "lousho.aof").exists()


@pytest.mark.slow  # 2-7 s: out of `scripts/check --fast` (issue #33)
def test_the_local_store_stops_when_idle_and_not_while_a_client_is_connected(home: Path) -> None:
    # The writer stays connected until the test is: the store is never idle before the test looks. A command that
    # exits first leaves it idle, and under load more than the idle second can pass before the next line (issue #33).
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITE, "chat-idle", "hold"],
        env=env_for(home, LOUSHO_LOCAL_IDLE_S="1"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip()
        local = LocalRedis(home)
        watchdog = local.watchdog_pid()
        assert watchdog is not None
        held = redis.Redis.from_url(local.url)
        held.ping()
    finally:
        _, stderr = writer.communicate(input="\n", timeout=60)
    assert writer.returncode == 0, stderr[-2000:]
    time.sleep(3.0)  # three idle times, but a client (as a worker would) is connected
    assert local.watchdog_pid() == watchdog
    held.close()
    deadline = time.monotonic() + 10
    while processes_mentioning(str(home)):
        assert time.monotonic() < deadline, "the idle local store did not stop"
        time.sleep(0.1)
    assert not local.answers()
    assert "chat-idle" in lousho(home, "sessions").stdout  # its data lasts


@pytest.mark.slow  # 2-7 s: out of `scripts/check --fast` (issue #33)
def test_commands_at_once_start_one_local_store(home: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        urls = list(pool.map(lambda n: write_session(home, f"chat-{n}"), range(4)))
    assert set(urls) == {LocalRedis(home).url}
    servers = [
        pid for pid in processes_mentioning(str(home)) if b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(servers) == 1, servers
    listed = lousho(home, "sessions").stdout
    assert all(f"chat-{n}" in listed for n in range(4))


def test_the_local_store_is_no_child_of_the_command_that_started_it(home: Path) -> None:
    process = subprocess.Popen(
        [LOUSHO, "sessions"], env=env_for(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    seen: set[int] = set()
    while process.poll() is None:
        seen.update(descendants(process.pid))
        time.sleep(0.01)
    assert process.returncode == 0
    watchdog = LocalRedis(home).watchdog_pid()
    assert watchdog is not None
    # Ctrl-C or the end of a command leaves it be: no process of the command is its parent, and it is in a session
    # of its own, not the terminal's. (It is a grandchild for the instant between its fork and its starter's exit,
    # which polling the command's descendants can catch on a loaded machine: issue #33.)
    parent = int(Path(f"/proc/{watchdog}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert parent not in {process.pid, *seen}
    assert os.getsid(watchdog) != os.getsid(0)
