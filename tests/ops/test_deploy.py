"""deploy/: what can be checked without Docker or Kubernetes. The files parse with what they must hold, and
a local fleet started from the systemd units' own ExecStart lines (`lousho worker`, `lousho reaper`) runs a
job to the end; the Kubernetes liveness command answers for that worker."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ops.conftest import LOUSHO, ROOT, DemoFleet, cli_env

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

DEPLOY = ROOT / "deploy"
VENV_BIN = str(Path(LOUSHO).parent)


def load_unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    unit.read_string((DEPLOY / "systemd" / name).read_text())
    return unit


def k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def node_name(command: list[str]) -> str | None:
    """The Celery node name a worker command gives (`--hostname`/`-n`); None: `lousho worker`'s default."""
    for flag in ("--hostname", "-n"):
        if flag in command:
            return command[command.index(flag) + 1]
    return None


def test_the_compose_file_has_redis_with_aof_and_noeviction_workers_beat_and_flower() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "worker", "beat", "flower"} <= set(services)
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command and "--maxmemory-policy noeviction" in redis_command
    assert services["worker"]["command"][:2] == ["lousho", "worker"] and services["worker"]["deploy"]["replicas"] >= 2
    healthcheck = services["worker"]["healthcheck"]["test"][-1]
    assert (
        "inspect ping -d celery@$$HOSTNAME" in healthcheck and node_name(services["worker"]["command"]) == "celery@%h"
    )
    assert "inspect ping" in services["worker"]["healthcheck"]["test"][1]
    assert " beat " in services["beat"]["command"][-1] and services["beat"]["deploy"]["replicas"] == 1
    assert " flower " in services["flower"]["command"][-1]
    for name in ("worker", "beat", "flower"):
        assert services[name]["environment"]["LOUSHO_REDIS_URL"] == "redis://redis:6379/0"
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["worker"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (ROOT / services["worker"]["build"]["context"].replace("..", ".")).is_dir()


def test_the_dockerfile_copies_what_exists_and_installs_extras_that_exist() -> None:
    import tomllib

    lines = [
        line.split() for line in (DEPLOY / "Dockerfile").read_text().splitlines() if line and not line.startswith("#")
    ]
    for words in lines:
        if words[0] == "COPY" and not words[1].startswith("--from="):
            assert all((ROOT / source).exists() for source in words[1:-1]), words
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    install = next(" ".join(words) for words in lines if "/dist/lousho-*.whl)" in " ".join(words))
    extra = re.search(r'pip install "\$\{wheel\}\[([a-z,]+)\]"', install)  # the wheel the first stage built (#15)
    assert extra is not None, install
    wanted = extra.group(1).split(",")
    assert set(wanted) <= extras, wanted
    assert ["COPY", "--from=wheel", "/dist", "/dist"] in lines
    assert any(w[:2] == ["RUN", "pip"] and "build" in w and "--wheel" in w for w in lines)


def test_the_kubernetes_manifests_have_the_expected_kinds_and_settings() -> None:
    # A topology's own objects (RabbitMQ, ...: label lousho.dev/topology) are checked by its tests (issue #18).
    docs = [d for d in k8s_docs() if "lousho.dev/topology" not in d["metadata"].get("labels", {})]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {
        ("ConfigMap", "lousho-config"),
        ("ConfigMap", "redis-config"),
        ("Service", "redis"),
        ("StatefulSet", "redis"),
        ("Deployment", "lousho-worker"),
        ("Deployment", "lousho-beat"),
        ("Deployment", "lousho-flower"),
        ("Service", "lousho-flower"),
    }
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for kind, name in kinds:
        if kind in ("Deployment", "StatefulSet"):
            spec = by_name[kind, name]["spec"]
            assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    worker = by_name["Deployment", "lousho-worker"]["spec"]["template"]["spec"]["containers"][0]
    assert worker["command"][:2] == ["lousho", "worker"]
    assert "inspect ping -d celery@$HOSTNAME" in worker["livenessProbe"]["exec"]["command"][-1]
    assert node_name(worker["command"]) == "celery@%h"  # the node the probe pings: not the default <app>-<pid>@%h
    beat = by_name["Deployment", "lousho-beat"]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"
    redis_conf = by_name["ConfigMap", "redis-config"]["data"]["redis.conf"]
    assert "appendonly yes" in redis_conf and "maxmemory-policy noeviction" in redis_conf
    assert by_name["ConfigMap", "lousho-config"]["data"]["LOUSHO_REDIS_URL"] == "redis://redis:6379/0"


def test_the_systemd_units_parse() -> None:
    names = sorted(p.name for p in (DEPLOY / "systemd").glob("*.service"))
    assert names == ["lousho-beat.service", "lousho-flower.service", "lousho-reaper.service", "lousho-worker@.service"]
    for name in names:
        unit = load_unit(name)
        assert {"Unit", "Service", "Install"} <= set(unit.sections()), name
        assert unit["Service"]["EnvironmentFile"] == "/etc/lousho/lousho.env"
        assert unit["Service"]["ExecStart"].startswith("/opt/lousho/venv/bin/")
        assert unit["Install"]["WantedBy"] == "multi-user.target"
    if shutil.which("systemd-analyze"):  # systemd's own check, where systemd is installed (the binaries are not)
        done = subprocess.run(
            ["systemd-analyze", "verify", *(str(DEPLOY / "systemd" / n) for n in names)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        problems = [line for line in done.stderr.splitlines() if "is not executable" not in line and line.strip()]
        assert problems == [], done.stderr


def unit_command(name: str, instance: str = "1") -> list[str]:
    """The unit's ExecStart as systemd would run it here: specifiers expanded, the venv in place of /opt/lousho/venv."""
    line = load_unit(name)["Service"]["ExecStart"]
    line = line.replace("%i", instance).replace("%H", socket.gethostname()).replace("%%", "%")
    return [arg.replace("/opt/lousho/venv/bin", VENV_BIN) for arg in shlex.split(line)]


def env_file() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in (DEPLOY / "lousho.env").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    return {k: v for k, v in pairs}


def end(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            return process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
    return process.wait(timeout=30)


def test_a_fleet_started_from_the_unit_commands_runs_a_job_to_the_end(demo_fleet: DemoFleet, tmp_path: Path) -> None:
    env = {
        **cli_env(demo_fleet),
        **{k: v for k, v in env_file().items() if k == "LOUSHO_APP"},
        "LOUSHO_LEASE_TTL_S": "2",
        "LOUSHO_REAPER_INTERVAL_S": "0.5",
    }
    assert env["LOUSHO_APP"] == "lousho.demo.fleet_app:app"
    worker_log, reaper_log = tmp_path / "worker.log", tmp_path / "reaper.log"
    with open(worker_log, "wb") as wlog, open(reaper_log, "wb") as rlog:
        worker = subprocess.Popen(
            unit_command("lousho-worker@.service"),
            env=env,
            cwd=tmp_path,
            stdout=wlog,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        reaper = subprocess.Popen(
            unit_command("lousho-reaper.service"),
            env=env,
            cwd=tmp_path,
            stdout=rlog,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "ready." not in worker_log.read_text(errors="replace"):
            assert worker.poll() is None and time.monotonic() < deadline, worker_log.read_text()[-3000:]
            time.sleep(0.1)
        node = f"worker1@{socket.gethostname()}"
        assert f"{node} ready." in worker_log.read_text()

        def lousho(*args: str) -> str:
            done = subprocess.run([LOUSHO, *args], env=env, capture_output=True, text=True, timeout=90, check=False)
            assert done.returncode == 0, done.stdout + done.stderr + worker_log.read_text()[-3000:]
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
        demo_fleet.wait_for("trip-rome", "finished")
        assert "Your day in Rome" in lousho("show", "trip-rome")
        assert "lousho's pool: 100 slots" in worker_log.read_text()  # one process, 100 steps in flight (issue #29)

        # the Kubernetes liveness command, aimed at this worker's node name
        k8s_worker = next(d for d in k8s_docs() if d["metadata"]["name"] == "lousho-worker")
        probe = k8s_worker["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]
        probe = [*probe[:-1], probe[-1].replace("celery -A", f"{VENV_BIN}/celery -A").replace("celery@$HOSTNAME", node)]
        pinged = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert pinged.returncode == 0 and "pong" in pinged.stdout, pinged.stdout + pinged.stderr
        assert reaper.poll() is None and "lousho reaper: a pass every 0.5s" in reaper_log.read_text()
    finally:
        worker_status, reaper_status = end(worker), end(reaper)
    assert (worker_status, reaper_status) == (0, 0), worker_log.read_text()[-2000:] + reaper_log.read_text()[-2000:]
    assert "lousho reaper: stopped" in reaper_log.read_text()
