"""The `lousho` command, driven as a user drives it: CliRunner in process against a real Redis and a real
worker process, and SQLite/file stores for the commands that only look at runs."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from lousho import Agent, AgentExecutor, define_tool
from lousho.cli import app
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.file import FileStore
from lousho.stores.sql import SqliteStore
from lousho.testing.store_contract import sample_checkpoint, sample_snapshot
from lousho.testing.workers import start_worker
from tests.ops.conftest import ROOT, DemoFleet, cli_env, forget_queue

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

NO_CONFIG = {"LOUSHO_REDIS_URL": None, "REDIS_URL": None, "LOUSHO_STORE_URL": None, "LOUSHO_PREFIX": None}


def lousho(*args: str, env: dict[str, Any] | None = None, ok: bool = True) -> Any:
    result = CliRunner().invoke(app, list(args), env={**NO_CONFIG, **(env or {})})
    if ok:
        assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def assert_one_line_error(result: Any, *fragments: str, code: int = 1) -> None:
    """One line on stderr, `error: [CODE] ...`, and the exit code of the scheme (README 'Exit codes', issue #32):
    1 failed, 2 usage error, 3 not found, 4 timed out."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ["), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def empty_sqlite_store(path: Path) -> None:
    """An SQLite store that exists, with no session (read-only commands refuse a store that does not: issue #32)."""
    store = SqliteStore(path)
    store.sessions()  # opened lazily: the first read creates the file and its tables
    store.close()


def test_errors_are_one_line_and_exit_non_zero(tmp_path: Path) -> None:
    off = {"LOUSHO_LOCAL_REDIS": "off"}  # no local store (issue #15): a missing Redis setting is an error again
    assert_one_line_error(lousho("sessions", env=off, ok=False), "LOUSHO_CONFIGURATION", "LOUSHO_REDIS_URL")
    assert_one_line_error(
        lousho("--redis-url", "redis://127.0.0.1:1/0", "sessions", ok=False), "LOUSHO_STORE_UNAVAILABLE"
    )
    assert_one_line_error(lousho("--store-url", "mongodb://x", "sessions", ok=False), "unknown store URL")
    assert_one_line_error(
        lousho("sessions", env={"LOUSHO_REDIS_URL": "redis://x", "LOUSHO_LEASE_TTL_S": "soon"}, ok=False), "lease_ttl_s"
    )
    empty_sqlite_store(tmp_path / "jobs.db")
    sqlite = f"sqlite:///{tmp_path / 'jobs.db'}"
    assert_one_line_error(lousho("--store-url", sqlite, "show", "nope", ok=False), "no session 'nope'", code=3)
    assert_one_line_error(lousho("--store-url", sqlite, "show", "bad/id", ok=False), "LOUSHO_INVALID_SESSION_ID")
    assert_one_line_error(lousho("--store-url", sqlite, "approve", "appr_nope", ok=False), "appr_nope", code=3)
    assert_one_line_error(lousho("--store-url", sqlite, "enqueue", "a", "hi", ok=False), "needs a Redis store")
    assert_one_line_error(lousho("worker", ok=False), "--app")
    assert_one_line_error(
        lousho("worker", "--app", "nope.mod:app", ok=False), "cannot import the app module 'nope.mod'"
    )
    assert_one_line_error(lousho("worker", "--app", "lousho.settings:app", ok=False), "has no 'app'")
    assert_one_line_error(
        lousho("worker", "--app", "lousho.demo.fleet_app:app", env=off, ok=False), "no Redis configured"
    )


class City(BaseModel):
    city: str


class Charge(BaseModel):
    amount: int


AGENT = Agent(
    name="helper",
    model="m",
    instructions="Help.",
    tools=[
        define_tool(name="weather", description="w", input=City, execute=lambda a, c: {"city": a.city, "sky": "sun"}),
        define_tool(
            name="charge",
            description="c",
            input=Charge,
            execute=lambda a, c: {"charged": a.amount},
            needs_approval=True,
        ),
    ],
)


async def run_local(store: Any, session: str, sky_answer: str = "Sunny.") -> str | None:
    provider = ScriptedProvider(
        [tool_calls(("w1", "weather", {"city": "Oslo"})), tool_calls(("c1", "charge", {"amount": 5})), sky_answer],
        by_turn=True,
    )
    result = await AgentExecutor.execute(
        agent=AGENT,
        input="weather in Oslo, then charge 5",
        provider=provider,
        session_id=session,
        checkpoint_store=store.checkpoints,
        approval_store=store.approvals,
    )
    return result.approval_id


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_looking_at_runs_in_a_sql_or_file_store(kind: str, tmp_path: Path) -> None:
    if kind == "sqlite":
        store: Any = SqliteStore(tmp_path / "jobs.db")
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        store = FileStore(tmp_path / "store")
        url = f"file://{tmp_path / 'store'}"
    approval = asyncio.run(run_local(store, "chat-1"))  # the CLI runs its own event loop: this test has none
    env = {"LOUSHO_STORE_URL": url}

    listed = lousho("sessions", env=env).stdout
    assert "chat-1" in listed and "awaiting-approval" in listed
    pending = lousho("approvals", env=env).stdout
    assert approval is not None and approval in pending and "charge" in pending
    assert "approved" in lousho("approve", approval, "--note", "fine", env=env).stdout
    assert store.approvals.load(approval).status == "approved"

    shown = lousho("show", "chat-1", env=env).stdout
    assert "weather" in shown and '"sky": "sun"' in shown
    history = lousho("history", "chat-1", env=env).stdout
    assert "awaiting-approval" in history and "history of chat-1" in history

    forked = lousho(
        "fork",
        "chat-1",
        "--from-step",
        "1",
        "--tool-result",
        'w1={"city": "Oslo", "sky": "rain"}',
        "--new-session-id",
        "chat-1.rain",
        env=env,
    ).stdout
    assert forked.splitlines()[0] == "chat-1.rain"
    fork_cp = store.checkpoints.load("chat-1.rain")
    assert fork_cp is not None and json.loads(fork_cp.messages[-1].content)["sky"] == "rain"
    compared = lousho("compare", "chat-1", "chat-1.rain", env=env).stdout
    assert "diverged at step 1" in compared

    bad = lousho("fork", "chat-1", "--from-step", "1", "--tool-result", "w1={not json", env=env, ok=False)
    assert_one_line_error(bad, "LOUSHO_USAGE", "not JSON", code=2)  # a flag that does not parse (issue #32)
    assert_one_line_error(
        lousho("fork", "chat-1", "--from-step", "9", env=env, ok=False), "LOUSHO_CHECKPOINT_NOT_FOUND", code=3
    )


@pytest.mark.parametrize("kind", ["sqlite", "file", "redis"])
def test_listings_print_every_readable_record_and_name_the_unreadable_one(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One damaged record must not fail a listing (issue #21): the readable rows are printed, and one
    warning on stderr names the damaged record and why; the command succeeds."""
    if kind == "sqlite":
        store: Any = SqliteStore(tmp_path / "jobs.db")
        env = {"LOUSHO_STORE_URL": f"sqlite:///{tmp_path / 'jobs.db'}"}
    elif kind == "file":
        store = FileStore(tmp_path / "store")
        env = {"LOUSHO_STORE_URL": f"file://{tmp_path / 'store'}"}
    else:
        store = request.getfixturevalue("make_redis_store")()
        env = {"LOUSHO_REDIS_URL": request.getfixturevalue("redis_url"), "LOUSHO_PREFIX": store.prefix}
    for session in ("chat-1", "chat-3"):
        store.checkpoints.save(session, sample_checkpoint(session))
        store.approvals.save(sample_snapshot(f"appr_{session}", session))
    store.checkpoints.put_raw("chat-2", '{"session_id": "chat-2", "messages": [')
    store.approvals.put_raw("appr_chat-2", '{"id": "appr_chat-2", "status": "pending", ')

    listed = lousho("sessions", env=env)
    assert "chat-1" in listed.stdout and "chat-3" in listed.stdout and "chat-2" not in listed.stdout
    warning = listed.stderr.splitlines()
    assert warning[0] == "warning: skipped 1 unreadable session: chat-2", listed.stderr
    assert warning[1].startswith("  chat-2: [LOUSHO_CHECKPOINT_CORRUPT] the stored checkpoint of session 'chat-2'")
    pending = lousho("approvals", env=env)
    assert "appr_chat-1" in pending.stdout and "appr_chat-3" in pending.stdout and "appr_chat-2" not in pending.stdout
    warning = pending.stderr.splitlines()
    assert warning[0] == "warning: skipped 1 unreadable approval: appr_chat-2", pending.stderr
    assert warning[1].startswith("  appr_chat-2: [LOUSHO_APPROVAL_CORRUPT] the stored approval 'appr_chat-2'")
    if kind == "sqlite":
        store.close()


def test_a_job_on_the_fleet_from_enqueue_to_fork_and_compare(demo_fleet: DemoFleet) -> None:
    demo_fleet.start_worker()
    env = cli_env(demo_fleet)

    out = lousho(
        "enqueue",
        "trip_planner",
        "Plan a day in Oslo and book the best restaurant.",
        "--session",
        "trip-oslo",
        "--wait",
        env=env,
    ).stdout.splitlines()
    assert out[0] == "trip-oslo"
    assert out[1].startswith("awaiting-approval approval=appr_"), out
    approval = out[1].split("approval=")[1].split()[0]
    pending = lousho("approvals", env=env).stdout
    assert approval in pending and "book_table" in pending and "trip-oslo" in pending
    assert lousho("approve", approval, "--note", "go", env=env).stdout.startswith(f"approved {approval}")
    demo_fleet.wait_for("trip-oslo", "finished")

    listed = lousho("sessions", "--status", "finished", env=env).stdout
    assert "trip-oslo" in listed and "trip_planner" in listed
    shown = lousho("show", "trip-oslo", env=env).stdout
    assert "Your day in Oslo" in shown and "oslo_book" in shown
    history = lousho("history", "trip-oslo", env=env).stdout
    assert "finished" in history and "awaiting-approval" in history

    forked = lousho(
        "fork",
        "trip-oslo",
        "--from-step",
        "1",
        "--tool-result",
        'oslo_weather={"city": "Oslo", "forecast": "rain"}',
        "--new-session-id",
        "trip-oslo.rain",
        "--run",
        env=env,
    ).stdout
    assert forked.splitlines()[0] == "trip-oslo.rain" and "the fleet runs it now" in forked
    demo_fleet.wait_for("trip-oslo.rain", "awaiting-approval")
    fork_approval = demo_fleet.client.status("trip-oslo.rain").approval_id
    assert fork_approval is not None
    assert "rejected" in lousho("approve", fork_approval, "--reject", "--note", "too wet", env=env).stdout
    demo_fleet.wait_for("trip-oslo.rain", "finished")
    compared = lousho("compare", "trip-oslo", "trip-oslo.rain", env=env).stdout
    assert "diverged at step 1" in compared and "rain" in compared and "rejected" in compared

    # abort: the run stops before it reaches the booking, and stays in-progress and idle. Enqueued on a queue no
    # worker takes yet, so the abort lands before the run could reach its booking however slow `lousho` starts
    # (issue #33: with tools of 0.05 s the worker won that race on a loaded machine); then a worker takes it.
    held = {**env, "LOUSHO_QUEUE": f"{demo_fleet.settings.fleet.queue}-held"}
    enqueue = ("enqueue", "trip_planner", "Plan a day in Rome.", "--session", "trip-rome", "--no-require-worker")
    assert lousho(*enqueue, env=held).stdout.strip() == "trip-rome"
    assert lousho("abort", "trip-rome", env=held).stdout.startswith("aborted trip-rome")
    worker = start_worker("lousho.demo.fleet_app", queue=held["LOUSHO_QUEUE"], name="w-held", env=held, cwd=str(ROOT),
                          log_dir=demo_fleet.log_dir)  # fmt: skip
    demo_fleet.workers.append(worker)
    try:
        deadline = time.monotonic() + 60
        while "'aborted'" not in worker.log():  # the task that took the abort ended
            assert time.monotonic() < deadline, worker.log()[-3000:]
            time.sleep(0.05)
    finally:
        forget_queue(demo_fleet.client.store.client, held["LOUSHO_QUEUE"])
    status = demo_fleet.client.status("trip-rome")
    assert status.status == "in-progress" and status.aborted
    checkpoint = demo_fleet.client.checkpoint("trip-rome")
    assert checkpoint is not None and [m.role for m in checkpoint.messages if m.role == "assistant"] == []
    assert demo_fleet.client.approvals("trip-rome") == []
    assert_one_line_error(lousho("abort", "trip-nope", env=env, ok=False), "no session 'trip-nope'", code=3)


def test_approvals_show_a_sub_agents_inner_call_and_name_the_parent(tmp_path: Path) -> None:
    from lousho import agent_tool

    store = SqliteStore(tmp_path / "jobs.db")
    planner = Agent(name="planner", model="m", tools=[agent_tool(AGENT, name="helper")])
    provider = ScriptedProvider([
        tool_calls(("h1", "helper", {"input": "charge 5"})),
        tool_calls(("c1", "charge", {"amount": 5})),
    ])  # fmt: skip
    asyncio.run(AgentExecutor.execute(agent=planner, input="go", provider=provider, session_id="trip",
                                      checkpoint_store=store.checkpoints, approval_store=store.approvals))  # fmt: skip

    listed = lousho("approvals", env={"LOUSHO_STORE_URL": f"sqlite:///{tmp_path / 'jobs.db'}"}).stdout

    [row] = [index for index, line in enumerate(listed.splitlines()) if line.startswith("appr_")]
    head, where = listed.splitlines()[row : row + 2]
    assert head.split(maxsplit=1)[1] == 'charge {"amount": 5}'
    assert where.strip().startswith("session trip.sub-h1 (sub-agent of trip), waiting")


def test_show_names_the_parent_of_a_sub_agents_session(tmp_path: Path) -> None:
    from lousho import agent_tool

    store = SqliteStore(tmp_path / "jobs.db")
    planner = Agent(name="planner", model="m", tools=[agent_tool(Agent(name="helper", model="m"))])
    provider = ScriptedProvider([tool_calls(("h1", "helper", {"input": "hi"})), "hello", "done"])
    asyncio.run(AgentExecutor.execute(agent=planner, input="go", provider=provider, session_id="trip",
                                      checkpoint_store=store.checkpoints))  # fmt: skip

    shown = lousho("show", "trip.sub-h1", env={"LOUSHO_STORE_URL": f"sqlite:///{tmp_path / 'jobs.db'}"}).stdout

    assert "a sub-agent of session trip: lousho show trip" in shown
