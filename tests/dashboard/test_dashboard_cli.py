"""`lousho dashboard` as the README and docs/observability.md show it: the command serves the pages over the
store the settings name (a fleet's Redis, or a SQLite file with --store-url), and --read-only refuses POSTs
(issue #19)."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lousho.settings import store_from_url
from lousho.stores.redis import RedisStore
from tests.dashboard.conftest import fill

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]
README_COMMAND = "lousho dashboard --port 8300"
DOCS_COMMAND = "lousho --store-url sqlite:///runs.db dashboard --read-only --port 8301"


def run_shown(command: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    argv = shlex.split(command)
    argv[0] = str(Path(sys.executable).with_name("lousho"))
    return subprocess.Popen(
        argv, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def get(url: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                body: str = answer.read().decode()
                return body
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    return output


def test_lousho_dashboard_serves_the_fleets_sessions(redis_url: str, redis_prefix: str, tmp_path: Path) -> None:
    with RedisStore(redis_url, prefix=redis_prefix) as store:
        asyncio.run(fill(store))
    process = run_shown(README_COMMAND, tmp_path, {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": redis_prefix})
    try:
        page = get("http://127.0.0.1:8300/")
        assert 'data-session="trip"' in page and 'data-session="pay"' in page
        assert "Fleet" in page  # a fleet's store: the fleet page is there
        assert "charge_card" in get("http://127.0.0.1:8300/approvals")
    finally:
        output = stop(process)
    assert "lousho dashboard on http://127.0.0.1:8300/" in output


def test_lousho_dashboard_read_only_over_sqlite_refuses_posts(tmp_path: Path) -> None:
    asyncio.run(fill(store_from_url(f"sqlite:///{tmp_path / 'runs.db'}")))
    process = run_shown(DOCS_COMMAND, tmp_path, {})
    try:
        page = get("http://127.0.0.1:8301/sessions/trip")
        assert "read-only" in page and "Pack sunscreen." in page
        request = urllib.request.Request("http://127.0.0.1:8301/sessions/trip/fork", data=b"save=1", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        refused.value.close()
        assert refused.value.code == 403
    finally:
        stop(process)
