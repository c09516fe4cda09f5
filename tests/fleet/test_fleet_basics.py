"""The fleet runs the same engine as the in-process path, one Celery task per model turn and per tool call."""

from __future__ import annotations

import importlib

import pytest

from lousho import Agent, AgentExecutor, Message, memory_store
from lousho.providers import ScriptedProvider
from tests.engine.helpers import assert_valid_transcript
from tests.fleet.conftest import Fleet, tool_turn


def job_script() -> list[Message]:
    return [
        tool_turn(("a", "work", {"n": 2}), ("b", "work", {"n": 3, "sleep_s": 0.05}), ("c", "work", {"n": 4})),
        tool_turn(("d", "work", {"n": 5})),
        Message.assistant("all done"),
    ]


def test_a_job_runs_to_the_end_on_the_fleet(fleet: Fleet) -> None:
    fleet.start_worker()
    fleet.script("job-1", job_script())

    fleet.client.enqueue("jobs", "do the work", session_id="job-1")
    fleet.wait_for(["job-1"], timeout_s=60)

    checkpoint = fleet.client.checkpoint("job-1")
    assert checkpoint is not None
    assert_valid_transcript(checkpoint.messages)
    assert [m.tool_call_id for m in checkpoint.messages if m.role == "tool"] == ["a", "b", "c", "d"]
    assert fleet.counts("runs") == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert fleet.counts("asked") == {"job-1:1": 1, "job-1:2": 1, "job-1:3": 1}


def test_a_model_that_reuses_call_ids_across_turns_gets_each_turns_own_results(fleet: Fleet) -> None:
    # Some OpenAI-compatible servers number calls per turn ('call_0' every time): a result committed
    # for one turn's call must never stand for the next turn's call of the same id.
    fleet.start_worker()
    fleet.script("reuse", [*(tool_turn(("call_0", "work", {"n": n})) for n in (2, 3, 4)), Message.assistant("done")])

    fleet.client.enqueue("jobs", "go", session_id="reuse")
    fleet.wait_for(["reuse"], timeout_s=60)

    checkpoint = fleet.client.checkpoint("reuse")
    assert checkpoint is not None
    assert [m.result() for m in checkpoint.messages if m.role == "tool"] == [
        {"n": n, "square": n * n} for n in (2, 3, 4)
    ]
    assert fleet.counts("runs") == {"call_0": 3}
    assert fleet.redis.exists(fleet.client.keys.results("reuse")) == 0  # dropped as each turn completed


async def test_the_fleet_gives_the_same_transcript_as_the_in_process_path(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in fleet.env.items():
        monkeypatch.setenv(name, value)
    fleet_app = importlib.import_module("tests.fleet.fleet_app")
    fleet.start_worker()
    fleet.script("job-2", job_script())
    fleet.client.enqueue("jobs", "do the work", session_id="job-2")
    fleet.wait_for(["job-2"], timeout_s=60)

    agent: Agent = fleet_app.agent
    local_store = memory_store()
    local = await AgentExecutor.execute(agent=agent, input="do the work", provider=ScriptedProvider(job_script()),
                                        session_id="job-2", checkpoint_store=local_store.checkpoints, approval_store=local_store.approvals)
    on_fleet = fleet.client.checkpoint("job-2")
    assert on_fleet is not None
    assert on_fleet.messages == local.messages


def test_two_workers_without_a_reaper_hand_each_step_on_without_stalling(fleet: Fleet) -> None:
    """The next turn is sent after the lease is released: an idle worker must not find it held and drop it."""
    sessions = [f"hand-{i}" for i in range(5)]
    for session in sessions:
        fleet.script(session, [tool_turn((f"{session}-a", "work", {"n": 1})), tool_turn((f"{session}-b", "work", {"n": 2})), Message.assistant("done")])
    fleet.start_worker()
    fleet.start_worker()

    for session in sessions:
        fleet.client.enqueue("jobs", "go", session_id=session)
    fleet.wait_for(sessions, timeout_s=20)  # no reaper runs here: nothing would rescue a dropped turn


def test_input_that_arrives_while_the_last_call_runs_is_placed_after_its_result(fleet: Fleet) -> None:
    # The call's task folds its result with the checkpoint it read before the call ran; new input
    # moved the session on meanwhile, so that save is refused and the result is folded the usual way.
    fleet.start_worker()
    fleet.script("late", [tool_turn(("late-1", "work", {"n": 3, "sleep_s": 1.0})), Message.assistant("done")])
    fleet.client.enqueue("jobs", "go", session_id="late")
    fleet.pid_running("late-1")

    fleet.client.enqueue("jobs", "and one more thing", session_id="late")
    fleet.wait_for(["late"], timeout_s=30)

    checkpoint = fleet.client.checkpoint("late")
    assert checkpoint is not None
    assert_valid_transcript(checkpoint.messages)
    assert [(m.role, m.content) for m in checkpoint.messages[-3:]] == [
        ("tool", checkpoint.messages[-3].content),
        ("user", "and one more thing"),
        ("assistant", "done"),
    ]
    assert checkpoint.messages[-3].result() == {"n": 3, "square": 9}
    assert fleet.counts("runs") == {"late-1": 1}
