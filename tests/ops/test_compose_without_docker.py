"""deploy/docker-compose.yml, run without Docker (issue #15): this machine has no container engine, so
`docker compose ... up --scale worker=4` itself cannot run here. What each container would run can:
every service's own `command` and `environment`, read from the compose file, started as processes, each
worker in a UTS namespace of its own so that it has its own host name as a container would. The only
changes are those a container engine makes: the `redis` host name becomes 127.0.0.1 and a free port,
the image's /var/lib/lousho a temporary folder, and Flower's published port a free one."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from lousho.testing.redis_server import redis_executable
from tests.docs.walkthrough import free_port
from tests.ops.conftest import LOUSHO, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.workers]

COMPOSE = ROOT / "deploy" / "docker-compose.yml"
SCALE = 4  # as the README's command: --scale worker=4
VENV_BIN = str(Path(LOUSHO).parent)


def compose_text(value: str, env: dict[str, str]) -> str:
    """Compose's own interpolation: `${NAME:-default}` from the caller's environment, `$$` for a literal `$`."""
    value = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), value)
    return value.replace("$$", "$")


def service_env(service: dict[str, Any], redis_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOUSHO_", "FLOWER_")) and k != "REDIS_URL"}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["LOUSHO_DEMO_TOOL_DELAY_S"] = "0.05"
    for name, value in service["environment"].items():
        env[name] = compose_text(str(value), {}).replace("redis://redis:6379", f"redis://127.0.0.1:{redis_port}")
    return env


class Services:
    """The processes started, ended by pid (SIGTERM as `docker compose down` sends, then SIGKILL)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, command: list[str], env: dict[str, str], hostname: str | None = None) -> Path:
        log = self.folder / f"{name}.log"
        if hostname is not None:  # a host name of its own, as each container has
            command = ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh", *command]
        with open(log, "wb") as out:
            process = subprocess.Popen(command, env=env, cwd=self.folder, stdout=out, stderr=subprocess.STDOUT)
        self.started.append((name, process))
        return log

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def stop(self) -> dict[str, int | None]:
        for _, process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        statuses: dict[str, int | None] = {}
        for name, process in self.started:
            try:
                statuses[name] = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                statuses[name] = process.wait(timeout=10)
        return statuses


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    if shutil.which("unshare") is None:  # util-linux, on every Debian
        pytest.fail("this test needs `unshare` (util-linux) to give each worker a host name of its own")
    running = Services(tmp_path)
    yield running
    running.stop()


def wait_for_text(services: Services, name: str, text: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in services.log(name):
        assert time.monotonic() < deadline, f"{name} never printed {text!r}:\n{services.log(name)[-3000:]}"
        time.sleep(0.1)


def start_redis(services: Services, redis_service: dict[str, Any]) -> int:
    port = free_port()
    command = [redis_executable(), *redis_service["command"][1:]]
    command += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(services.folder), "--daemonize", "no"]
    services.start("redis", command, dict(os.environ))
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            if client.ping():
                break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, services.log("redis")
            time.sleep(0.05)
    config = client.config_get("appendonly") | client.config_get("maxmemory-policy")
    assert config == {"appendonly": "yes", "maxmemory-policy": "noeviction"}
    client.close()
    return port


def flower_workers(services: Services, port: int) -> list[str]:
    """The workers Flower lists once it has seen all SCALE of them (its basic auth as the compose file sets it)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/workers?refresh=1")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"admin:change-me").decode())
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                workers = list(json.loads(response.read()))
            if len(workers) == SCALE:
                return workers
        except OSError:
            pass
        assert time.monotonic() < deadline, services.log("flower")[-3000:]
        time.sleep(0.5)


def test_the_compose_services_run_as_processes_serve_a_job_with_four_workers_beat_and_flower(
    services: Services,
) -> None:
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    port = start_redis(services, compose["redis"])
    flower_port = free_port()
    for i in range(1, SCALE + 1):
        worker = compose["worker"]
        services.start(f"worker-{i}", worker["command"], service_env(worker, port), hostname=f"lousho-worker-{i}")
    beat_command = [
        compose_text(a, {}).replace("/var/lib/lousho", str(services.folder)) for a in compose["beat"]["command"]
    ]
    services.start("beat", beat_command, service_env(compose["beat"], port))
    flower_command = [
        compose_text(a, {}).replace("--port=5555", f"--port={flower_port}") for a in compose["flower"]["command"]
    ]
    services.start("flower", flower_command, service_env(compose["flower"], port))
    for i in range(1, SCALE + 1):
        wait_for_text(services, f"worker-{i}", f"celery@lousho-worker-{i} ready.", timeout_s=90)

    host_env = {**service_env(compose["worker"], port), "LOUSHO_REDIS_URL": f"redis://127.0.0.1:{port}/0"}

    def lousho(*args: str) -> str:  # "then, from the host": the compose file's own comment
        done = subprocess.run([LOUSHO, *args], env=host_env, capture_output=True, text=True, timeout=90, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    out = lousho(
        "enqueue",
        "trip_planner",
        "Plan a day in Rome and book the best restaurant.",
        "--session",
        "trip-rome",
        "--wait",
    )
    approval = out.splitlines()[1].split("approval=")[1].split()[0]
    lousho("approve", approval)
    deadline = time.monotonic() + 60
    while "finished" not in lousho("sessions"):
        assert time.monotonic() < deadline, lousho("sessions")
        time.sleep(0.2)
    assert "Your day in Rome" in lousho("show", "trip-rome")

    wait_for_text(services, "beat", "Sending due task")  # beat schedules the reaper
    workers = flower_workers(services, flower_port)
    assert sorted(workers) == [f"celery@lousho-worker-{i}" for i in range(1, SCALE + 1)]

    statuses = services.stop()  # `docker compose down`: SIGTERM, a warm shutdown for the workers
    assert all(statuses[f"worker-{i}"] == 0 for i in range(1, SCALE + 1)), statuses
