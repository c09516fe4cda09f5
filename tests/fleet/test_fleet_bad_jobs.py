"""Jobs the fleet cannot run are parked with a reason, not retried forever, and the worker keeps serving."""

from __future__ import annotations

import pytest

from lousho import Agent, ConfigurationError, Message
from lousho.providers import ScriptedProvider
from lousho.subagents import agent_tool
from lousho.worker import create_app
from tests.fleet.conftest import Fleet

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def test_a_job_for_an_unknown_agent_is_parked_and_the_worker_goes_on(fleet: Fleet) -> None:
    fleet.script("good", [Message.assistant("fine")])
    fleet.start_worker()

    fleet.client.enqueue("no-such-agent", "hello", session_id="bad", require_worker=False)  # past the enqueue check (#15)
    fleet.client.enqueue("jobs", "hello", session_id="good")
    fleet.wait_for(["bad"], status="parked", timeout_s=30)
    fleet.wait_for(["good"], timeout_s=30)

    status = fleet.client.status("bad")
    assert status.parked_reason is not None and "no agent named 'no-such-agent'" in status.parked_reason


def test_a_sub_agent_is_served_with_its_parent_and_a_name_clash_is_refused(fleet: Fleet) -> None:
    helper = Agent(name="helper", model="m")
    boss = Agent(name="boss", model="m", tools=[agent_tool(helper)])
    app = create_app(agents=[boss, helper], store=fleet.store, broker="memory://", provider=ScriptedProvider())
    assert set(app.lousho_runtime.agents) == {"boss", "helper"}  # a job of the sub-agent's session finds it
    app.close()

    other = Agent(name="helper", model="m", instructions="Another helper.")
    with pytest.raises(ConfigurationError, match="two agents are named 'helper'"):
        create_app(agents=[boss, other], store=fleet.store, broker="memory://", provider=ScriptedProvider())
