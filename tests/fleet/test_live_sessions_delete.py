"""`prune` and `delete` of a session a worker is running, on real worker processes: a live session is kept (and
the dry run says why), `delete` refuses it with `SessionLiveError`, and `delete --force` aborts its run first and
leaves no key of it, even while its worker still runs the call. Each tool call here waits at a gate the test opens
(tests/fleet/fleet_app.py `gate`): every wait is for an event, never for time."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from lousho import SessionLiveError
from lousho.cli import app as cli_app
from lousho.errors import SessionLiveError as SessionLiveErrorOfErrors
from lousho.operations import LiveReason, delete_sessions, live_sessions, prune_sessions
from lousho.testing.store_contract import sample_checkpoint
from tests.engine.helpers import assert_valid_transcript
from tests.fixtures.live_sessions import (
    all_logs,
    open_gate,
    session_keys_left,
    start_gated_run,
    tool_task_ended,
    wait_for,
)
from tests.fleet.conftest import Fleet

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def cli(fleet: Fleet, *args: str, ok: bool = True) -> Any:
    env = {"LOUSHO_REDIS_URL": fleet.env["LOUSHO_TEST_FLEET_REDIS"], "LOUSHO_PREFIX": fleet.prefix,
           "LOUSHO_QUEUE": fleet.queue, "LOUSHO_STORE_URL": None, "REDIS_URL": None}  # fmt: skip
    result = CliRunner().invoke(cli_app, list(args), env=env)
    assert (result.exit_code == 0) is ok, (args, result.output, result.exception)
    return result


def test_prune_keeps_a_session_whose_tool_call_runs_and_its_run_finishes_with_every_guarantee(fleet: Fleet) -> None:
    # in-progress and not in flight (as an aborted run is left): nobody runs it
    fleet.store.with_inflight_deadline(0).checkpoints.save("stale", sample_checkpoint("stale", status="in-progress"))
    target = start_gated_run(fleet, "busy", "g1")
    assert live_sessions(target, ["busy", "stale"]) == {"busy": LiveReason.TOOL_CALL_RUNNING}

    dry = prune_sessions(target, "in-progress", timedelta(0), dry_run=True)
    assert dry.kept == {"busy": LiveReason.TOOL_CALL_RUNNING} and dry.sessions == ["stale"]
    pruned = prune_sessions(target, "in-progress", timedelta(0))
    assert pruned.kept == {"busy": LiveReason.TOOL_CALL_RUNNING} and pruned.sessions == ["stale"]
    assert fleet.store.checkpoints.load("stale") is None
    assert fleet.store.checkpoints.load("busy") is not None

    open_gate(fleet, "g1")
    fleet.wait_for(["busy"], timeout_s=60)
    checkpoint = fleet.client.checkpoint("busy")
    assert checkpoint is not None
    assert_valid_transcript(checkpoint.messages)
    assert [m.result() for m in checkpoint.messages if m.role == "tool"] == [{"n": 7, "gated": True}]  # one result
    assert checkpoint.messages[-1].content == "done"
    assert fleet.counts("runs") == {"g1": 1}
    assert fleet.violations() == []


def test_delete_refuses_a_session_whose_tool_call_runs_and_deletes_nothing(fleet: Fleet) -> None:
    target = start_gated_run(fleet, "busy", "g1")
    keys_before = session_keys_left(fleet.store, "busy")

    with pytest.raises(SessionLiveError) as refused:
        delete_sessions(target, ["busy"])
    assert SessionLiveError is SessionLiveErrorOfErrors and refused.value.code == "LOUSHO_SESSION_LIVE"
    assert "--force" in str(refused.value) and "tool calls" in str(refused.value)
    with pytest.raises(SessionLiveError):
        delete_sessions(target, ["busy"], dry_run=True)  # the dry run says what the run would do: refuse
    assert session_keys_left(fleet.store, "busy") == keys_before  # nothing deleted, nothing aborted

    open_gate(fleet, "g1")
    fleet.wait_for(["busy"], timeout_s=60)
    assert fleet.counts("runs") == {"g1": 1}
    assert not fleet.client.status("busy").aborted


def test_the_cli_says_which_sessions_prune_kept_and_why_and_delete_asks_for_force(fleet: Fleet) -> None:
    start_gated_run(fleet, "busy", "g1")

    dry = cli(fleet, "prune", "--status", "in-progress", "--older-than", "0s", "--dry-run").stdout
    assert "kept busy: it is live, a worker is running one of its tool calls" in dry
    assert "would delete 0 session(s), kept 1 live (dry run: nothing changed)" in dry
    as_json = json.loads(cli(fleet, "prune", "--status", "in-progress", "--older-than", "0s", "--json").stdout)
    assert as_json["deleted"] == [] and [k["session_id"] for k in as_json["kept"]] == ["busy"]
    assert as_json["kept"][0]["reason"] == "tool-call-running"
    refused = cli(fleet, "delete", "busy", ok=False)
    assert refused.exit_code == 1 and "LOUSHO_SESSION_LIVE" in refused.stderr and "--force" in refused.stderr
    assert fleet.store.checkpoints.load("busy") is not None

    forced = cli(fleet, "delete", "busy", "--force").stdout
    assert "aborted the run of busy" in forced and "deleted busy" in forced
    assert session_keys_left(fleet.store, "busy") == []
    wait_for(lambda: tool_task_ended(fleet, "g1"), "the cancelled call's task ended", logs=all_logs(fleet.workers))
    assert session_keys_left(fleet.store, "busy") == []  # the worker, told to stop, wrote nothing back
    assert fleet.redis.hget(fleet.key("returned"), "g1") is None  # the abort cut the call short


def test_a_worker_still_running_a_force_deleted_session_writes_nothing_back(fleet: Fleet) -> None:
    """A tool deaf to its abort signal: the forced delete does not wait for it (`stop_wait_s=0`); the call then
    returns and its worker commits, but the session's incarnation went with it: nothing that stays is written back."""
    fleet.redis.set(fleet.key("stubborn:g1"), 1)
    target = start_gated_run(fleet, "busy", "g1")

    deleted = delete_sessions(target, ["busy"], force=True, stop_wait_s=0)
    assert deleted.aborted == ["busy"] and deleted.sessions == ["busy"]
    assert session_keys_left(fleet.store, "busy") == []

    open_gate(fleet, "g1")
    wait_for(lambda: fleet.redis.hget(fleet.key("returned"), "g1"), "the call returned", logs=all_logs(fleet.workers))
    wait_for(lambda: tool_task_ended(fleet, "g1"), "the call's task ended", logs=all_logs(fleet.workers))
    # What the late worker may leave is a lease it took to fold, which expires by itself: nothing that stays.
    left = session_keys_left(fleet.store, "busy")
    assert all(key.endswith(":lease") and fleet.redis.pttl(key) > 0 for key in left), left
    assert fleet.store.checkpoints.load("busy") is None
