"""`lousho eval --drift A B` (issue #16): the drift of runs, pair by pair, in the shape of
`compare_trajectories(a, b).drift` (reference: 'Fork and replay'), for sessions and groups of forks, on
every store the command opens by URL. The commands of docs/fork.md run here as written."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lousho import Agent, AgentExecutor, define_tool
from lousho.checkpoint import maybe_await
from lousho.cli import app
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.file import FileStore
from lousho.stores.sql import SqliteStore, SqlStore
from lousho.trajectory import compare_trajectories
from tests.fixtures.core import CityArgs

DOC = Path(__file__).resolve().parents[2] / "docs" / "fork.md"
NO_CONFIG = {"LOUSHO_REDIS_URL": None, "REDIS_URL": None, "LOUSHO_STORE_URL": None, "LOUSHO_PREFIX": None}
RAIN = {"tool_call_id": "w1", "result": {"city": "Lisbon", "forecast": "rain"}}
WEATHER = define_tool(
    name="weather", description="", input=CityArgs, execute=lambda a, c: {"city": a.city, "forecast": "sun"}
)
AGENT = Agent(name="planner", model="m", tools=[WEATHER])


def lousho(*args: str, env: dict[str, Any], ok: bool = True) -> Any:
    result = CliRunner().invoke(app, list(args), env={**NO_CONFIG, **env})
    if ok:
        assert result.exit_code == 0, (args, result.output, result.exception)
    return result


async def _fork(store: Any, new_session_id: str, answers: list[Any], patch: dict[str, Any] | None = None) -> None:
    """Fork 'trip' at step 1 (patched) and replay the fork with `answers`."""
    await AgentExecutor.fork(
        session_id="trip", from_step=1, checkpoint_store=store.checkpoints, patch=patch, new_session_id=new_session_id
    )
    await AgentExecutor.execute(agent=AGENT, input=[], provider=ScriptedProvider(answers),
                                session_id=new_session_id, checkpoint_store=store.checkpoints)  # fmt: skip


async def runs(store: Any) -> None:
    """'trip' and its forks: trip.fork-1 (rain: one more weather call), trip.fork-2 (the same run), and a
    second group trip-v2.fork-1 (as trip.fork-1), trip-v2.fork-2 (a call where trip.fork-2 has none), -3."""
    first = ScriptedProvider([tool_calls(("w1", "weather", {"city": "Lisbon"})), "Picnic."])
    await AgentExecutor.execute(agent=AGENT, input="Plan my day", provider=first, session_id="trip",
                                checkpoint_store=store.checkpoints)  # fmt: skip
    porto = [tool_calls(("w2", "weather", {"city": "Porto"})), "Museum."]
    await _fork(store, "trip.fork-1", porto, {"tool_result": RAIN})
    await _fork(store, "trip.fork-2", ["Picnic."])
    await _fork(store, "trip-v2.fork-1", porto, {"tool_result": RAIN})
    await _fork(store, "trip-v2.fork-2", [tool_calls(("w2", "weather", {"city": "Faro"})), "Beach."])
    await _fork(store, "trip-v2.fork-3", ["Picnic."])


@pytest.fixture(params=["sqlite", "file", "redis", "postgres"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, dict[str, str]]:
    """A store holding the runs, and the environment that points `lousho` at it."""
    kind = request.param
    if kind == "sqlite":
        store: Any = SqliteStore(tmp_path / "jobs.db")
        request.addfinalizer(store.close)
        env = {"LOUSHO_STORE_URL": f"sqlite:///{tmp_path / 'jobs.db'}"}
    elif kind == "file":
        store = FileStore(tmp_path / "files")
        env = {"LOUSHO_STORE_URL": f"file://{tmp_path / 'files'}"}
    elif kind == "redis":
        store = request.getfixturevalue("make_redis_store")()
        env = {"LOUSHO_REDIS_URL": request.getfixturevalue("redis_url"), "LOUSHO_PREFIX": store.prefix}
    else:  # a schema of the test's own (dropped after it), which the command reads by its search path
        url, schema = request.getfixturevalue("postgres_url"), request.getfixturevalue("postgres_schema")
        store = SqlStore(url, schema=schema)
        request.addfinalizer(store.close)
        env = {"LOUSHO_STORE_URL": f"{url}?options=-csearch_path%3D{schema}"}
    asyncio.run(runs(store))
    return store, env


def doc_commands() -> list[list[str]]:
    """The `lousho eval` lines of docs/fork.md's bash block, as argument lists (comments dropped)."""
    block = re.search(r"```bash\n(lousho eval.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert block is not None
    return [shlex.split(line, comments=True)[1:] for line in block.group(1).splitlines() if line.strip()]


def test_eval_drift_prints_each_pairs_drift_in_the_references_shape(store_env: tuple[Any, dict[str, str]]) -> None:
    store, env = store_env
    fail_on_drift, *commands = doc_commands()
    one, baseline, groups = (lousho(*command, env=env) for command in commands)
    failed = lousho(*fail_on_drift, env=env, ok=False)  # the same report, and exit 1: they drift (issue #32)
    assert "--fail-on-drift" in fail_on_drift and failed.exit_code == 1 and failed.stdout == one.stdout

    assert one.stdout.splitlines() == [
        "trip -> trip.fork-1: diverged at step 1; drift",
        "  tool order at step 2: a [], b ['weather']",
        "  step count: a 2, b 3",
        "1 of 1 pair(s) drift",
    ]
    assert baseline.stdout in DOC.read_text(encoding="utf-8")  # the docs show this very output
    report = json.loads(groups.stdout)
    assert [(p["a"], p["b"]) for p in report["pairs"]] == [
        ("trip.fork-1", "trip-v2.fork-1"),
        ("trip.fork-2", "trip-v2.fork-2"),
    ]
    assert report["unpaired"] == {"a": [], "b": ["trip-v2.fork-3"]} and report["drifted"] == 1
    expected = compare_trajectories(
        asyncio.run(maybe_await(store.checkpoints.load("trip.fork-2"))),
        asyncio.run(maybe_await(store.checkpoints.load("trip-v2.fork-2"))),
    )
    assert report["pairs"][1]["drift"] == expected.drift.model_dump(mode="json")
    assert report["pairs"][1]["drift"] == {
        "tool_order": [{"step": 2, "a": [], "b": ["weather"]}],
        "arguments": [],
        "step_count": [2, 3],
        "finish_reason": None,
    }
    assert report["pairs"][0]["drift"]["step_count"] is None and report["pairs"][0]["diverged_at"] is None


def test_eval_needs_drift_and_names_a_group_that_matches_nothing(store_env: tuple[Any, dict[str, str]]) -> None:
    _, env = store_env
    for args, fragment, status in [
        (["eval", "trip", "trip.fork-1"], "[LOUSHO_USAGE] eval takes --drift", 2),
        (["eval", "--drift", "trip", "nope.fork-*"], "no session matches 'nope.fork-*'", 1),
        (["eval", "--drift", "trip", "nope"], "LOUSHO_SESSION_NOT_FOUND", 3),  # not found: 3 (issue #32)
    ]:
        result = lousho(*args, env=env, ok=False)
        assert result.exit_code == status, result.output
        assert "Traceback" not in result.output and fragment in result.stderr, result.stderr
