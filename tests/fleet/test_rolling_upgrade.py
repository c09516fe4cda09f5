"""A rolling upgrade that loses nothing (issue #35): the previous release's wheel, built from its recorded commit
(releases.toml) and installed in a venv of its own, runs a fleet on one Redis with sessions in every state:
running, mid tool call, paused for approval, in a sub-agent. Its workers are replaced one at a time by workers of
this code, each stopped with SIGTERM (a warm shutdown, as Kubernetes stops a pod), then its reaper is; every
session finishes with the four guarantees. The same run the other way is the rollback (this code to the previous
release), which the formats allow while they are the same (lousho.formats; docs/upgrading.md)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import lousho
from lousho import Message
from lousho.testing.workers import WorkerProcess, start_worker
from tests.engine.helpers import assert_finished_with_every_result
from tests.fleet.conftest import Fleet, tool_turn
from tests.release.previous_release import Release, shared_release

pytestmark = [pytest.mark.workers, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
CHILD = "trip.sub-pay"
RUNNING = [f"run{i}" for i in range(5)]
MID_ROLL = [f"mid{i}" for i in range(3)]
"""Enqueued once the first worker of the other release is up: they start on both."""
PAUSED = ["pay-early", "pay-late"]
SESSIONS = [*RUNNING, *MID_ROLL, "slow", *PAUSED, "trip", CHILD]


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Release:
    release = shared_release(tmp_path_factory)
    printed = subprocess.run([release.lousho, "--version"], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == f"lousho {release.version}"  # the version it prints is the recorded one
    assert release.wheel.name.startswith(f"lousho-{release.version}-")  # and the wheel's
    return release


class Side:
    """One release's side of the fleet: how its workers and reaper start."""

    def __init__(self, name: str, python: str, pool: str, concurrency: int) -> None:
        self.name, self.python, self.pool, self.concurrency = name, python, pool, concurrency

    @property
    def lousho(self) -> str:
        return str(Path(self.python).parent / "lousho")


@pytest.fixture
def sides(previous: Release) -> dict[str, Side]:
    # The previous release on the solo pool (a tool then runs in the worker's own process, so the pid a call
    # ran on names its worker); this code on its own pool, the default since 0.2 (issue #29).
    return {
        "previous": Side("previous", previous.python, "solo", 1),
        "current": Side("current", sys.executable, "lousho", 20),
    }


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """The fleet tests' app (tests/fleet/fleet_app.py) alone in a folder: with it on PYTHONPATH and not the
    checkout, each side's worker imports the lousho of its own venv."""
    folder = tmp_path / "app"
    folder.mkdir()
    shutil.copy(HERE / "fleet_app.py", folder / "upgrade_app.py")
    return folder


class Reaper:
    """A `lousho reaper` process of one side, stopped with SIGTERM."""

    def __init__(self, side: Side, fleet: Fleet, log: Path) -> None:
        env = {
            **os.environ,
            "LOUSHO_REDIS_URL": fleet.env["LOUSHO_TEST_FLEET_REDIS"],
            "LOUSHO_PREFIX": fleet.prefix,
            "LOUSHO_QUEUE": fleet.queue,
            "LOUSHO_LEASE_TTL_S": "2",
            "LOUSHO_REAPER_INTERVAL_S": "0.5",
            "LOUSHO_REQUEUE_BACKOFF_S": "3",
        }
        with open(log, "wb") as out:
            self.process = subprocess.Popen([side.lousho, "reaper"], env=env, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


@pytest.fixture
def reapers() -> Iterator[list[Reaper]]:
    started: list[Reaper] = []
    yield started
    for reaper in started:
        if reaper.process.poll() is None:
            reaper.process.kill()
            reaper.process.wait(timeout=30)


def script_sessions(fleet: Fleet) -> None:
    for s in [*RUNNING, *MID_ROLL]:  # six turns of two calls each: running on both sides of the roll
        turns = [tool_turn(*[(f"{s}-t{t}-c{c}", "work", {"n": c, "sleep_s": 0.8}) for c in range(2)]) for t in range(6)]
        fleet.script(s, [*turns, Message.assistant(f"{s} done")])
    fleet.script("slow", [tool_turn(("slow-c1", "work", {"n": 1, "sleep_s": 4.0})),  # mid call at the first SIGTERM
                          tool_turn(("slow-c2", "work", {"n": 2, "sleep_s": 0.2})), Message.assistant("slow done")])  # fmt: skip
    for s in PAUSED:
        fleet.script(s, [tool_turn((f"{s}-charge", "charge", {"amount": 10})),
                         tool_turn((f"{s}-after", "work", {"n": 1})), Message.assistant(f"{s} done")])  # fmt: skip
    fleet.script("trip", [tool_turn(("pay", "pay", {"input": "pay the hotel"})), Message.assistant("Trip paid.")])
    fleet.script(CHILD, [tool_turn(("c-work", "work", {"n": 3, "sleep_s": 1.0})),
                         tool_turn(("c-charge", "charge", {"amount": 30})), Message.assistant("charged 30")])  # fmt: skip


def approve(fleet: Fleet, session: str) -> None:
    (listed,) = [a for a in fleet.client.approvals() if a.session_id == session]
    fleet.client.resolve_approval(listed.id, approved=True)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("direction", ["upgrade", "rollback"])
def test_rolling_the_fleet_to_another_release_one_worker_at_a_time_loses_nothing(
    direction: str, fleet: Fleet, sides: dict[str, Side], app_dir: Path, reapers: list[Reaper]
) -> None:
    start, end = (
        (sides["previous"], sides["current"]) if direction == "upgrade" else (sides["current"], sides["previous"])
    )
    env = {**fleet.env, "PYTHONPATH": str(app_dir)}

    def worker(side: Side, name: str) -> WorkerProcess:
        process = start_worker("upgrade_app", queue=fleet.queue, name=name, env=env, cwd=str(app_dir),
                               log_dir=fleet.log_dir, pool=side.pool, concurrency=side.concurrency, python=side.python)  # fmt: skip
        fleet.workers.append(process)
        return process

    script_sessions(fleet)
    olds = [worker(start, f"{start.name}-{i}") for i in range(3)]
    reapers.append(Reaper(start, fleet, Path(fleet.log_dir) / "reaper-start.log"))
    for session in [*RUNNING, "slow", *PAUSED]:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    fleet.client.enqueue("planner", "plan my trip", session_id="trip")
    fleet.wait_for([*PAUSED, "trip", CHILD], status="awaiting-approval", timeout_s=60)
    approve(fleet, "pay-early")  # its run goes on during the roll
    old_pids = {w.pid for w in olds}
    assert int(fleet.pid_running("slow-c1")) in old_pids

    news = []
    for i, old in enumerate(olds):  # one at a time, under load
        news.append(worker(end, f"{end.name}-{i}"))
        if i == 0:  # the registry shows both releases side by side
            versions = {w.version for w in fleet.client.registry.live().workers}
            assert versions == {None, lousho.__version__}, versions  # 0.1.0 states none
            for session in MID_ROLL:
                fleet.client.enqueue("jobs", f"job {session}", session_id=session)
        old.stop(timeout_s=60)  # SIGTERM: a warm shutdown finishes the step it runs
        assert old.process.returncode == 0, old.log()[-3000:]
    reapers[0].stop()
    reapers.append(Reaper(end, fleet, Path(fleet.log_dir) / "reaper-end.log"))

    approve(fleet, "pay-late")
    approve(fleet, "trip")  # the sub-agent's charge, approved on the parent's session
    fleet.wait_for(SESSIONS, timeout_s=120)

    assert fleet.violations() == []  # no model turn asked after it was recorded
    for session in SESSIONS:  # one result per call, in call order, a valid transcript
        assert_finished_with_every_result(fleet.client.checkpoint(session), session)
    assert set(fleet.counts("asked").values()) == {1}  # a saved model turn never generated again
    runs = fleet.counts("runs")
    assert set(runs.values()) == {1}, runs  # a warm shutdown cuts no call short: each ran once, never again
    ran_on = {call: int(pid) for call, pid in fleet.counts("ran-on").items()}
    new_pids = {w.pid for w in news}
    assert ran_on["slow-c1"] in old_pids  # finished by its worker's warm shutdown
    crossed = [
        s
        for s in [*RUNNING, *MID_ROLL]
        if {ran_on[c] in new_pids for c in runs if c.startswith(f"{s}-")} == {True, False}
    ]
    assert crossed, ran_on  # sessions ran on both releases
    assert all(pid in new_pids for call, pid in ran_on.items() if call in ("pay-late-after", "c-charge"))
    assert fleet.client.checkpoint("trip").messages[-1].content == "Trip paid."  # type: ignore[union-attr]
