"""The operator's path through the operations layer, as the `lousho` command shows it (issue #32): the innermost
call, listings that need no payload key, read-only commands that create nothing, delete and prune, `resume` that
says when nothing is pending, forks that know their source, one exit-code scheme, a closed pipe, 80-column help
and whole ids. No worker is started: the fleet's commands here only read Redis or send messages to it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from lousho import Agent, AgentExecutor, agent_tool
from lousho.checkpoint import ForkOrigin
from lousho.messages import Message
from lousho.operations import LiveReason, Target, list_sessions, live_sessions, pending_approvals, prune_sessions
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.file import FileStore
from lousho.stores.redis import RedisStore
from lousho.stores.sql import SqliteStore
from lousho.testing.store_contract import sample_checkpoint
from tests.ops.conftest import LOUSHO
from tests.ops.test_cli import AGENT, assert_one_line_error, empty_sqlite_store, lousho, run_local
from tests.stores.codecs import CODEC, KEY_1


def sqlite_env(path: Path) -> dict[str, str]:
    return {"LOUSHO_STORE_URL": f"sqlite:///{path}"}


def sub_agent_pause(store: Any) -> None:
    """`trip` pauses in its sub-agent: the call that waits is the sub-agent's `charge {"amount": 5}`."""
    planner = Agent(name="planner", model="m", tools=[agent_tool(AGENT, name="helper")])
    provider = ScriptedProvider([
        tool_calls(("h1", "helper", {"input": "charge 5"})),
        tool_calls(("c1", "charge", {"amount": 5})),
    ])  # fmt: skip
    asyncio.run(AgentExecutor.execute(agent=planner, input="go", provider=provider, session_id="trip",
                                      checkpoint_store=store.checkpoints, approval_store=store.approvals))  # fmt: skip


# (1) the innermost call everywhere


def test_pending_approvals_show_the_innermost_call_and_its_parent(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    sub_agent_pause(store)

    [row] = pending_approvals(Target(store))
    assert (row.tool_call.name, row.tool_call.arguments) == ("charge", {"amount": 5})
    assert (row.session_id, row.parent_session_id) == ("trip.sub-h1", "trip")

    decided = lousho("approve", row.id, env=sqlite_env(tmp_path / "jobs.db")).stdout
    assert f"approved {row.id} (charge of trip.sub-h1)" in decided  # the call decided is the one that waited
    store.close()


# (3) listings never open payloads


def test_a_listing_needs_no_payload_key(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db", codec=CODEC)
    messages = [Message.user("the door code?"), Message.assistant("7531-secret")]
    store.checkpoints.save("door", sample_checkpoint("door", status="finished", messages=messages))
    store.checkpoints.save("gate", sample_checkpoint("gate", status="in-progress"))
    store.close()
    env = {**sqlite_env(tmp_path / "jobs.db"), "LOUSHO_PAYLOAD_KEYS": None, "LOUSHO_PAYLOAD_COMPRESS": None}

    listed = lousho("sessions", env=env)
    assert "door" in listed.stdout and "gate" in listed.stdout and "finished" in listed.stdout
    assert "7531-secret" not in listed.stdout
    finished = json.loads(lousho("sessions", "--status", "finished", "--json", env=env).stdout)
    assert [(r["session_id"], r["status"], r["messages"]) for r in finished] == [("door", "finished", 2)]
    everything = json.loads(lousho("sessions", "--json", env=env).stdout)
    assert {r["session_id"]: r["status"] for r in everything} == {"door": "finished", "gate": "in-progress"}

    keys = f"k1:{base64.b64encode(KEY_1).decode()}"
    opened = json.loads(lousho("sessions", "--json", env={**env, "LOUSHO_PAYLOAD_KEYS": keys}).stdout)
    assert opened == everything  # the key changes nothing: a listing opens no payload (issue #32)
    assert all("7531-secret" not in json.dumps(r) for r in opened)


# (4) read-only commands refuse a store that does not exist


@pytest.mark.parametrize("scheme", ["sqlite", "dbm", "file"])
def test_read_only_commands_refuse_a_store_that_does_not_exist_and_create_nothing(scheme: str, tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    url = f"sqlite:///{path}" if scheme == "sqlite" else f"{scheme}://{path}"
    for command in (["sessions"], ["sessions", "--json"], ["show", "x"], ["history", "x"], ["approvals"],
                    ["compare", "x", "y"], ["eval", "--drift", "x", "y"]):  # fmt: skip
        result = lousho("--store-url", url, *command, ok=False)
        assert_one_line_error(result, "[LOUSHO_STORE_NOT_FOUND]", str(path), code=3)
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_dashboard_refuses_a_store_that_does_not_exist(tmp_path: Path) -> None:
    from lousho.dashboard.serve import dashboard_of
    from lousho.errors import StoreNotFoundError
    from lousho.settings import LoushoSettings

    settings = LoushoSettings(store_url=f"sqlite:///{tmp_path / 'runs.db'}")
    with pytest.raises(StoreNotFoundError, match=re.escape(str(tmp_path / "runs.db"))):
        dashboard_of(settings, read_only=True)
    assert list(tmp_path.iterdir()) == []  # no runs.db, -wal, -shm


# (5) delete, prune, resume that says when nothing is pending


def test_delete_removes_sessions_and_refuses_unknown_ids_whole(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    approval = asyncio.run(run_local(store, "chat-1"))
    store.checkpoints.save("chat-2", sample_checkpoint("chat-2", status="finished"))
    env = sqlite_env(tmp_path / "jobs.db")

    refused = lousho("delete", "chat-1", "nope", env=env, ok=False)
    assert_one_line_error(refused, "no session 'nope'", code=3)
    assert store.checkpoints.load("chat-1") is not None  # nothing deleted

    dry = lousho("delete", "chat-1", "--dry-run", env=env).stdout
    assert "would delete chat-1" in dry and store.checkpoints.load("chat-1") is not None
    done = lousho("delete", "chat-1", "chat-2", env=env).stdout
    assert "deleted chat-1" in done and "deleted 2 session(s)" in done
    assert store.checkpoints.load("chat-1") is None and store.checkpoints.load("chat-2") is None
    assert approval is not None and store.approvals.load(approval) is None  # its approval went with it
    store.close()


def test_prune_deletes_the_sessions_of_a_status_older_than_an_age(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    for session in ("stuck-1", "stuck-2"):
        store.checkpoints.save(session, sample_checkpoint(session, status="in-progress"))
    store.checkpoints.save("done", sample_checkpoint("done", status="finished"))
    env = sqlite_env(tmp_path / "jobs.db")

    young = lousho("prune", "--status", "in-progress", "--older-than", "1h", env=env).stdout
    assert "deleted 0 session(s)" in young and store.checkpoints.load("stuck-1") is not None
    dry = lousho("prune", "--status", "in-progress", "--older-than", "0s", "--dry-run", env=env).stdout
    assert "would delete stuck-1" in dry and "would delete stuck-2" in dry and "done" not in dry
    assert store.checkpoints.load("stuck-1") is not None
    pruned = lousho("prune", "--status", "in-progress", "--older-than", "0s", env=env).stdout
    assert "deleted 2 session(s)" in pruned
    assert store.sessions() == ["done"]
    bad = lousho("prune", "--status", "finished", "--older-than", "soon", env=env, ok=False)
    assert_one_line_error(bad, "LOUSHO_USAGE", "--older-than", code=2)
    store.close()


def fleet_env(store: RedisStore, redis_url: str) -> dict[str, str]:
    return {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": store.prefix, "LOUSHO_STORE_URL": None}  # type: ignore[dict-item]


def test_resume_says_when_nothing_is_pending_and_sends_nothing(redis_store: RedisStore, redis_url: str) -> None:
    redis_store.checkpoints.save("done", sample_checkpoint("done", status="finished"))
    queue = f"{redis_store.prefix}q"

    said = lousho("resume", "done", env={**fleet_env(redis_store, redis_url), "LOUSHO_QUEUE": queue}).stdout
    assert "done is finished: nothing to resume, nothing changed" in said
    assert "resumed" not in said
    assert redis_store.client.llen(queue) == 0  # no message sent


def test_off_a_fleet_no_session_is_live_and_prune_and_delete_take_a_fresh_run(tmp_path: Path) -> None:
    """An SQLite store holds no lease another process can read: a run just saved in-progress is not live there."""
    store = SqliteStore(tmp_path / "jobs.db")
    for session in ("fresh-1", "fresh-2"):
        store.checkpoints.save(session, sample_checkpoint(session, status="in-progress"))
    assert live_sessions(Target(store), ["fresh-1", "fresh-2"]) == {}
    pruned = prune_sessions(Target(store), "in-progress", timedelta(0))
    assert pruned.sessions == ["fresh-1", "fresh-2"] and pruned.kept == {}
    store.checkpoints.save("fresh-3", sample_checkpoint("fresh-3", status="in-progress"))
    assert "deleted fresh-3" in lousho("delete", "fresh-3", env=sqlite_env(tmp_path / "jobs.db")).stdout
    assert store.sessions() == []
    store.close()


def test_a_session_queued_for_a_worker_is_live_until_its_in_flight_deadline_passes(
    redis_store: RedisStore, redis_url: str
) -> None:
    """No worker: an enqueued session waits in flight, its deadline ahead (Redis server time); once that deadline
    is behind (moved by the test, as a worker gone for good leaves it), it is not live and prune takes it."""
    from lousho.fleet.inflight import InflightIndex
    from lousho.scheduler.client import Client
    from lousho.worker import FleetSettings, broker_url

    queue = f"{redis_store.prefix}q"
    client = Client(broker=broker_url(redis_url), store=redis_store, settings=FleetSettings(queue=queue))
    client.enqueue("helper", "go", session_id="queued", require_worker=False)
    target = Target(client.store, client)
    assert live_sessions(target, ["queued"]) == {"queued": LiveReason.IN_FLIGHT}
    assert prune_sessions(target, "in-progress", timedelta(0)).kept == {"queued": LiveReason.IN_FLIGHT}

    inflight = InflightIndex.of(redis_store, 0)
    inflight.touch("queued", deadline_ms=inflight.server_time_ms() - 1)
    assert live_sessions(target, ["queued"]) == {}
    assert prune_sessions(target, "in-progress", timedelta(0)).sessions == ["queued"]
    assert redis_store.checkpoints.load("queued") is None
    redis_store.client.delete(queue)


# (6) forked_from stored with every fork


@pytest.mark.parametrize("kind", ["sqlite", "file", "redis"])
def test_every_fork_stores_its_source_whatever_its_name(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        store: Any = SqliteStore(tmp_path / "jobs.db")
        env: dict[str, Any] = sqlite_env(tmp_path / "jobs.db")
    elif kind == "file":
        store = FileStore(tmp_path / "files")
        env = {"LOUSHO_STORE_URL": f"file://{tmp_path / 'files'}"}
    else:
        store = request.getfixturevalue("redis_store")
        env = fleet_env(store, request.getfixturevalue("redis_url"))
    asyncio.run(run_local(store, "chat-42"))

    lousho("fork", "chat-42", "--from-step", "1", "--new-session-id", "chat-42.porto", env=env)
    lousho("fork", "chat-42", "--from-save", "1", env=env)

    porto = store.checkpoints.load("chat-42.porto")
    assert porto.forked_from == ForkOrigin(session_id="chat-42", step=1, save=porto.forked_from.save)
    assert store.checkpoints.load("chat-42.fork-1").forked_from == ForkOrigin(session_id="chat-42", step=1, save=1)
    assert "forked from chat-42 at step 1" in lousho("show", "chat-42.porto", env=env).stdout
    assert store.checkpoints.load("chat-42").forked_from is None  # the source is untouched
    if kind == "sqlite":
        store.close()


# (8) one exit-code scheme


def test_every_command_follows_the_exit_code_scheme(tmp_path: Path, redis_store: RedisStore, redis_url: str) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    asyncio.run(run_local(store, "chat-1"))
    env = sqlite_env(tmp_path / "jobs.db")
    usage = [
        ["fork", "chat-1"],
        ["fork", "chat-1", "--from-step", "1", "--tool-result", "w1=notjson"],
        ["fork", "chat-1", "--from-step", "1", "--tool-result", "no-equals"],
        ["history", "chat-1", "--limit", "-1"],
        ["--lease-ttl-s", "-5", "sessions"],
        ["sessions", "--lease-ttl-s", "-5"],
        ["sessions", "--status", "bogus"],
        ["eval", "chat-1", "chat-1"],
        ["prune", "--older-than", "1d"],
    ]
    for command in usage:
        assert_one_line_error(lousho(*command, env=env, ok=False), "[LOUSHO_USAGE]", code=2)
    not_found = [["show", "nope"], ["fork", "nope", "--from-step", "1"], ["fork", "chat-1", "--from-save", "99"],
                 ["approve", "appr_nope"], ["delete", "nope"], ["eval", "--drift", "chat-1", "nope"]]  # fmt: skip
    for command in not_found:
        assert_one_line_error(lousho(*command, env=env, ok=False), code=3)
    store.close()

    fleet = {**fleet_env(redis_store, redis_url), "LOUSHO_QUEUE": "q-nobody"}
    timed_out = lousho(
        "enqueue", "helper", "hi", "--no-require-worker", "--wait", "--timeout", "0.2", env=fleet, ok=False
    )
    assert_one_line_error(timed_out, "[LOUSHO_TIMEOUT]", "still in-progress", code=4)


def run_weather(store: Any, session: str, city: str) -> None:
    provider = ScriptedProvider([tool_calls(("w1", "weather", {"city": city})), "Sunny."], by_turn=True)
    asyncio.run(AgentExecutor.execute(agent=AGENT, input="weather", provider=provider, session_id=session,
                                      checkpoint_store=store.checkpoints, approval_store=store.approvals))  # fmt: skip


def test_eval_fails_on_drift_only_when_asked(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    run_weather(store, "a", "Oslo")
    run_weather(store, "b", "Oslo")
    run_weather(store, "c", "Rome")  # the weather call's arguments drift
    env = sqlite_env(tmp_path / "jobs.db")

    assert lousho("eval", "--drift", "a", "b", "--fail-on-drift", env=env).exit_code == 0  # no drift
    reported = lousho("eval", "--drift", "a", "c", env=env)
    assert reported.exit_code == 0 and "arguments of weather" in reported.stdout  # reported, not failed
    failed = lousho("eval", "--drift", "a", "c", "--fail-on-drift", env=env, ok=False)
    assert failed.exit_code == 1 and "1 of 1 pair(s) drift (--fail-on-drift)" in failed.stderr
    store.close()


# (9) output: a closed pipe, 80-column help, whole ids


def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    for n in range(400):
        store.checkpoints.save(f"session-{n:04d}", sample_checkpoint(f"session-{n:04d}", status="finished"))
    store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"}
    env["LOUSHO_STORE_URL"] = f"sqlite:///{tmp_path / 'jobs.db'}"
    for command in ("sessions --json", "sessions"):
        piped = subprocess.run(f"'{LOUSHO}' {command} | head -c 100; exit ${{PIPESTATUS[0]}}", shell=True,
                               executable="/bin/bash", env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert piped.stderr == "", piped.stderr
        assert piped.returncode == 0
        assert len(piped.stdout.encode()) == 100


def test_help_fits_80_columns_with_every_flag_whole_and_a_real_description() -> None:
    for command in ([], ["sessions"], ["fork"], ["approvals"], ["worker"], ["prune"]):
        shown = lousho(*command, "-h", env={"COLUMNS": "80"}).stdout
        assert max(len(line) for line in shown.splitlines()) <= 80, shown
        assert "…" not in shown, shown
    root = lousho("-h", env={"COLUMNS": "80"}).stdout
    for flag in ("--lease-ttl-s", "--heartbeat-interval-s", "--death-check-interval-s", "--approval-repair-interval-s",
                 "--replica-ack-timeout-ms", "--quorum-queues / --no-quorum-queues"):  # fmt: skip
        assert flag in root, root
    assert "FleetSettings." not in root  # no field name for a description
    lease = root[root.index("--lease-ttl-s") : root.index("--heartbeat-interval-s")]
    assert "lease lives this long without a heartbeat" in " ".join(lease.split()) and "default 6.0" in lease


def test_show_and_history_never_cut_a_call_id(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    long_id = "call_" + "x" * 70 + "_end"
    provider = ScriptedProvider([tool_calls((long_id, "weather", {"city": "Oslo " * 30})), "Sunny."], by_turn=True)
    asyncio.run(AgentExecutor.execute(agent=AGENT, input="weather", provider=provider, session_id="s",
                                      checkpoint_store=store.checkpoints, approval_store=store.approvals))  # fmt: skip
    env = {**sqlite_env(tmp_path / "jobs.db"), "COLUMNS": "80"}
    for command in (["show", "s"], ["history", "s"]):
        shown = lousho(*command, env=env).stdout
        assert any(long_id in line for line in shown.splitlines()), shown  # whole, on one line
    store.close()


def test_the_approvals_table_fits_80_columns(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    sub_agent_pause(store)
    shown = lousho("approvals", env={**sqlite_env(tmp_path / "jobs.db"), "COLUMNS": "80"}).stdout
    assert max(len(line) for line in shown.splitlines()) <= 80, shown
    [row] = pending_approvals(Target(store))
    assert row.id in shown and "trip.sub-h1" in shown
    store.close()


def test_an_empty_store_lists_nothing_and_succeeds(tmp_path: Path) -> None:
    empty_sqlite_store(tmp_path / "jobs.db")
    assert list_sessions(Target(SqliteStore(tmp_path / "jobs.db"))).rows == []
    assert lousho("sessions", env=sqlite_env(tmp_path / "jobs.db")).exit_code == 0


def test_the_readmes_cleaning_up_block_works_as_printed(tmp_path: Path) -> None:
    """README 'Cleaning up', each line run as printed (tests/docs/test_readme_walkthrough.py maps them here): a run
    left in-progress two hours ago goes, a fresh one stays, and the fork named goes."""
    import shlex
    import sqlite3
    from datetime import UTC, datetime, timedelta

    from tests.docs.walkthrough import bash_block_after
    from tests.ops.conftest import ROOT

    store = SqliteStore(tmp_path / "jobs.db")
    store.checkpoints.save("demo-stuck", sample_checkpoint("demo-stuck", status="in-progress"))
    store.checkpoints.save("fresh", sample_checkpoint("fresh", status="in-progress"))
    store.checkpoints.save("chat-42.porto", sample_checkpoint("chat-42.porto", status="finished"))
    store.close()
    two_hours_ago = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
    with sqlite3.connect(tmp_path / "jobs.db") as db:  # as if saved two hours ago (the head's time: the listing's)
        db.execute("UPDATE checkpoint_history SET saved_at = ? WHERE session_id = 'demo-stuck'", (two_hours_ago,))
        naive = two_hours_ago[:26].replace("T", " ")  # how the SQL store keeps its naive UTC times
        db.execute("UPDATE lousho_checkpoints SET updated_at = ? WHERE session_id = 'demo-stuck'", (naive,))
    env = sqlite_env(tmp_path / "jobs.db")

    dry, pruned, deleted = (
        lousho(*shlex.split(line)[1:], env=env).stdout
        for line in bash_block_after(ROOT / "README.md", "#### Cleaning up")
    )
    assert "would delete demo-stuck" in dry and "fresh" not in dry
    assert "deleted demo-stuck" in pruned and "deleted 1 session(s)" in pruned
    assert "deleted chat-42.porto" in deleted
    assert SqliteStore(tmp_path / "jobs.db").sessions() == ["fresh"]
