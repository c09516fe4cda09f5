"""Fixtures for the operator-facing parts (CLI, demo, web app, Flower, deploy): the demo's fleet app on a real
Redis, real worker processes, each test on its own key prefix and queue. Every process started here is ended here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from lousho.scheduler import Client
from lousho.settings import LoushoSettings
from lousho.testing.workers import WorkerProcess, start_worker

ROOT = Path(__file__).resolve().parents[2]
LOUSHO = str(Path(sys.executable).with_name("lousho"))
"""The `lousho` console script of this interpreter's environment."""


@dataclass
class DemoFleet:
    settings: LoushoSettings
    client: Client
    log_dir: str
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """What a worker or a `lousho` command needs to see this fleet (tools take 0.05 s)."""
        return {**self.settings.env(), "LOUSHO_DEMO_TOOL_DELAY_S": "0.05", "PYTHONPATH": str(ROOT)}

    def start_worker(self, app: str = "lousho.demo.fleet_app", **env: str) -> WorkerProcess:
        worker = start_worker(
            app,
            queue=self.settings.fleet.queue,
            name=f"w{len(self.workers) + 1}",
            env={**self.env, **env},
            cwd=str(ROOT),
            log_dir=self.log_dir,
        )
        self.workers.append(worker)
        return worker

    def wait_for(self, session: str, status: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.client.status(session).status != status:
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {w.name} ---\n{w.log()[-2000:]}" for w in self.workers)
                raise AssertionError(f"{session} is {self.client.status(session).status}, not {status}\n{logs}")
            time.sleep(0.05)


@pytest.fixture
def demo_fleet(redis_url: str, redis_prefix: str, redis_client: redis.Redis, tmp_path: Path) -> Iterator[DemoFleet]:
    queue = f"lousho-test-{uuid.uuid4().hex[:12]}"
    settings = LoushoSettings(
        redis_url=redis_url,
        store_url=None,
        prefix=redis_prefix,
        queue=queue,
        lease_ttl_s=2.0,
        reaper_interval_s=0.5,
        requeue_backoff_s=3.0,
    )
    fleet = DemoFleet(settings=settings, client=settings.client(), log_dir=str(tmp_path))
    yield fleet
    for worker in fleet.workers:
        worker.kill()
    forget_queue(redis_client, queue)


def forget_queue(client: redis.Redis, queue: str) -> None:
    """Delete a test queue's keys on a (maybe shared) Redis: the queue, its bindings, and messages that a
    killed worker left unacked (kombu would put them back on the queue an hour later)."""
    client.delete(
        queue,
        *(f"{queue}\x06\x16{p}" for p in (3, 6, 9)),
        f"_kombu.binding.{queue}",
        f"_kombu.binding_permanent.{queue}",
    )
    for tag, raw in client.hgetall("unacked").items():
        with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
            if json.loads(raw)[0]["properties"]["delivery_info"]["routing_key"] == queue:
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)


def cli_env(fleet: DemoFleet) -> dict[str, str]:
    """The environment of a `lousho` command run against `fleet` (none of the caller's LOUSHO_ settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"}
    return {**env, **fleet.env}


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children first found (read from /proc while they still have their parent)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run_clean(
    command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout_s: float = 90.0
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end; on a timeout, end it and every process below it (by pid), then fail."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for pid in [*descendants(process.pid), process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{command[:2]} ran over {timeout_s}s:\n{stderr[-3000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
