"""Sub-agents on the fleet, rule by rule, on the in-process driver (issue #14): an `agent_tool` call runs as
a session of its own (`<parent>.sub-<call id>`), each of its model turns and tool calls a task of its own;
the child's approval pauses the parent; resolving it resumes the child, then the parent; aborting the
parent aborts the child. The crash of the child's tool worker is in test_sub_agents_fleet.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from lousho import Agent, Message, ToolContext, agent_tool, define_tool
from lousho.engine import CANCELLED_RESULT
from lousho.fleet import FleetSettings
from lousho.providers.base import ModelRequest, ModelResponse
from lousho.stores.redis import RedisStore
from lousho.testing.fleet import FleetDriver
from tests.engine.helpers import assert_finished_with_every_result
from tests.fleet.conftest import tool_turn

FLEET_SETTINGS = FleetSettings(lease_ttl_s=60.0)
CHILD = "trip.sub-pay"


class Charge(BaseModel):
    amount: int


class Travel:
    """A planner that hands payment to a cashier sub-agent, whose `charge_card` needs approval; a model
    answering each session from its own script, and the tools counting their runs."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Message]] = {}
        self.asked: Counter[str] = Counter()
        self.runs: Counter[str] = Counter()
        self.broken: set[str] = set()
        """Sessions whose model fails (as a worker that dies mid-turn would leave the turn)."""
        charge = define_tool(name="charge_card", description="Charge the card", input=Charge,
                             execute=self.charge, needs_approval=True)  # fmt: skip
        lookup = define_tool(name="lookup", description="Look up a price", input=Charge, execute=self.charge)
        self.cashier = Agent(name="cashier", model="scripted", instructions="You take payments.",
                             tools=[charge, lookup])  # fmt: skip
        self.planner = Agent(name="planner", model="scripted", instructions="You plan trips.",
                             tools=[agent_tool(self.cashier, name="pay"), lookup])  # fmt: skip

    async def generate(self, request: ModelRequest) -> ModelResponse:
        session = request.session_id or ""
        self.asked[session] += 1
        if session in self.broken:
            raise RuntimeError(f"the model of {session} is broken")
        turn = sum(m.role == "assistant" for m in request.messages)
        return ModelResponse(message=self.scripts[session][turn])

    async def charge(self, args: Charge, ctx: ToolContext) -> str:
        self.runs[ctx.tool_call_id] += 1
        return f"charged {args.amount}"


@pytest.fixture
def travel() -> Travel:
    return Travel()


@pytest.fixture
def driver(travel: Travel, redis_url: str, redis_store: RedisStore) -> Iterator[FleetDriver]:
    with FleetDriver(agents=[travel.planner], redis_url=redis_url, store=redis_store, provider=travel,
                     settings=FLEET_SETTINGS) as fleet_driver:  # fmt: skip
        yield fleet_driver


def gated_trip(travel: Travel) -> None:
    travel.scripts["trip"] = [tool_turn(("pay", "pay", {"input": "charge 30"})), Message.assistant("Trip paid.")]
    travel.scripts[CHILD] = [tool_turn(("c1", "charge_card", {"amount": 30})), Message.assistant("charged 30 euros")]


def test_a_sub_agent_runs_as_its_own_session_with_a_task_per_step(driver: FleetDriver, travel: Travel) -> None:
    travel.scripts["trip"] = [tool_turn(("pay", "pay", {"input": "what is the price?"})), Message.assistant("12.")]
    travel.scripts[CHILD] = [tool_turn(("l1", "lookup", {"amount": 12})), Message.assistant("it is 12")]
    driver.client.enqueue("planner", "plan", session_id="trip")

    driver.run_until_idle()

    parent, child = driver.client.checkpoint("trip"), driver.client.checkpoint(CHILD)
    assert_finished_with_every_result(parent, "trip")
    assert_finished_with_every_result(child, CHILD)
    assert parent is not None and child is not None
    assert [m.result() for m in parent.messages if m.role == "tool"] == ["it is 12"]
    assert child.parent_session_id == "trip" and child.agent_name == "cashier"
    child_tasks = [t.task_id for t in driver.sent if t.session_id == CHILD]
    assert child_tasks == [f"{CHILD}/turn/1", f"{CHILD}/turn/1/tool/l1", f"{CHILD}/turn/2"]
    assert not [t for t in driver.sent if t.task_id.startswith("trip/turn/1/tool/pay")]  # no tool task: a session
    assert travel.runs == {"l1": 1}


def test_a_gated_call_in_the_sub_agent_pauses_the_parent_on_the_same_approval(
    driver: FleetDriver, travel: Travel
) -> None:
    gated_trip(travel)
    driver.client.enqueue("planner", "plan", session_id="trip")

    driver.run_until_idle()

    parent, child = driver.client.status("trip"), driver.client.status(CHILD)
    assert parent.status == child.status == "awaiting-approval"
    assert parent.approval_id == child.approval_id is not None
    [listed] = driver.client.approvals()
    assert listed.id == parent.approval_id
    assert listed.session_id == "trip"  # the parent, named
    assert (listed.waiting.session_id, listed.waiting.tool_call.name) == (CHILD, "charge_card")
    assert listed.waiting.tool_call.arguments == {"amount": 30}
    assert travel.runs == {}


def test_the_approvals_of_a_sub_agents_session_are_listed_under_its_own_id_too(
    driver: FleetDriver, travel: Travel
) -> None:
    gated_trip(travel)
    travel.scripts["trip-2"], travel.scripts["trip-2.sub-pay"] = travel.scripts["trip"], travel.scripts[CHILD]
    driver.client.enqueue("planner", "plan", session_id="trip")
    driver.client.enqueue("planner", "plan", session_id="trip-2")
    driver.run_until_idle()

    [of_child] = driver.client.approvals(CHILD)
    assert of_child.id == driver.client.status(CHILD).approval_id
    assert (of_child.session_id, of_child.waiting.session_id) == ("trip", CHILD)  # stored under its parent
    assert [a.id for a in driver.client.approvals("trip")] == [of_child.id]
    assert [a.waiting.session_id for a in driver.client.approvals("trip-2.sub-pay")] == ["trip-2.sub-pay"]


def test_resolving_the_approval_resumes_the_sub_agent_and_then_the_parent(driver: FleetDriver, travel: Travel) -> None:
    gated_trip(travel)
    driver.client.enqueue("planner", "plan", session_id="trip")
    driver.run_until_idle()
    approval_id = driver.client.status("trip").approval_id
    assert approval_id is not None

    driver.client.resolve_approval(approval_id, approved=True)
    driver.run_until_idle()

    parent, child = driver.client.checkpoint("trip"), driver.client.checkpoint(CHILD)
    assert_finished_with_every_result(child, CHILD)
    assert_finished_with_every_result(parent, "trip")
    assert parent is not None and parent.messages[-1].content == "Trip paid."
    assert [m.result() for m in parent.messages if m.role == "tool"] == ["charged 30 euros"]
    assert travel.runs == {"c1": 1}
    assert driver.client.approvals() == []
    stored = driver.store.approvals.load(approval_id)
    assert stored is not None and stored.status == "approved" and stored.applied_at is not None


def test_a_rejection_reaches_the_sub_agent_as_its_calls_result(driver: FleetDriver, travel: Travel) -> None:
    gated_trip(travel)
    driver.client.enqueue("planner", "plan", session_id="trip")
    driver.run_until_idle()
    approval_id = driver.client.status("trip").approval_id
    assert approval_id is not None

    driver.client.resolve_approval(approval_id, approved=False, note="too expensive")
    driver.run_until_idle()

    child = driver.client.checkpoint(CHILD)
    assert_finished_with_every_result(child, CHILD)
    assert_finished_with_every_result(driver.client.checkpoint("trip"), "trip")
    assert child is not None and "too expensive" in str(child.messages[-2].result())
    assert travel.runs == {}


def test_the_parent_word_lost_is_made_up_by_the_parents_next_advance(driver: FleetDriver, travel: Travel) -> None:
    travel.scripts["trip"] = [tool_turn(("pay", "pay", {"input": "price?"})), Message.assistant("12.")]
    travel.scripts[CHILD] = [Message.assistant("it is 12")]
    driver.client.enqueue("planner", "plan", session_id="trip")
    driver.deliver(driver.pending()[0])  # the parent's turn: starts the child
    assert driver.deliver(driver.pending()[0]) == "finished"  # the child's only turn
    [word] = driver.pending()
    assert word.session_id == "trip" and word.args[1] == "sub-agent-finished"

    driver.drop(word)  # lost: the parent's in-flight deadline passes, the reaper sends an advance
    driver.client.resume("trip")
    driver.run_until_idle()

    assert_finished_with_every_result(driver.client.checkpoint("trip"), "trip")


def test_aborting_the_parent_cancels_the_sub_agent(driver: FleetDriver, travel: Travel) -> None:
    travel.scripts["trip"] = [tool_turn(("pay", "pay", {"input": "price?"})), Message.assistant("stopped")]
    travel.scripts[CHILD] = [tool_turn(("l1", "lookup", {"amount": 1})), Message.assistant("never")]
    driver.client.enqueue("planner", "plan", session_id="trip")
    driver.deliver(driver.pending()[0])  # the parent's turn: starts the child

    assert driver.client.abort("trip")
    driver.run_until_idle()

    parent, child = driver.client.checkpoint("trip"), driver.client.checkpoint(CHILD)
    assert parent is not None and child is not None
    assert [m.result() for m in parent.messages if m.role == "tool"] == [CANCELLED_RESULT]
    assert driver.client.status(CHILD).aborted
    assert child.status == "in-progress" and child.pending_tool_calls() == []
    assert travel.runs == {}


async def test_the_web_apps_approvals_show_the_inner_call_and_name_the_parent(
    driver: FleetDriver, travel: Travel
) -> None:
    import httpx

    from examples.webapp.app import create_app

    gated_trip(travel)
    driver.client.enqueue("planner", "plan", session_id="trip")
    driver.run_until_idle()
    transport = httpx.ASGITransport(app=create_app(driver.client))
    async with httpx.AsyncClient(transport=transport, base_url="http://webapp.test") as http:
        [listed] = (await http.get("/approvals")).json()
        assert (listed["session_id"], listed["parent_session_id"]) == (CHILD, "trip")
        assert (listed["tool"], listed["arguments"]) == ("charge_card", {"amount": 30})

        decided = await http.post(f"/approvals/{listed['id']}", json={"approved": True})
        assert decided.status_code == 200, decided.text
    driver.run_until_idle()

    assert_finished_with_every_result(driver.client.checkpoint("trip"), "trip")
    assert travel.runs == {"c1": 1}


def test_a_parked_sub_agent_parks_its_parent_saying_why(travel: Travel, redis_url: str, redis_store: RedisStore) -> None:
    travel.scripts["trip"] = [tool_turn(("pay", "pay", {"input": "price?"})), Message.assistant("12.")]
    travel.scripts[CHILD] = [Message.assistant("it is 12")]
    travel.broken.add(CHILD)
    settings = FleetSettings(lease_ttl_s=60.0, max_attempts=1)
    with FleetDriver(agents=[travel.planner], redis_url=redis_url, store=redis_store, provider=travel,
                     settings=settings) as driver:  # fmt: skip
        driver.client.enqueue("planner", "plan", session_id="trip")
        driver.deliver(driver.pending()[0])  # the parent's turn: starts the child
        child_turn = driver.pending()[0]
        with pytest.raises(RuntimeError):
            driver.deliver(child_turn)
        assert driver.deliver(child_turn) == "parked"  # its second start: poison
        driver.run_until_idle()

        parent = driver.client.status("trip")
        assert driver.client.status(CHILD).status == parent.status == "parked"
        assert parent.parked_reason is not None and CHILD in parent.parked_reason

        travel.broken.clear()
        driver.client.resume(CHILD)
        driver.client.resume("trip")
        driver.run_until_idle()
        assert_finished_with_every_result(driver.client.checkpoint("trip"), "trip")


def test_aborting_a_session_paused_on_an_approval_changes_nothing(driver: FleetDriver, travel: Travel) -> None:
    gated_trip(travel)
    driver.client.enqueue("planner", "plan", session_id="trip")
    driver.run_until_idle()

    assert driver.client.abort("trip") is False  # nothing runs: rejecting the approval is how to stop it
    assert driver.pending() == []
    assert not driver.client.status("trip").aborted
    assert driver.client.status("trip").status == "awaiting-approval"


def test_a_session_enqueued_again_after_a_delete_starts_its_sub_agent_anew(
    driver: FleetDriver, travel: Travel
) -> None:
    travel.scripts["trip"] = [tool_turn(("pay", "pay", {"input": "price?"})), Message.assistant("done")]
    travel.scripts[CHILD] = [Message.assistant("it is 12")]
    driver.client.enqueue("planner", "plan", session_id="trip")
    driver.run_until_idle()
    driver.store.checkpoints.delete("trip")  # the sub-agent's session stays

    travel.scripts[CHILD] = [Message.assistant("it is 15")]  # the same call id, a new run
    driver.client.enqueue("planner", "plan again", session_id="trip")
    driver.run_until_idle()

    parent = driver.client.checkpoint("trip")
    assert_finished_with_every_result(parent, "trip")
    assert parent is not None and [m.result() for m in parent.messages if m.role == "tool"] == ["it is 15"]
