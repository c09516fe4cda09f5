"""The `fleet` fixture: real Celery worker processes on a real Redis, each test on its own queue and key prefix."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from lousho import Message
from lousho.scheduler import Client, reap_once
from lousho.stores.codec import PayloadCodec
from lousho.stores.redis import RedisStore
from lousho.testing.workers import WorkerProcess, start_worker
from lousho.worker import FleetSettings, broker_url

ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class Fleet:
    env: dict[str, str]
    queue: str
    prefix: str
    store: RedisStore
    client: Client
    log_dir: str
    workers: list[WorkerProcess] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def redis(self) -> redis.Redis:
        return self.store.client

    def key(self, name: str) -> str:
        return f"{self.prefix}test:{name}"

    def start_worker(
        self,
        name: str | None = None,
        *,
        pool: str | None = None,
        concurrency: int = 1,
        app: str = "tests.fleet.fleet_app",
        **env: str,
    ) -> WorkerProcess:
        """A worker on `pool` ("lousho": lousho's own, the app's default, issue #29) with `concurrency` slots.
        Without a pool: solo, or LOUSHO_TEST_POOL with LOUSHO_TEST_SLOTS (the whole fleet suite on another pool)."""
        if pool is None:
            pool = os.environ.get("LOUSHO_TEST_POOL", "solo")
            concurrency = int(os.environ.get("LOUSHO_TEST_SLOTS", concurrency))
        worker = start_worker(
            app,
            queue=self.queue,
            # Unique on the broker: the machine's Redis serves several pytest processes at once, and a control
            # command sent to `w1@host` would reach every test's `w1` (their replies collapse into one).
            name=name or f"w{len(self.workers) + 1}-{self.queue.removeprefix('lousho-test-')}",
            env={**self.env, **env},
            cwd=ROOT,
            log_dir=self.log_dir,
            pool=pool,
            concurrency=concurrency,
        )
        self.workers.append(worker)
        return worker

    def script(self, session_id: str, answers: list[Message]) -> None:
        self.redis.set(self.key(f"script:{session_id}"), json.dumps([a.model_dump() for a in answers]))

    def kill_on(self, trigger: str) -> None:
        self.redis.sadd(self.key("kill"), trigger)

    def counts(self, name: str) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.redis.hgetall(self.key(name)).items()}

    def violations(self) -> list[str]:
        return [v.decode() for v in self.redis.lrange(self.key("violations"), 0, -1)]

    def wait_for(self, sessions: list[str], status: str = "finished", timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self.client.status(s).status == status for s in sessions):
                return
            time.sleep(0.1)
        stuck = {s: self.client.status(s).status for s in sessions if self.client.status(s).status != status}
        logs = "\n".join(f"--- {w.name} ---\n{w.log()[-2500:]}" for w in self.workers)
        raise AssertionError(f"not {status} after {timeout_s}s: {stuck}\n{logs}")

    def start_reaper(self, interval_s: float = 0.3) -> None:
        """Run the real reaper (`reap_once`) in a thread of this process, as `lousho reaper` would."""
        settings = FleetSettings(queue=self.queue, reaper_interval_s=interval_s, requeue_backoff_s=3.0)

        def loop() -> None:
            while not self._stop.is_set():
                reap_once(self.store, self.client.app, settings)
                self._stop.wait(interval_s)

        thread = threading.Thread(target=loop, daemon=True, name="reaper")
        thread.start()
        self._threads.append(thread)

    def pid_running(self, call_id: str, timeout_s: float = 30.0) -> int:
        """The pid of the worker running `call_id` (its tool records it as it starts)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self.redis.hget(self.key("ran-on"), call_id)
            if pid is not None:
                return int(pid)
            time.sleep(0.02)
        raise AssertionError(f"{call_id} never started")

    def worker_with_pid(self, pid: int) -> WorkerProcess:
        return next(w for w in self.workers if w.pid == pid)

    def stop_all(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for worker in self.workers:
            worker.kill()


CODEC_ENV = {"LOUSHO_PAYLOAD_KEYS": "k1:" + base64.b64encode(bytes(range(32))).decode(), "LOUSHO_PAYLOAD_COMPRESS": "1"}
"""The payload codec on (compression, encryption under key id k1) for workers and the test's store (issue #17)."""


@pytest.fixture
def fleet(redis_url: str, redis_prefix: str, redis_client: redis.Redis, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet with the codec the environment names (`LOUSHO_PAYLOAD_KEYS=... pytest tests/fleet`: every
    fleet test with it on), off by default."""
    codec_env = {k: v for k, v in os.environ.items() if k in CODEC_ENV}
    yield from _fleet(redis_url, redis_prefix, redis_client, tmp_path, codec_env)


@pytest.fixture
def codec_fleet(redis_url: str, redis_prefix: str, redis_client: redis.Redis, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet whose workers and test store run with the payload codec on (issue #17)."""
    yield from _fleet(redis_url, redis_prefix, redis_client, tmp_path, CODEC_ENV)


def _fleet(
    redis_url: str, redis_prefix: str, redis_client: redis.Redis, tmp_path: Path, codec_env: dict[str, str]
) -> Iterator[Fleet]:
    queue = f"lousho-test-{uuid.uuid4().hex[:12]}"
    env = {
        "LOUSHO_TEST_FLEET_REDIS": redis_url,
        "LOUSHO_TEST_FLEET_PREFIX": redis_prefix,
        "LOUSHO_TEST_FLEET_QUEUE": queue,
        "PYTHONPATH": ROOT,
        **codec_env,
    }
    store = RedisStore(redis_client, prefix=redis_prefix, codec=PayloadCodec.from_env(codec_env))
    client = Client(broker=broker_url(redis_url), store=store, settings=FleetSettings(queue=queue, lease_ttl_s=2.0))
    fleet = Fleet(env=env, queue=queue, prefix=redis_prefix, store=store, client=client, log_dir=str(tmp_path))
    yield fleet
    fleet.stop_all()
    redis_client.delete(queue, f"{queue}\x06\x163", f"{queue}\x06\x166", f"{queue}\x06\x169")


def tool_turn(*calls: tuple[str, str, dict[str, Any]]) -> Message:
    from lousho import ToolCall

    return Message.assistant(tool_calls=[ToolCall(id=i, name=n, arguments=a) for i, n, a in calls])
