"""The reaper's requeue sends a tool call again only when no copy of it is queued or running (issue #21):
under repeated kills the queue never fills with copies of the same calls.

The worker's steps run here in the test's process against the real Redis, with the outbox pushing
onto the real queue list; the test plays the worker that takes messages (or loses them)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pydantic import BaseModel

from lousho import Agent, Message, ToolContext, define_tool
from lousho.providers import ScriptedProvider, tool_calls
from lousho.worker import FleetSettings, broker_url, create_app
from lousho.worker.steps import SessionSteps
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


class Nothing(BaseModel):
    pass


async def noop(args: Nothing, ctx: ToolContext) -> str:
    return "ok"


def queued_calls(fleet: Fleet) -> list[str]:
    """The task ids on the queue, oldest first."""
    return [json.loads(raw)["headers"]["id"] for raw in reversed(fleet.redis.lrange(fleet.queue, 0, -1))]


def test_a_requeue_sends_again_only_the_calls_no_copy_of_which_is_queued(
    fleet: Fleet, redis_url: str, request: pytest.FixtureRequest
) -> None:
    agent = Agent(name="jobs", model="scripted", tools=[define_tool(name="noop", description="-", input=Nothing, execute=noop)],
                  tool_concurrency=2)  # fmt: skip
    provider = ScriptedProvider([tool_calls(("c1", "noop", {}), ("c2", "noop", {})), "done"])
    app = create_app(agents=[agent], store=fleet.store, broker=broker_url(redis_url), provider=provider,
                     settings=FleetSettings(queue=fleet.queue, lease_ttl_s=2.0))  # fmt: skip
    runtime: Any = app.lousho_runtime
    request.addfinalizer(runtime.close)
    fleet.client.enqueue("jobs", "go", session_id="r", require_worker=False)
    fleet.redis.delete(fleet.queue)  # the model turn's message: this test is the worker that took it

    assert runtime.run(SessionSteps(runtime, "r").advance(expected_turn=1)) == "tools-dispatched"
    assert queued_calls(fleet) == ["r/turn/1/tool/c1", "r/turn/1/tool/c2"]

    # The reaper's advance while both messages wait on a busy queue: nothing is sent again.
    runtime.run(SessionSteps(runtime, "r").advance(redispatch=True))
    assert queued_calls(fleet) == ["r/turn/1/tool/c1", "r/turn/1/tool/c2"]

    # A worker took c1's message and died before it took the call's lease: c1 alone goes again.
    fleet.redis.rpop(fleet.queue)
    runtime.run(SessionSteps(runtime, "r").advance(redispatch=True))
    assert queued_calls(fleet) == ["r/turn/1/tool/c2", "r/turn/1/tool/c1"]


def test_requeues_of_a_session_with_queued_calls_send_no_copies(fleet: Fleet) -> None:
    """Real workers: two die running two of a turn's three calls while the third waits on the queue;
    with no worker left, the reaper requeues the session, and an operator resumes it too. The
    replacement worker runs the third call, then the requeue, which sends the two lost calls again,
    then the resume, which finds them queued and sends nothing. Each lost call is received twice in all
    (its lost copy and one more), never three times."""
    fleet.env["LOUSHO_TEST_TOOL_CONCURRENCY"] = "3"
    calls = [(f"q-{i}", "work", {"n": i, "sleep_s": 2.0}) for i in range(1, 4)]
    fleet.script("queued", [tool_turn(*calls), Message.assistant("done")])
    first, second = fleet.start_worker(pool="solo"), fleet.start_worker(pool="solo")  # one call each, the third queued
    fleet.client.enqueue("jobs", "go", session_id="queued")
    running = {fleet.pid_running("q-1"), fleet.pid_running("q-2")}
    assert running == {first.pid, second.pid}
    first.kill()
    second.kill()
    fleet.start_reaper()
    deadline = time.monotonic() + 20
    while fleet.redis.llen(fleet.queue) < 2 and time.monotonic() < deadline:  # q-3, then the requeue
        time.sleep(0.05)
    fleet.client.resume("queued")
    assert fleet.redis.llen(fleet.queue) == 3
    fleet.start_worker(pool="solo")
    fleet.wait_for(["queued"], timeout_s=60)

    logs = "".join(w.log() for w in fleet.workers)
    received = {call: logs.count(f"queued/turn/1/tool/{call}] received") for call in ("q-1", "q-2", "q-3")}
    assert received == {"q-1": 2, "q-2": 2, "q-3": 1}
