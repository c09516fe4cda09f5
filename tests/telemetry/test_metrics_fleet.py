"""A scrape of `/metrics` after a fleet run with a SIGKILL says what happened (issue #19): real worker processes in
prometheus_client's multiprocess mode, the real reaper, `lousho metrics` serving the folder and the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lousho import Message
from lousho.fleet.keys import FleetKeys
from lousho.telemetry.metrics import metrics_registry
from lousho.testing.workers import start_worker
from tests.docs.walkthrough import free_port
from tests.fleet.conftest import ROOT, Fleet, tool_turn
from tests.telemetry.conftest import start_recording_reaper

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.workers]

LOUSHO = str(Path(sys.executable).with_name("lousho"))
NOT_RUN = ("recorded", "running-elsewhere", "unknown-session", "waiting-for-approval")
"""Outcomes of a tool_call task that did not run its tool."""


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def value(scraped: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for n, got, v in scraped if n == name and labels.items() <= got.items())


@contextmanager
def lousho_metrics(redis_url: str, prefix: str, folder: Path) -> Iterator[str]:
    """`lousho metrics --port 0` on the test's store and metrics folder; its URL. Ended by pid."""
    env = {**os.environ, "LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": prefix, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    process = subprocess.Popen([LOUSHO, "metrics", "--port", "0"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        banner = process.stderr.readline()
        assert "serving http://" in banner, banner + (process.stderr.read() if process.poll() is not None else "")
        yield banner.split("serving ", 1)[1].strip()
    finally:
        process.terminate()
        process.wait(timeout=15)
        if process.stderr is not None:
            process.stderr.close()


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return samples(reply.read().decode())


def test_a_scrape_after_a_fleet_run_counts_its_turns_calls_and_the_requeue_of_a_killed_call(
    fleet: Fleet, tmp_path: Path, redis_url: str
) -> None:
    folder = tmp_path / "metrics"
    folder.mkdir()
    fleet.script("m1", [tool_turn(("m1-a", "work", {"n": 1})),
                        tool_turn(("m1-b", "work", {"n": 2}), ("m1-c", "work", {"n": 3})), Message.assistant("m1 done")])  # fmt: skip
    fleet.script("m2", [tool_turn(("m2-a", "work", {"n": 1})), Message.assistant("m2 done")])
    fleet.script("m3", [tool_turn(("m3-pay", "charge", {"amount": 5})), Message.assistant("m3 done")])
    fleet.kill_on("tool:m1-a")  # the worker running m1-a dies by SIGKILL in the middle of it
    for _ in range(2):
        fleet.start_worker(LOUSHO_METRICS="1", PROMETHEUS_MULTIPROC_DIR=str(folder))
    requeued: list[str] = []
    start_recording_reaper(fleet, requeued)
    for session in ("m1", "m2", "m3"):
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    fleet.wait_for(["m1", "m2"])
    fleet.wait_for(["m3"], status="awaiting-approval")
    assert not fleet.redis.sismember(fleet.key("kill"), "tool:m1-a")  # the kill happened
    assert sum(not worker.alive() for worker in fleet.workers) == 1

    with lousho_metrics(redis_url, fleet.prefix, folder) as url:
        scraped = scrape(url)

    # Six model turns (m1: 3, m2: 2, m3: 1), each once, in a model_turn task of its own.
    assert value(scraped, "lousho_step_seconds_count", kind="model_turn") == 6
    assert value(scraped, "lousho_step_seconds_count", kind="model_turn", outcome="finished") == 2
    assert value(scraped, "lousho_step_seconds_count", kind="model_turn", outcome="tools-dispatched") == 3
    assert value(scraped, "lousho_step_seconds_count", kind="model_turn", outcome="awaiting-approval") == 1
    # Five tool runs (m1-a twice: killed, then again); the killed one never ended its task.
    runs = fleet.counts("runs")
    assert runs == {"m1-a": 2, "m1-b": 1, "m1-c": 1, "m2-a": 1}
    tool_steps = value(scraped, "lousho_step_seconds_count", kind="tool_call")
    not_run = sum(value(scraped, "lousho_step_seconds_count", kind="tool_call", outcome=o) for o in NOT_RUN)
    assert tool_steps - not_run == sum(runs.values()) - 1
    # The reaper requeued m1 (once, or again when its first advance found the dead call's lease not yet expired).
    assert requeued and set(requeued) == {"m1"}
    assert value(scraped, "lousho_reaper_requeues_total") == len(requeued)
    assert value(scraped, "lousho_step_seconds_count", kind="advance") == len(requeued)
    assert not_run == value(scraped, "lousho_step_seconds_count", kind="tool_call", outcome="running-elsewhere")
    assert not_run == len(requeued) - 1
    # What the store says now.
    assert value(scraped, "lousho_sessions", status="finished") == 2
    assert value(scraped, "lousho_sessions", status="awaiting-approval") == 1
    assert value(scraped, "lousho_sessions", status="in-progress") == 0
    assert value(scraped, "lousho_approvals_waiting") == 1
    assert value(scraped, "lousho_approval_oldest_age_seconds") > 0
    assert value(scraped, "lousho_sessions_in_flight") == 0
    assert value(scraped, "lousho_sessions_parked") == 0
    assert value(scraped, "lousho_lease_takeovers_total") == 0
    assert value(scraped, "lousho_poison_results_total") == 0

    # The fleet goes on: m3's charge is approved, runs, and m3 finishes; the next scrape follows.
    (approval,) = fleet.store.approvals.pending()
    fleet.client.resolve_approval(approval.id, approved=True)
    fleet.wait_for(["m3"])
    with lousho_metrics(redis_url, fleet.prefix, folder) as url:
        later = scrape(url)
    assert fleet.counts("runs")["m3-pay"] == 1
    assert value(later, "lousho_step_seconds_count", kind="model_turn") == 7
    assert value(later, "lousho_step_seconds_count", kind="model_turn", outcome="finished") == 3
    assert value(later, "lousho_step_seconds_count", kind="advance") == len(requeued) + 1  # the approval's
    not_run = sum(value(later, "lousho_step_seconds_count", kind="tool_call", outcome=o) for o in NOT_RUN)
    assert value(later, "lousho_step_seconds_count", kind="tool_call") - not_run == sum(fleet.counts("runs").values()) - 1
    assert value(later, "lousho_sessions", status="finished") == 3
    assert value(later, "lousho_sessions", status="awaiting-approval") == 0
    assert value(later, "lousho_approvals_waiting") == 0
    assert value(later, "lousho_approval_oldest_age_seconds") == 0


def test_a_prefork_worker_serves_the_sum_of_its_children_on_its_metrics_port(
    fleet: Fleet, tmp_path: Path, redis_url: str
) -> None:
    folder = tmp_path / "metrics"
    folder.mkdir()
    port = free_port()
    for session in ("p1", "p2"):
        fleet.script(session, [tool_turn((f"{session}-a", "work", {"n": 1, "sleep_s": 0.3}),
                                         (f"{session}-b", "work", {"n": 2, "sleep_s": 0.3})),
                               Message.assistant(f"{session} done")])  # fmt: skip
    env = {**fleet.env, "LOUSHO_METRICS": "1", "PROMETHEUS_MULTIPROC_DIR": str(folder), "LOUSHO_METRICS_PORT": str(port)}
    # `celery worker` on Celery's prefork pool (lousho's own is the default, issue #29): the tasks run in two
    # child processes.
    worker = start_worker("tests.fleet.fleet_app", queue=fleet.queue, name="prefork", env=env, cwd=ROOT,
                          pool="prefork", concurrency=2, log_dir=str(tmp_path))  # fmt: skip
    try:
        for session in ("p1", "p2"):
            fleet.client.enqueue("jobs", f"job {session}", session_id=session)
        fleet.wait_for(["p1", "p2"])
        scraped = scrape(f"http://127.0.0.1:{port}/metrics")
        children = {int(p) for p in fleet.redis.hvals(fleet.key("ran-on"))}
    finally:
        worker.stop()  # warm shutdown: the children end with it

    assert worker.pid not in children  # the tools ran in the children; the main process serves their sum
    assert value(scraped, "lousho_step_seconds_count", kind="model_turn") == 4
    assert value(scraped, "lousho_step_seconds_count", kind="model_turn", outcome="finished") == 2
    tool_steps = value(scraped, "lousho_step_seconds_count", kind="tool_call")
    not_run = sum(value(scraped, "lousho_step_seconds_count", kind="tool_call", outcome=o) for o in NOT_RUN)
    assert tool_steps - not_run == sum(fleet.counts("runs").values()) == 4
    assert value(scraped, "lousho_sessions", status="finished") == 2
    assert value(scraped, "lousho_reaper_requeues_total") == 0


def test_a_call_that_killed_its_worker_max_attempts_times_is_counted_as_a_poison_result(fleet: Fleet) -> None:
    fleet.script("x1", [tool_turn(("x1-a", "work", {"n": 1})), Message.assistant("x1 done")])
    fleet.kill_on("tool:x1-a")
    for _ in range(2):
        fleet.start_worker(LOUSHO_TEST_MAX_ATTEMPTS="1")  # one death makes a call poison
    requeued: list[str] = []
    start_recording_reaper(fleet, requeued)
    fleet.client.enqueue("jobs", "job x1", session_id="x1")
    fleet.wait_for(["x1"])

    checkpoint = fleet.client.checkpoint("x1")
    assert checkpoint is not None
    results = [json.loads(str(m.content)) for m in checkpoint.messages if m.role == "tool"]
    assert [r.get("error") for r in results] == ["poison"]  # not run again: the poison result
    assert fleet.counts("runs") == {"x1-a": 1}
    scraped = samples(generate_latest(metrics_registry(fleet.store, multiprocess_dir=None)).decode())
    assert value(scraped, "lousho_poison_results_total") == 1
    assert value(scraped, "lousho_reaper_requeues_total") == len(requeued) >= 1


def test_a_worker_stopped_past_its_lease_in_a_model_turn_is_counted_as_a_lease_takeover(
    fleet: Fleet, tmp_path: Path
) -> None:
    folder = tmp_path / "metrics"
    folder.mkdir()
    fleet.script("z1", [Message.assistant("z1 done")])
    fleet.redis.set(fleet.key("model-delay:z1:1"), "1.5")  # the model takes 1.5 s to answer turn 1
    for _ in range(2):
        fleet.start_worker(LOUSHO_METRICS="1", PROMETHEUS_MULTIPROC_DIR=str(folder))
    requeued: list[str] = []
    start_recording_reaper(fleet, requeued)
    fleet.client.enqueue("jobs", "job z1", session_id="z1")
    lease = FleetKeys(fleet.store).lease("z1")
    deadline = time.monotonic() + 30
    while not fleet.counts("asked").get("z1:1"):  # the model is being asked, under the session's lease
        assert time.monotonic() < deadline
        time.sleep(0.02)
    holder = fleet.redis.get(lease)
    assert holder is not None
    zombie = fleet.worker_with_pid(int(holder.decode().split("|")[1].split("-")[0]))  # <host>|<pid>-<uuid>

    zombie.kill(signal.SIGSTOP)  # past its 2 s lease: the reaper requeues z1, the other worker takes it over
    fleet.wait_for(["z1"], timeout_s=60)
    zombie.kill(signal.SIGCONT)  # it wakes with the model's answer; its save is refused
    deadline = time.monotonic() + 30
    while value(scraped := samples(generate_latest(metrics_registry(fleet.store, multiprocess_dir=str(folder))).decode()),
                "lousho_step_seconds_count", kind="model_turn") < 1:  # fmt: skip
        assert time.monotonic() < deadline, scraped
        time.sleep(0.1)

    assert fleet.counts("asked") == {"z1:1": 2}  # asked by the zombie, then by the worker that took over
    assert requeued and set(requeued) == {"z1"}
    assert value(scraped, "lousho_lease_takeovers_total") == 1
    # The zombie's model_turn task stood down when its save was refused; the turn was recorded by the requeue's
    # advance. (Later requeues of the finished z1, if any, come from the zombie's last heartbeat putting it back
    # in the in-flight index: a fleet issue outside this test's subject, noted in the issue #19 report.)
    assert value(scraped, "lousho_step_seconds_count", kind="model_turn") == 1
    assert value(scraped, "lousho_step_seconds_count", kind="model_turn", outcome="error: LOUSHO_LEASE_LOST") == 1
    assert value(scraped, "lousho_step_seconds_count", kind="advance", outcome="finished") >= 1
