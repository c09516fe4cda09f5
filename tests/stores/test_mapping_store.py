"""The mapping store (issue #16, item 3): the reference's LocalStorage store in Python, on a dict, a shelve and a
dbm file. The contract suite runs on it in test_contract.py; here: a fork, `memory_store(storage=)`, what a save
writes, what delete and prune leave behind, and a dbm file read again by another process."""

from __future__ import annotations

import dbm
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lousho import AgentExecutor, StoreBundle, compare_trajectories, create_agent, mapping_store, memory_store
from lousho.providers.scripted import ScriptedProvider, tool_calls
from lousho.stores.mapping import MappingStore, dbm_store
from lousho.testing.store_contract import sample_checkpoint
from tests.fixtures.core import ToolLog, weather_tool
from tests.stores.mappings import MAPPINGS, mapping_stores

WEATHER = ("call_weather", "weather", {"city": "Oslo"})


@pytest.fixture(params=MAPPINGS)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., MappingStore]]:
    with mapping_stores(request.param, tmp_path) as make:
        yield make


class CountingDict(dict[str, Any]):
    """A dict that counts the values written into it."""

    writes = 0

    def __setitem__(self, key: str, value: Any) -> None:
        self.writes += 1
        super().__setitem__(key, value)


def _save_steps(store: MappingStore, session_id: str, count: int, status: str = "finished") -> None:
    for step in range(count):
        last = step == count - 1
        checkpoint = sample_checkpoint(
            session_id, version=step + 1, step=step, status=status if last else "in-progress", approval_id=None
        )
        store.checkpoints.save(session_id, checkpoint)


async def test_a_run_on_the_mapping_store_forks_and_the_fork_resumes(make_store: Callable[..., MappingStore]) -> None:
    """The history ring is what fork reads: a run, forked from its step 1 with a patched tool result, resumes
    to its own answer while the original stays as it was (on a dict, a shelve and a dbm file)."""
    store, log = make_store(), ToolLog()
    agent = create_agent(
        provider=ScriptedProvider([tool_calls(WEATHER), "Pack sunscreen."]),
        store=store,
        name="planner",
        model="test-model",
        tools=[weather_tool(log)],
    )
    first = await agent.send("Plan my trip", session_id="trip")
    assert first.text == "Pack sunscreen." and log.runs["call_weather"] == 1
    rain = {"city": "Oslo", "forecast": "rain"}
    forked = await agent.fork(
        "trip", from_step=1, patch={"tool_result": {"tool_call_id": "call_weather", "result": rain}}
    )
    assert forked.session_id == "trip.fork-1"
    replay = ScriptedProvider(["Pack an umbrella."])
    result = await AgentExecutor.execute(
        agent=agent.definition,
        input=[],
        provider=replay,
        session_id=forked.session_id,
        checkpoint_store=store.checkpoints,
    )
    assert result.text == "Pack an umbrella." and log.runs["call_weather"] == 1, "the fork ran the recorded tool again"
    original, replayed = store.checkpoints.load("trip"), store.checkpoints.load("trip.fork-1")
    assert original is not None and replayed is not None
    assert original.messages[-1].content == "Pack sunscreen."
    assert "rain" in str(replayed.messages[-2].content)
    assert compare_trajectories(original, replayed).diverged_at == 1
    assert list(store.sessions(status="finished")) == ["trip", "trip.fork-1"]


def test_memory_store_takes_a_mapping_as_its_storage() -> None:
    """`memory_store(storage=...)` (the reference's memoryStore over a LocalStorage) is the mapping store on it."""
    storage: dict[str, str] = {"someone-else's": "key"}
    store = memory_store(storage=storage, history_limit=3)
    assert isinstance(store, MappingStore) and isinstance(store, StoreBundle)
    _save_steps(store, "s-1", 5)
    assert [e.step for e in store.checkpoints.history("s-1")] == [4, 3, 2]
    again = memory_store(storage=storage)  # a second store on the same storage reads what the first wrote
    assert again.checkpoints.load("s-1") == store.checkpoints.load("s-1")
    assert storage["someone-else's"] == "key"
    assert all(key.startswith("lousho:") for key in storage if key != "someone-else's")


def test_a_save_writes_only_its_new_messages_and_a_history_entry_does_not_grow() -> None:
    """What a save costs does not grow with the transcript: its new messages, one head and the ring."""
    data = CountingDict()
    store = mapping_store(data)
    checkpoint = sample_checkpoint("s-long", version=1, status="in-progress", approval_id=None)
    store.checkpoints.save("s-long", checkpoint)
    for version in range(2, 40):
        checkpoint = store.checkpoints.load("s-long") or checkpoint
        grown = [*checkpoint.messages, checkpoint.messages[1].model_copy(update={"content": f"turn {version}"})]
        before = data.writes
        store.checkpoints.save("s-long", checkpoint.model_copy(update={"version": version, "messages": grown}))
        assert data.writes - before == 3, "a save wrote more than its one new message, its head and its ring"
    entries = data["lousho:hist/s-long"].split("\n")
    assert max(len(entry) for entry in entries) < 2 * min(len(entry) for entry in entries)
    loaded = store.checkpoints.load("s-long")
    assert loaded is not None and len(loaded.messages) == 5 + 38


def test_delete_and_prune_leave_no_key_of_the_session_and_touch_no_other_key() -> None:
    data: dict[str, str] = {"app:settings": "{}"}
    store = mapping_store(data)
    _save_steps(store, "s-gone", 3)
    _save_steps(store, "s-old", 2)
    _save_steps(store, "s-kept", 2, status="in-progress")
    store.delete("s-gone")
    assert [key for key in data if "s-gone" in key] == []
    pruned = store.prune(datetime.now(UTC) + timedelta(minutes=1))
    assert (pruned.checkpoints, pruned.history) == (1, 4)
    assert [key for key in data if "s-old" in key] == []
    assert store.checkpoints.load("s-kept") is not None, "an unfinished session was pruned"
    assert data["app:settings"] == "{}"


def test_a_dbm_file_hands_back_bytes_and_the_store_reads_them_as_text(tmp_path: Path) -> None:
    with dbm_store(tmp_path / "runs.db") as store:
        _save_steps(store, "s-dbm", 2)
        assert isinstance(store.mapping[b"lousho:cp/s-dbm"], bytes)
        assert store.checkpoints.load("s-dbm") == sample_checkpoint(
            "s-dbm", version=2, step=1, status="finished", approval_id=None
        )
        assert list(store.sessions(status="finished")) == ["s-dbm"]


def test_a_dbm_store_is_read_again_by_another_process_after_it_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "folder" / "runs.db"  # the folder is created
    with dbm_store(path) as store:
        _save_steps(store, "s-kept", 3)
    assert dbm.whichdb(str(path)) is not None
    probe = (
        "import sys; from lousho.stores.mapping import dbm_store; "
        "s = dbm_store(sys.argv[1]); c = s.checkpoints.load('s-kept'); "
        "print(c.step_index, len(s.checkpoints.history('s-kept')), list(s.sessions())); s.close()"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "2 3 ['s-kept']"
