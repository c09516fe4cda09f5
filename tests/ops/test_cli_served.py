"""`lousho enqueue` of an agent no worker serves, and a parked run, as a user meets them (issue #15): refused at
once naming what is served; enqueued ahead of the workers on request; `--wait` on a parked run exits non-zero
saying why; `show` and `sessions` agree that it is parked, and say why."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from lousho.cli import app
from tests.ops.conftest import DemoFleet, cli_env

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def lousho(*args: str, env: dict[str, str]) -> Any:
    return CliRunner().invoke(app, list(args), env=env)


def test_enqueueing_an_agent_no_worker_serves_fails_at_once_naming_the_served_agents(demo_fleet: DemoFleet) -> None:
    demo_fleet.start_worker()
    env = cli_env(demo_fleet)
    queue = demo_fleet.settings.fleet.queue
    refused = lousho("enqueue", "booker", "A table for 2 tonight", "--session", "chat-1", "--wait", env=env)
    assert refused.exit_code == 1, refused.output
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: [LOUSHO_AGENT_NOT_SERVED] no live worker serves agent 'booker'"), line
    assert f"(served: 'trip_planner' on {queue!r})" in line and "--no-require-worker" in line
    assert refused.stdout == "" and demo_fleet.client.checkpoint("chat-1") is None  # nothing enqueued


def test_enqueue_wait_exits_non_zero_on_a_parked_run_and_prints_why(demo_fleet: DemoFleet) -> None:
    demo_fleet.start_worker()
    env = cli_env(demo_fleet)
    args = ["enqueue", "booker", "A table for 2 tonight", "--session", "chat-2", "--no-require-worker", "--wait"]
    parked = lousho(*args, env=env)  # ahead of the workers: the worker that takes it serves no booker
    assert parked.exit_code == 1, parked.output
    assert parked.stdout.splitlines() == ["chat-2", "parked"]
    assert parked.stderr.startswith("error: chat-2 is parked: [LOUSHO_UNKNOWN_AGENT] no agent named 'booker'"), (
        parked.stderr
    )
    assert "lousho resume chat-2" in parked.stderr
    as_json = lousho(*args[:4], "chat-3", *args[5:], "--json", env=env)
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["status"] == "parked"


def test_show_and_sessions_agree_that_a_session_is_parked_and_say_why(demo_fleet: DemoFleet) -> None:
    demo_fleet.start_worker()
    env = cli_env(demo_fleet)
    lousho("enqueue", "booker", "A table for 2", "--session", "chat-4", "--no-require-worker", "--wait", env=env)
    shown = lousho("show", "chat-4", env=env)
    assert shown.exit_code == 0, shown.output
    assert "chat-4 (parked, step 0)" in shown.stdout and "in-progress" not in shown.stdout
    assert "parked: [LOUSHO_UNKNOWN_AGENT] no agent named 'booker'" in shown.stdout
    assert "lousho resume chat-4" in shown.stdout
    full = lousho("show", "chat-4", "--full", env=env).stdout
    assert full.startswith("chat-4 (parked, step 0)") and "parked: [LOUSHO_UNKNOWN_AGENT]" in full
    listed = lousho("sessions", env=env).stdout
    [row] = [line for line in listed.splitlines() if "chat-4" in line]
    assert "parked" in row and "parked: [LOUSHO_UNKNOWN_AGENT]" in row, listed
    [record] = json.loads(lousho("sessions", "--json", env=env).stdout)
    assert record["status"] == "parked" and "no agent named 'booker'" in record["parked_reason"]
