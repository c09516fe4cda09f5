"""Flower (a real `celery flower` process) shows lousho's tasks by session and call, with ids only as arguments."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ops.conftest import ROOT, DemoFleet, cli_env

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

REQUEST = "Plan a day in Oslo and book the best restaurant."


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def running_flower(app: str, env: dict[str, str], log_path: Path) -> Iterator[str]:
    """`celery -A <app> flower` on a free port; yields its base URL; ended by pid."""
    port = free_port()
    command = [sys.executable, "-m", "celery", "-A", app, "flower", f"--port={port}", "--address=127.0.0.1"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, env={**env, "FLOWER_UNAUTHENTICATED_API": "1"}, cwd=ROOT, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthcheck", timeout=2) as response:
                    if response.read() == b"OK":
                        break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.1)
        yield base
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@pytest.fixture
def flower(demo_fleet: DemoFleet, tmp_path: Path) -> Iterator[str]:
    with running_flower("lousho.demo.fleet_app", cli_env(demo_fleet), tmp_path / "flower.log") as base:
        yield base


def wait_for_tasks(flower: str, expected: set[str], timeout_s: float = 15.0) -> dict[str, Any]:
    """Flower's tasks, once every task of `expected` is there and succeeded."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks: dict[str, Any] = get_json(f"{flower}/api/tasks")
        if expected <= set(tasks) and all(tasks[t]["state"] == "SUCCESS" for t in expected):
            return tasks
        assert time.monotonic() < deadline, {t: (v["name"], v["state"]) for t, v in tasks.items()}
        time.sleep(0.1)


def test_flower_lists_model_turns_and_tool_calls_by_session_and_call(demo_fleet: DemoFleet, flower: str) -> None:
    demo_fleet.start_worker()
    demo_fleet.client.enqueue("trip_planner", REQUEST, session_id="trip-oslo")
    seen_while_running: set[str] = set()
    deadline = time.monotonic() + 30
    while demo_fleet.client.status("trip-oslo").status != "awaiting-approval":
        seen_while_running |= set(get_json(f"{flower}/api/tasks"))
        assert time.monotonic() < deadline
        time.sleep(0.05)
    approval = demo_fleet.client.status("trip-oslo").approval_id
    assert approval is not None
    demo_fleet.client.resolve_approval(approval, approved=True)
    demo_fleet.wait_for("trip-oslo", "finished")

    expected = {
        "trip-oslo/turn/1": ("lousho.model_turn", "session=trip-oslo turn=1"),
        "trip-oslo/turn/1/tool/oslo_weather": (
            "tool:get_weather",
            "session=trip-oslo turn=1 call=oslo_weather tool=get_weather",
        ),
        "trip-oslo/turn/1/tool/oslo_food": (
            "tool:find_restaurants",
            "session=trip-oslo turn=1 call=oslo_food tool=find_restaurants",
        ),
        "trip-oslo/turn/2": ("lousho.model_turn", "session=trip-oslo turn=2"),
        "trip-oslo/turn/2/tool/oslo_book": (
            "tool:book_table",
            "session=trip-oslo turn=2 call=oslo_book tool=book_table",
        ),
        "trip-oslo/turn/3": ("lousho.model_turn", "session=trip-oslo turn=3"),
    }
    tasks = wait_for_tasks(flower, set(expected))
    assert seen_while_running & set(expected)  # Flower showed them as they ran, not only at the end
    for task_id, (name, args) in expected.items():
        assert (tasks[task_id]["name"], tasks[task_id]["args"]) == (name, args)
        assert tasks[task_id]["worker"].startswith("w1@")
    assert tasks["trip-oslo/turn/3"]["result"] == "'finished'"
    advances = [t for task_id, t in tasks.items() if task_id.startswith("trip-oslo/advance/")]
    assert [t["args"] for t in advances] == ["session=trip-oslo reason=approval"]
    assert "Oslo and book" not in json.dumps(tasks)  # ids only: the prompt never reaches Flower
