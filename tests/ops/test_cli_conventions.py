"""The `lousho` command behaves like the tools users know (issue #15): `--version`, `-h` everywhere, global
options before or after the command, `--json` on every command that prints data, `show --full`, ids never
wrapped, readable help placeholders, validated options, saves addressed one by one, and error codes that
say what went wrong."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer

from lousho import Agent, AgentExecutor, define_tool
from lousho.cli import app
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.redis import RedisStore
from lousho.stores.sql import SqliteStore
from lousho.testing.redis_server import RedisServer
from lousho.testing.store_contract import sample_checkpoint, sample_snapshot
from tests.ops.conftest import LOUSHO
from tests.ops.test_cli import AGENT, City, assert_one_line_error, empty_sqlite_store, lousho, run_local

LONG_ANSWER = "Lisbon, day one: " + " ".join(f"stop-{n}" for n in range(80)) + " THE-END"

WEATHER = define_tool(name="weather", description="w", input=City, execute=lambda a, c: {"city": a.city, "sky": "sun"})
TWO_CALLS = Agent(name="twice", model="m", instructions="Help.", tools=[WEATHER])


def sqlite_env(tmp_path: Path) -> dict[str, str]:
    return {"LOUSHO_STORE_URL": f"sqlite:///{tmp_path / 'jobs.db'}"}


def run_two_calls(store: Any, session: str, answer: str = "Done.") -> None:
    """One model turn with two calls: three saves at step 1 (the calls, then each result), one at step 2."""
    provider = ScriptedProvider(
        [tool_calls(("w1", "weather", {"city": "Oslo"}), ("w2", "weather", {"city": "Rome"})), answer], by_turn=True
    )
    asyncio.run(
        AgentExecutor.execute(
            agent=TWO_CALLS, input="weather twice", provider=provider, session_id=session,
            checkpoint_store=store.checkpoints,
        )
    )  # fmt: skip


def table_rows(out: str) -> list[list[str]]:
    """The cells of each row of the rich table in `out` (its header first)."""
    return [
        [cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]]
        for line in out.splitlines()
        if re.match(r"^\s*[│┃]", line)
    ]


def all_command_paths() -> list[list[str]]:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    return [[], *([name] for name in sorted(commands))]


def test_version_prints_the_installed_version() -> None:
    result = lousho("--version")
    assert result.stdout.strip() == f"lousho {version('lousho')}"


@pytest.mark.parametrize("command", all_command_paths(), ids=lambda c: " ".join(c) or "lousho")
def test_dash_h_is_help_on_the_root_and_on_every_command(command: list[str]) -> None:
    short, long = lousho(*command, "-h"), lousho(*command, "--help")
    assert re.match(rf"Usage: \S+ {' '.join(command)}", short.stdout.strip()), short.stdout  # CliRunner's name: root
    assert short.stdout == long.stdout


@pytest.mark.parametrize("command", all_command_paths(), ids=lambda c: " ".join(c) or "lousho")
def test_help_shows_readable_placeholders_not_python_types(command: list[str]) -> None:
    shown = lousho(*command, "--help", env={"COLUMNS": "200"}).stdout
    assert not re.search(r"<(str|int|float|bool|list\[[^>]*\]|[a-z_]+)>", shown), shown
    assert not re.search(r"\{[a-z_]+\}", shown), shown


def test_global_options_are_accepted_after_the_command_too(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    run_two_calls(store, "chat-1")
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    before = lousho("--store-url", url, "sessions").stdout
    after = lousho("sessions", "--store-url", url).stdout
    assert "chat-1" in after and after == before
    assert "Done." in lousho("show", "chat-1", "--store-url", url).stdout
    # after the command, the option wins over the same one before it, as a repeated option does
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert "chat-1" in lousho("--store-url", other, "history", "chat-1", "--store-url", url).stdout
    store.close()


def test_every_command_that_prints_data_prints_json_with_json(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    approval = asyncio.run(run_local(store, "chat-1"))
    run_two_calls(store, "chat-2", answer=LONG_ANSWER)
    env = sqlite_env(tmp_path)

    sessions = json.loads(lousho("sessions", "--json", env=env).stdout)
    assert {s["session_id"]: s["status"] for s in sessions} == {"chat-1": "awaiting-approval", "chat-2": "finished"}
    assert [s["session_id"] for s in sessions] == ["chat-2", "chat-1"]  # newest save first (issue #32)

    shown = json.loads(lousho("show", "chat-2", "--json", env=env).stdout)
    assert shown["session_id"] == "chat-2" and shown["messages"][-1]["content"] == LONG_ANSWER

    saves = json.loads(lousho("history", "chat-2", "--json", env=env).stdout)
    assert [(s["save"], s["step"], s["status"]) for s in saves] == [
        (4, 2, "finished"), (3, 1, "in-progress"), (2, 1, "in-progress"), (1, 1, "in-progress")
    ]  # fmt: skip

    pending = json.loads(lousho("approvals", "--json", env=env).stdout)
    assert [(p["id"], p["session_id"], p["tool_call"]["name"]) for p in pending] == [(approval, "chat-1", "charge")]

    forked = json.loads(lousho("fork", "chat-2", "--from-save", "2", "--new-session-id", "f", "--json", env=env).stdout)
    assert forked == {"session_id": "f", "forked_from": "chat-2", "save": 2, "step": 1}
    compared = json.loads(lousho("compare", "chat-2", "chat-2", "--json", env=env).stdout)
    assert compared["diverged_at"] is None and compared["a"] == compared["b"]
    store.close()


def test_fleet_options_after_the_command_reach_the_fleet(redis_store: RedisStore, redis_url: str) -> None:
    queue = f"q-{redis_store.prefix.strip(':')}"
    env = {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": redis_store.prefix}
    try:
        lousho("enqueue", "greeter", "Hi", "--session", "j-1", "--queue", queue, "--no-require-worker", env=env)
        assert redis_store.client.llen(queue) == 1  # the wake-up went to the queue given after the command
    finally:
        redis_store.client.delete(queue)
    bad = lousho("sessions", "--lease-ttl-s", "soon", env=env, ok=False)
    assert bad.exit_code == 2 and bad.stderr.startswith("error: [LOUSHO_USAGE]") and "--lease-ttl-s" in bad.stderr


def test_json_of_a_fleet_command_is_json(redis_store: RedisStore, redis_url: str) -> None:
    env = {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": redis_store.prefix, "LOUSHO_QUEUE": "nobody-listens"}
    try:
        enqueued = json.loads(
            lousho("enqueue", "greeter", "Hi", "--session", "j-1", "--json", "--no-require-worker", env=env).stdout
        )
    finally:
        redis_store.client.delete("nobody-listens")
    assert enqueued == {"session_id": "j-1"}
    listed = json.loads(lousho("sessions", "--json", env=env).stdout)
    assert [(s["session_id"], s["status"], s["agent"]) for s in listed] == [("j-1", "in-progress", "greeter")]


def test_show_cuts_long_content_and_show_full_prints_it_whole(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    run_two_calls(store, "chat-1", answer=LONG_ANSWER)
    env = sqlite_env(tmp_path)
    assert "THE-END" not in lousho("show", "chat-1", env=env).stdout
    full = lousho("show", "chat-1", "--full", env={**env, "COLUMNS": "60"}).stdout
    assert LONG_ANSWER in full  # on one line: a copied answer is the answer
    assert '{"city": "Oslo", "sky": "sun"}' in full
    store.close()


def test_ids_are_never_wrapped_in_tables(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    session = "customer-4711.order-2025-000123.retry-2"
    approval = f"appr_{'0123456789abcdef' * 3}"
    paused = sample_checkpoint(session).model_copy(update={"status": "awaiting-approval", "approval_id": approval})
    store.checkpoints.save(session, paused)
    store.approvals.save(sample_snapshot(approval, session))
    run_two_calls(store, "chat-1")
    env = {**sqlite_env(tmp_path), "COLUMNS": "60"}  # a narrow terminal
    for command, ids in (
        (["approvals"], [approval, session]),
        (["sessions"], [session, "chat-1"]),
        (["show", session], [approval]),
    ):
        out = lousho(*command, env=env).stdout
        for whole in ids:
            assert any(whole in line for line in out.splitlines()), (command, whole, out)
    store.close()


def test_sessions_status_must_be_one_of_the_statuses(tmp_path: Path) -> None:
    result = lousho("sessions", "--status", "bogus", env=sqlite_env(tmp_path), ok=False)
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: [LOUSHO_USAGE]"), result.stderr
    for status in ("in-progress", "awaiting-approval", "finished", "parked"):
        assert status in lines[0]
    empty_sqlite_store(tmp_path / "jobs.db")
    assert lousho("sessions", "--status", "finished", env=sqlite_env(tmp_path)).exit_code == 0


def test_enqueue_refuses_empty_input_and_writes_nothing(redis_store: RedisStore, redis_url: str) -> None:
    env = {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": redis_store.prefix}
    for empty in ("", "   "):
        assert_one_line_error(
            lousho("enqueue", "booker", empty, "--session", "j-1", env=env, ok=False), "INVALID_INPUT"
        )
    assert redis_store.checkpoints.load("j-1") is None


def test_history_gives_each_save_an_address_that_fork_takes(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    run_two_calls(store, "chat-1")
    env = sqlite_env(tmp_path)
    history = lousho("history", "chat-1", env=env).stdout
    assert "--from-save" in history
    assert [row[:2] for row in table_rows(history) if row[0]] == [  # a row of two calls takes two lines
        ["save", "step"],
        ["4", "2"],
        ["3", "1"],
        ["2", "1"],
        ["1", "1"],
    ]

    # save 2: the first call's result is recorded, the second call is still pending
    out = lousho("fork", "chat-1", "--from-save", "2", "--new-session-id", "chat-1.b", env=env)
    assert out.stdout.splitlines()[0] == "chat-1.b" and "save 2" in out.stdout
    forked = store.checkpoints.load("chat-1.b")
    assert forked is not None and [c.id for c in forked.pending_tool_calls()] == ["w2"]

    # by step, with several saves at that step: it says which one it took and how to take another
    out = lousho("fork", "chat-1", "--from-step", "1", "--new-session-id", "chat-1.c", env=env)
    assert "save 3" in out.stderr and "saves 1, 2, 3" in out.stderr and "--from-save" in out.stderr, out.stderr
    assert_one_line_error(
        lousho("fork", "chat-1", "--from-save", "9", env=env, ok=False),
        "LOUSHO_CHECKPOINT_NOT_FOUND",
        "1, 2, 3, 4",
        code=3,
    )
    assert_one_line_error(
        lousho("fork", "chat-1", "--from-save", "2", "--from-step", "1", env=env, ok=False),
        "LOUSHO_USAGE",
        "--from-step or --from-save",
        code=2,  # a usage error (issue #32)
    )
    store.close()


def test_a_missing_session_is_session_not_found(tmp_path: Path, redis_store: RedisStore, redis_url: str) -> None:
    empty_sqlite_store(tmp_path / "jobs.db")
    env = sqlite_env(tmp_path)
    commands = (["show", "nope"], ["history", "nope"], ["compare", "nope", "nope"], ["delete", "nope"])
    for command in (*commands, ["fork", "nope", "--from-step", "1"]):  # fork: not a missing step (issue #32)
        result = lousho(*command, env=env, ok=False)
        assert_one_line_error(result, "[LOUSHO_SESSION_NOT_FOUND]", "no session 'nope'", code=3)
    fleet = {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": redis_store.prefix}
    for command in (["abort", "nope"], ["resume", "nope"], ["show", "nope"]):
        result = lousho(*command, env=fleet, ok=False)
        assert_one_line_error(result, "[LOUSHO_SESSION_NOT_FOUND]", "no session 'nope'", code=3)


@pytest.fixture
def password_redis() -> Iterator[str]:
    """The socket of a private redis-server that requires a password."""
    with RedisServer() as server:
        server.client().config_set("requirepass", "s3cret-15")
        yield server.socket_path


def test_a_wrong_redis_password_is_an_authentication_failure(password_redis: str) -> None:
    for url in (f"unix://:wrong@{password_redis}?db=0", f"unix://{password_redis}?db=0"):
        for command in (["sessions"], ["enqueue", "a", "hi"], ["approvals"]):
            result = lousho("--redis-url", url, *command, ok=False)
            assert_one_line_error(result, "[LOUSHO_STORE_AUTHENTICATION]", "password")
            assert "unreachable" not in result.stderr and ":wrong@" not in result.stderr


def test_abort_of_a_session_awaiting_approval_says_it_stays_awaiting_approval(
    redis_store: RedisStore, redis_url: str
) -> None:
    paused = sample_checkpoint("paused-1").model_copy(update={"status": "awaiting-approval", "approval_id": "appr_1"})
    redis_store.checkpoints.save("paused-1", paused)
    env = {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": redis_store.prefix}
    out = lousho("abort", "paused-1", env=env).stdout
    assert "in-progress" not in out and "awaiting approval appr_1" in out and "lousho approve appr_1" in out, out
    stored = redis_store.checkpoints.load("paused-1")
    assert stored is not None and stored.status == "awaiting-approval"
    status = json.loads(lousho("sessions", "--json", env=env).stdout)
    assert status == [{**status[0], "session_id": "paused-1", "status": "awaiting-approval", "aborted": False}]


class LiveCommand:
    """A `lousho` command that keeps running (`--watch`, `--follow`): its stdout collected as it comes."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"}
        self.process = subprocess.Popen(
            [LOUSHO, *args], env={**clean, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            ended = self.process.poll() is not None
            if ended:
                self.reader.join(timeout=5)  # what it printed before it ended
            assert text in self.output or not ended, f"ended with {self.process.returncode}:\n{self.output}"
            assert time.monotonic() < deadline, f"{text!r} not in:\n{self.output}"
            time.sleep(0.05)

    def end(self, timeout_s: float = 10.0) -> int:
        """The exit status, after a Ctrl-C if it still runs; killed (by pid) if it does not end in time."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
            return self.process.wait(timeout=timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.reader.join(timeout=5)
            assert self.process.stdout is not None
            self.process.stdout.close()


def test_sessions_watch_prints_the_sessions_again_when_they_change_until_ctrl_c(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    run_two_calls(store, "chat-1")
    watching = LiveCommand("sessions", "--watch", "--interval", "0.1", env=sqlite_env(tmp_path))
    try:
        watching.wait_for("chat-1")
        assert "chat-2" not in watching.output
        run_two_calls(store, "chat-2", answer="Second.")
        watching.wait_for("chat-2")
    finally:
        status = watching.end()
    assert status == 0, watching.output
    tables = watching.output.count("┃ session")
    assert tables == 2, watching.output  # printed once, then once for the change: not on every look
    store.close()


def test_show_follow_prints_new_messages_until_the_session_finishes(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    approval = asyncio.run(run_local(store, "chat-1"))
    assert approval is not None
    following = LiveCommand("show", "chat-1", "--follow", "--interval", "0.1", env=sqlite_env(tmp_path))
    try:
        following.wait_for(f"awaiting approval {approval}")
        store.approvals.decide(approval, True, None)
        asyncio.run(
            AgentExecutor.execute(
                agent=AGENT, input=[], provider=ScriptedProvider(["Charged, and sunny: " + LONG_ANSWER]),
                session_id="chat-1", checkpoint_store=store.checkpoints, approval_store=store.approvals,
            )
        )  # fmt: skip
        status = following.process.wait(timeout=20)  # it ends by itself: the session finished
    finally:
        following.end()
    assert status == 0
    out = following.output
    assert (
        out.index("awaiting approval") < out.index('{"charged": 5}') < out.index(LONG_ANSWER) < out.index("-- finished")
    )
    assert out.count("#0 system") == 1  # each message once
    store.close()
