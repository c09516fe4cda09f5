"""The fleet under SIGKILL, duplicate delivery and a paused worker (DESIGN.md: 'Reliability rules for the fleet')."""

from __future__ import annotations

import json
import random
import signal
import time

from lousho import Message
from lousho.fleet.dispatch import send_advance, send_model_turn, send_tool_call
from lousho.fleet.keys import result_field
from tests.engine.helpers import assert_valid_transcript
from tests.fleet.conftest import Fleet, tool_turn


def random_script(rng: random.Random, session: str) -> list[Message]:
    turns = []
    for t in range(rng.randint(1, 2)):
        calls = [(f"{session}-t{t}-c{i}", "work", {"n": i, "sleep_s": rng.choice([0.05, 0.2, 0.4])}) for i in range(rng.randint(1, 3))]
        turns.append(tool_turn(*calls))
    return [*turns, Message.assistant(f"{session} done")]


def assert_guarantees(fleet: Fleet, sessions: list[str]) -> None:
    assert fleet.violations() == []
    for session in sessions:
        checkpoint = fleet.client.checkpoint(session)
        assert checkpoint is not None and checkpoint.status == "finished", session
        assert_valid_transcript(checkpoint.messages)
        calls = [c.id for m in checkpoint.messages if m.role == "assistant" for c in m.tool_calls]
        assert [m.tool_call_id for m in checkpoint.messages if m.role == "tool"] == calls, session


def test_sessions_finish_with_every_guarantee_when_workers_are_killed(fleet: Fleet) -> None:
    rng = random.Random(7)
    sessions = [f"s{i:02d}" for i in range(20)]
    scripts = {s: random_script(rng, s) for s in sessions}
    scripts["s07"] = [tool_turn(("s07-slow", "work", {"n": 1, "sleep_s": 3.0})), Message.assistant("s07 done")]
    for session, answers in scripts.items():
        fleet.script(session, answers)
    fleet.kill_on("turn-saved:s03:1")  # a worker dies right after saving s03's first model answer
    for _ in range(3):
        fleet.start_worker()
    fleet.start_reaper()

    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)
    victim = fleet.worker_with_pid(fleet.pid_running("s07-slow"))
    victim.kill(signal.SIGKILL)  # and another dies in the middle of a tool call
    fleet.start_worker()
    fleet.start_worker()
    fleet.wait_for(sessions, timeout_s=120)

    assert_guarantees(fleet, sessions)
    asked = fleet.counts("asked")
    assert all(count == 1 for count in asked.values()), {k: v for k, v in asked.items() if v != 1}
    runs = fleet.counts("runs")
    assert runs.pop("s07-slow") == 2  # it had no recorded result: it ran again, with the same tool_call_id
    assert set(runs.values()) == {1}
    assert not fleet.redis.sismember(fleet.key("kill"), "turn-saved:s03:1")  # that crash did happen


def test_every_task_delivered_twice_records_nothing_twice(fleet: Fleet) -> None:
    sessions = [f"d{i}" for i in range(4)]
    for session in sessions:
        fleet.script(session, [tool_turn((f"{session}-a", "work", {"n": 1}), (f"{session}-b", "work", {"n": 2})),
                               tool_turn((f"{session}-c", "work", {"n": 3})), Message.assistant("done")])
    fleet.start_worker(LOUSHO_TEST_DELIVER_TWICE="1")
    fleet.start_worker(LOUSHO_TEST_DELIVER_TWICE="1")

    for session in sessions:
        fleet.client.enqueue("jobs", "go", session_id=session)
        send_model_turn(fleet.client.app, session, 1)  # the first turn's message, a second time
    fleet.wait_for(sessions, timeout_s=60)
    for session in sessions:  # late duplicates of every kind, after the fact
        send_model_turn(fleet.client.app, session, 2)
        send_tool_call(fleet.client.app, session, f"{session}-a", "work", 1)
        send_advance(fleet.client.app, session, "duplicate")
    time.sleep(1.0)

    assert_guarantees(fleet, sessions)
    assert set(fleet.counts("asked").values()) == {1}
    assert set(fleet.counts("runs").values()) == {1}
    assert len(fleet.counts("runs")) == 12


def test_a_worker_paused_past_its_lease_cannot_overwrite_newer_progress(fleet: Fleet) -> None:
    fleet.script("m", [tool_turn(("m-1", "work", {"n": 1})), Message.assistant("m done")])
    fleet.redis.set(fleet.key("model-delay:m:1"), "1.5")
    sleeper = fleet.start_worker("sleeper")
    fleet.start_reaper()
    fleet.client.enqueue("jobs", "go", session_id="m")
    while fleet.counts("asked").get("m:1") != 1:
        time.sleep(0.02)

    sleeper.kill(signal.SIGSTOP)  # frozen while the model answers: its session lease expires
    fleet.start_worker("taker")
    fleet.wait_for(["m"], timeout_s=60)
    finished = fleet.client.checkpoint("m")
    sleeper.kill(signal.SIGCONT)  # it wakes up holding a stale answer and tries to save it
    deadline = time.monotonic() + 15
    while "LOUSHO_LEASE_LOST" not in sleeper.log() and time.monotonic() < deadline:
        time.sleep(0.1)

    assert "LOUSHO_LEASE_LOST" in sleeper.log()
    assert fleet.client.checkpoint("m") == finished
    assert_guarantees(fleet, ["m"])


def test_a_stale_copy_of_a_tool_call_changes_nothing(fleet: Fleet) -> None:
    fleet.script("z", [tool_turn(("z-long", "work", {"n": 1, "sleep_s": 1.0})), Message.assistant("z done")])
    sleeper = fleet.start_worker("sleeper")
    fleet.start_reaper()
    fleet.client.enqueue("jobs", "go", session_id="z")
    assert fleet.pid_running("z-long") == sleeper.pid

    sleeper.kill(signal.SIGSTOP)  # frozen mid-tool: its leases expire, it cannot tell
    fleet.start_worker("taker")
    fleet.wait_for(["z"], timeout_s=60)
    finished = fleet.client.checkpoint("z")
    sleeper.kill(signal.SIGCONT)  # it wakes up and finishes its stale copy of the call
    time.sleep(2.5)

    assert fleet.client.checkpoint("z") == finished
    assert fleet.counts("runs")["z-long"] == 2
    assert_guarantees(fleet, ["z"])


def test_the_first_committed_result_of_a_call_is_the_one_recorded(fleet: Fleet) -> None:
    fleet.script("r", [tool_turn(("r-1", "work", {"n": 6})), Message.assistant("r done")])
    fleet.client.enqueue("jobs", "go", session_id="r")  # before any worker: turn 1 cannot have run yet
    committed_first = json.dumps({"n": 6, "square": "committed first"})
    fleet.redis.hset(fleet.client.keys.results("r"), result_field(1, "r-1"), committed_first)
    fleet.start_worker()

    fleet.wait_for(["r"], timeout_s=30)

    checkpoint = fleet.client.checkpoint("r")
    assert checkpoint is not None
    assert checkpoint.messages[-2].result() == {"n": 6, "square": "committed first"}
    assert "r-1" not in fleet.counts("runs")
