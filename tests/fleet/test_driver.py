"""The fleet's rules, step by step, on the in-process driver (`lousho.testing.fleet`, issue #14): the real
task bodies, Lua scripts and Redis, with the test delivering each message (twice, late, out of order)
and expiring leases. Crashes and process-level behaviour stay with real workers (test_fleet_*.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from lousho import Agent, AgentExecutor, Message, ToolContext, define_tool, memory_store
from lousho.fleet import FleetSettings, result_field, send_advance, send_model_turn, send_tool_call
from lousho.providers import ScriptedProvider
from lousho.providers.base import ModelRequest, ModelResponse
from lousho.stores.redis import RedisStore
from lousho.testing.fleet import FleetDriver, SentTask
from tests.engine.helpers import assert_finished_with_every_result, assert_valid_transcript
from tests.fleet.conftest import tool_turn

# Leases that outlive any test: one expires when the test says so (`FleetDriver.expire_lease`), never by
# the clock of a slow machine.
FLEET_SETTINGS = FleetSettings(lease_ttl_s=60.0)


class Work(BaseModel):
    n: int


def turns(messages: list[Message]) -> int:
    return sum(m.role == "assistant" for m in messages)


class Jobs:
    """The fleet tests' agent, in memory: a model that answers each session from its script and a `work`
    tool, both counting what they do; `during[...]` runs once, while that turn is asked (`(session, turn)`)
    or that call runs (its id): the test's way into the middle of a step, freezing the worker meanwhile."""

    def __init__(self, store: RedisStore, tool_concurrency: int = 2) -> None:
        self.store = store
        self.scripts: dict[str, list[Message]] = {}
        self.asked: Counter[tuple[str, int]] = Counter()
        self.runs: Counter[str] = Counter()
        self.during: dict[Any, Callable[[], None]] = {}
        self.violations: list[str] = []
        tool = define_tool(name="work", description="Do some work", input=Work, execute=self.work)
        self.agent = Agent(name="jobs", model="scripted", instructions="You run jobs.", tools=[tool],
                           tool_concurrency=tool_concurrency)  # fmt: skip

    async def generate(self, request: ModelRequest) -> ModelResponse:
        session, turn = request.session_id or "", turns(request.messages) + 1
        self.asked[session, turn] += 1
        stored = self.store.checkpoints.load(session)
        if stored is not None and turns(stored.messages) >= turn:
            self.violations.append(f"{session}: turn {turn} asked after it was checkpointed")
        self.during.pop((session, turn), lambda: None)()
        return ModelResponse(message=self.scripts[session][turn - 1])

    async def work(self, args: Work, ctx: ToolContext) -> dict[str, int]:
        self.runs[ctx.tool_call_id] += 1
        self.during.pop(ctx.tool_call_id, lambda: None)()
        return {"n": args.n, "square": args.n * args.n}


@pytest.fixture
def jobs(redis_store: RedisStore) -> Jobs:
    return Jobs(redis_store)


@pytest.fixture
def driver(jobs: Jobs, redis_url: str, redis_store: RedisStore) -> Iterator[FleetDriver]:
    with FleetDriver(agents=[jobs.agent], redis_url=redis_url, store=redis_store, provider=jobs,
                     settings=FLEET_SETTINGS) as fleet_driver:  # fmt: skip
        yield fleet_driver


def only(driver: FleetDriver) -> SentTask:
    """The one message waiting on the queue."""
    pending = driver.pending()
    assert len(pending) == 1, pending
    return pending[0]


def assert_guarantees(driver: FleetDriver, jobs: Jobs, sessions: list[str]) -> None:
    assert jobs.violations == []
    for session in sessions:
        assert_finished_with_every_result(driver.client.checkpoint(session), session)


def tool_results(driver: FleetDriver, session: str) -> list[Any]:
    checkpoint = driver.client.checkpoint(session)
    assert checkpoint is not None
    return [(m.tool_call_id, m.result()) for m in checkpoint.messages if m.role == "tool"]


def job_script() -> list[Message]:
    return [
        tool_turn(("a", "work", {"n": 2}), ("b", "work", {"n": 3}), ("c", "work", {"n": 4})),
        tool_turn(("d", "work", {"n": 5})),
        Message.assistant("all done"),
    ]


# -- duplicate delivery -------------------------------------------------------------------------


def test_a_model_turn_delivered_twice_asks_the_model_once(driver: FleetDriver, jobs: Jobs) -> None:
    jobs.scripts["t"] = [tool_turn(("t-1", "work", {"n": 1})), Message.assistant("done")]
    driver.client.enqueue("jobs", "go", session_id="t")
    first_turn = only(driver)

    assert driver.deliver(first_turn) == "tools-dispatched"
    assert driver.deliver(first_turn) == "tools-dispatched"  # finds the answer recorded: asks nothing
    driver.run_until_idle()
    assert driver.deliver(first_turn) == "finished"  # a late copy finds the run over

    assert jobs.asked == {("t", 1): 1, ("t", 2): 1}
    assert [task.task_id for task in driver.sent] == ["t/turn/1", "t/turn/1/tool/t-1", "t/turn/2"]
    assert_guarantees(driver, jobs, ["t"])


def test_a_model_turn_delivered_while_its_first_copy_runs_stands_down(driver: FleetDriver, jobs: Jobs) -> None:
    jobs.scripts["t"] = [Message.assistant("done")]
    driver.client.enqueue("jobs", "go", session_id="t")
    first_turn = only(driver)
    second_copy: list[str] = []
    jobs.during["t", 1] = lambda: second_copy.append(driver.deliver(first_turn, worker="w2"))

    assert driver.deliver(first_turn) == "finished"

    assert second_copy == ["busy"]  # the session's lease is held: the copy leaves the turn to its holder
    assert jobs.asked == {("t", 1): 1}
    assert_guarantees(driver, jobs, ["t"])


def test_a_tool_call_delivered_twice_runs_the_tool_once(driver: FleetDriver, jobs: Jobs) -> None:
    jobs.scripts["t"] = [tool_turn(("t-a", "work", {"n": 1}), ("t-b", "work", {"n": 2})), Message.assistant("done")]
    driver.client.enqueue("jobs", "go", session_id="t")
    driver.deliver(only(driver))
    call_a, call_b = driver.pending()

    assert driver.deliver(call_a) == "tools-dispatched"
    assert driver.deliver(call_a) == "recorded"
    assert driver.deliver(call_b) == "turn-enqueued"
    assert driver.deliver(call_b) == "recorded"
    driver.run_until_idle()

    assert jobs.runs == {"t-a": 1, "t-b": 1}
    assert_guarantees(driver, jobs, ["t"])


def test_a_tool_call_delivered_while_its_first_copy_runs_stands_down(driver: FleetDriver, jobs: Jobs) -> None:
    jobs.scripts["t"] = [tool_turn(("t-a", "work", {"n": 1})), Message.assistant("done")]
    driver.client.enqueue("jobs", "go", session_id="t")
    driver.deliver(only(driver))
    call = only(driver)
    second_copy: list[str] = []
    jobs.during["t-a"] = lambda: second_copy.append(driver.deliver(call, worker="w2"))

    assert driver.deliver(call) == "turn-enqueued"
    driver.run_until_idle()

    assert second_copy == ["running-elsewhere"]  # the call's lease is held
    assert jobs.runs == {"t-a": 1}
    assert_guarantees(driver, jobs, ["t"])


def test_every_task_delivered_twice_records_nothing_twice(driver: FleetDriver, jobs: Jobs) -> None:
    sessions = [f"d{i}" for i in range(4)]
    for session in sessions:
        jobs.scripts[session] = [tool_turn((f"{session}-a", "work", {"n": 1}), (f"{session}-b", "work", {"n": 2})),
                                 tool_turn((f"{session}-c", "work", {"n": 3})), Message.assistant("done")]  # fmt: skip
        driver.client.enqueue("jobs", "go", session_id=session)
        send_model_turn(driver.client.app, session, 1)  # the first turn's message, a second time
    while pending := driver.pending():
        driver.deliver(pending[0])
        driver.deliver(pending[0])
    for session in sessions:  # late duplicates of every kind, after the fact
        send_model_turn(driver.client.app, session, 2)
        send_tool_call(driver.client.app, session, f"{session}-a", "work", 1)
        send_advance(driver.client.app, session, "duplicate")
    driver.run_until_idle()

    assert_guarantees(driver, jobs, sessions)
    assert set(jobs.asked.values()) == {1}
    assert set(jobs.runs.values()) == {1}
    assert len(jobs.runs) == 12


def test_a_requeue_sends_a_tool_call_again_only_once_its_message_is_lost(driver: FleetDriver, jobs: Jobs) -> None:
    jobs.scripts["t"] = [tool_turn(("t-a", "work", {"n": 1})), Message.assistant("done")]
    driver.client.enqueue("jobs", "go", session_id="t")
    driver.deliver(only(driver))
    call = only(driver)

    send_advance(driver.client.app, "t", "reaper")  # what the reaper sends for a session it finds quiet
    driver.deliver(driver.pending()[-1])
    assert driver.pending() == [call]  # the call's message waits on the queue: no copy is sent

    assert driver.drop(call)  # lost
    send_advance(driver.client.app, "t", "reaper")
    driver.deliver(only(driver))
    assert [task.task_id for task in driver.pending()] == ["t/turn/1/tool/t-a"]
    driver.run_until_idle()

    assert jobs.runs == {"t-a": 1}
    assert_guarantees(driver, jobs, ["t"])


# -- expired leases: zombies ----------------------------------------------------------------------


def test_a_worker_paused_past_its_lease_cannot_overwrite_newer_progress(driver: FleetDriver, jobs: Jobs) -> None:
    jobs.scripts["m"] = [tool_turn(("m-1", "work", {"n": 1})), Message.assistant("m done")]
    driver.client.enqueue("jobs", "go", session_id="m")
    first_turn = only(driver)
    finished = []

    def lease_expires_and_another_worker_finishes() -> None:
        # The sleeper is frozen while its model answers: its lease expires, the message is delivered again.
        assert driver.expire_lease("m")
        driver.deliver(first_turn, worker="taker")
        driver.run_until_idle(worker="taker")
        finished.append(driver.client.checkpoint("m"))

    jobs.during["m", 1] = lease_expires_and_another_worker_finishes

    assert driver.deliver(first_turn, worker="sleeper") == "error: LOUSHO_LEASE_LOST"  # its stale save is refused

    assert finished[0] is not None and finished[0].status == "finished"
    assert driver.client.checkpoint("m") == finished[0]
    assert driver.pending() == []
    assert jobs.asked == {("m", 1): 2, ("m", 2): 1}  # the sleeper's answer was never saved: asked again
    assert_guarantees(driver, jobs, ["m"])


def test_a_stale_copy_of_a_tool_call_changes_nothing(driver: FleetDriver, jobs: Jobs) -> None:
    jobs.scripts["z"] = [tool_turn(("z-long", "work", {"n": 1})), Message.assistant("z done")]
    driver.client.enqueue("jobs", "go", session_id="z")
    driver.deliver(only(driver))
    call = only(driver)
    finished = []

    def leases_expire_and_another_worker_finishes() -> None:
        # The sleeper is frozen mid-tool: the call's lease expires, the message is delivered again.
        assert driver.expire_lease("z", "z-long")
        assert driver.deliver(call, worker="taker") == "turn-enqueued"
        driver.run_until_idle(worker="taker")
        finished.append(driver.client.checkpoint("z"))

    jobs.during["z-long"] = leases_expire_and_another_worker_finishes

    driver.deliver(call, worker="sleeper")  # it wakes up and finishes its stale copy of the call

    assert finished[0] is not None and finished[0].status == "finished"
    assert driver.client.checkpoint("z") == finished[0]
    assert driver.pending() == []
    assert jobs.runs == {"z-long": 2}  # it had no recorded result: it ran again, with the same tool_call_id
    assert_guarantees(driver, jobs, ["z"])


# -- folding results -----------------------------------------------------------------------------


def test_results_that_finish_out_of_order_are_folded_in_call_order(redis_url: str, redis_store: RedisStore) -> None:
    jobs = Jobs(redis_store, tool_concurrency=3)
    jobs.scripts["o"] = job_script()
    with FleetDriver(agents=[jobs.agent], redis_url=redis_url, store=redis_store, provider=jobs,
                     settings=FLEET_SETTINGS) as driver:  # fmt: skip
        driver.client.enqueue("jobs", "go", session_id="o")
        driver.deliver(only(driver))
        call_a, call_b, call_c = driver.pending()

        assert driver.deliver(call_c) == "tools-dispatched"
        assert driver.deliver(call_b) == "tools-dispatched"
        assert tool_results(driver, "o") == []  # c and b wait for a: they are committed, not folded
        assert driver.pending() == [call_a]
        assert driver.deliver(call_a) == "turn-enqueued"  # folds a, b, c and sends the next model turn

        assert tool_results(driver, "o") == [("a", {"n": 2, "square": 4}), ("b", {"n": 3, "square": 9}),
                                             ("c", {"n": 4, "square": 16})]  # fmt: skip
        assert [task.task_id for task in driver.pending()] == ["o/turn/2"]
        driver.run_until_idle()
        assert_guarantees(driver, jobs, ["o"])


def test_input_that_arrives_while_the_last_call_runs_is_placed_after_its_result(
    driver: FleetDriver, jobs: Jobs
) -> None:
    # The call's task folds its result with the checkpoint it read before the call ran; new input
    # moved the session on meanwhile, so that save is refused and the result is folded the usual way.
    jobs.scripts["late"] = [tool_turn(("late-1", "work", {"n": 3})), Message.assistant("done")]
    driver.client.enqueue("jobs", "go", session_id="late")
    driver.deliver(only(driver))
    jobs.during["late-1"] = lambda: driver.client.enqueue("jobs", "and one more thing", session_id="late")

    driver.run_until_idle()

    checkpoint = driver.client.checkpoint("late")
    assert checkpoint is not None
    assert_valid_transcript(checkpoint.messages)
    assert [(m.role, m.content) for m in checkpoint.messages[-3:]] == [
        ("tool", checkpoint.messages[-3].content),
        ("user", "and one more thing"),
        ("assistant", "done"),
    ]
    assert checkpoint.messages[-3].result() == {"n": 3, "square": 9}
    assert jobs.runs == {"late-1": 1}


def test_the_first_committed_result_of_a_call_is_the_one_recorded(driver: FleetDriver, jobs: Jobs) -> None:
    jobs.scripts["r"] = [tool_turn(("r-1", "work", {"n": 6})), Message.assistant("r done")]
    driver.client.enqueue("jobs", "go", session_id="r")  # not delivered yet: turn 1 cannot have run
    committed_first = '{"n": 6, "square": "committed first"}'
    driver.store.client.hset(driver.client.keys.results("r"), result_field(1, "r-1"), committed_first)

    driver.run_until_idle()

    assert tool_results(driver, "r") == [("r-1", {"n": 6, "square": "committed first"})]
    assert jobs.runs == {}


def test_a_model_that_reuses_call_ids_across_turns_gets_each_turns_own_results(
    driver: FleetDriver, jobs: Jobs
) -> None:
    # Some OpenAI-compatible servers number calls per turn ('call_0' every time): a result committed
    # for one turn's call must never stand for the next turn's call of the same id.
    jobs.scripts["reuse"] = [*(tool_turn(("call_0", "work", {"n": n})) for n in (2, 3, 4)), Message.assistant("done")]
    driver.client.enqueue("jobs", "go", session_id="reuse")

    driver.run_until_idle()

    assert [result for _, result in tool_results(driver, "reuse")] == [{"n": n, "square": n * n} for n in (2, 3, 4)]
    assert jobs.runs == {"call_0": 3}
    assert driver.store.client.exists(driver.client.keys.results("reuse")) == 0  # dropped as each turn completed


async def test_the_fleet_gives_the_same_transcript_as_the_in_process_path(driver: FleetDriver, jobs: Jobs) -> None:
    jobs.scripts["job-2"] = job_script()
    driver.client.enqueue("jobs", "do the work", session_id="job-2")
    driver.run_until_idle()

    local_store = memory_store()
    local = await AgentExecutor.execute(agent=jobs.agent, input="do the work", provider=ScriptedProvider(job_script()),
                                        session_id="job-2", checkpoint_store=local_store.checkpoints,
                                        approval_store=local_store.approvals)  # fmt: skip
    on_fleet = driver.client.checkpoint("job-2")
    assert on_fleet is not None
    assert on_fleet.messages == local.messages


def test_two_fleet_apps_in_one_process_each_run_their_own_agents(
    driver: FleetDriver, jobs: Jobs, redis_url: str, redis_store: RedisStore
) -> None:
    # Celery hands a task registered as shared to every app made later in the process: the second app
    # would run the first one's tasks, with the first one's agents (issue #14).
    other = Agent(name="other", model="scripted")
    jobs.scripts["j"] = [Message.assistant("done by jobs")]
    with FleetDriver(agents=[other], redis_url=redis_url, store=redis_store, provider=ScriptedProvider(["done by other"]),
                     settings=FLEET_SETTINGS) as second:  # fmt: skip
        second.client.enqueue("other", "go", session_id="o")
        driver.client.enqueue("jobs", "go", session_id="j")

        assert [outcome for _, outcome in second.run_until_idle()] == ["finished"]
        assert [outcome for _, outcome in driver.run_until_idle()] == ["finished"]
        assert second.client.status("o").text == "done by other"
        assert driver.client.status("j").text == "done by jobs"
