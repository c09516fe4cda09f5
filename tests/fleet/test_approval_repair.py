"""The reaper writes again a paused session's approval record that a Redis Cluster failover lost in part
(issue #18, `lousho.scheduler.approval_repair`). The approval, its pending-index entry and the paused
checkpoint live in different slots, maybe on different primaries, and replication is asynchronous: each
test leaves the state such a failover leaves (one of them lost, the others kept) on a real Redis, with the
fleet's real steps on the in-process driver, and checks that a repair pass gives the human the approval
again and that deciding it finishes the session with every guarantee."""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from lousho import Agent, Message, ToolContext, define_tool
from lousho.fleet import FleetSettings
from lousho.fleet.event_writes import WRITES
from lousho.providers.base import ModelRequest, ModelResponse
from lousho.scheduler.approval_repair import RepairedApproval, repair_approval_records, repair_if_due
from lousho.scheduler.reaper import run_reaper
from lousho.stores.redis import RedisStore
from lousho.testing.fleet import FleetDriver
from tests.engine.helpers import assert_finished_with_every_result
from tests.fleet.conftest import tool_turn
from tests.fleet.test_sub_agents_driver import CHILD, Travel, gated_trip

SETTINGS = FleetSettings(lease_ttl_s=60.0, reaper_interval_s=0.05, death_check_interval_s=0)


class Amount(BaseModel):
    amount: int


class Shop:
    """An agent whose `pay` call needs approval; the model answers from a script, the tool counts its runs."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        pay = define_tool(name="pay", description="Pay", input=Amount, execute=self.pay, needs_approval=True)
        self.agent = Agent(name="shop", model="scripted", instructions="You pay.", tools=[pay])

    async def generate(self, request: ModelRequest) -> ModelResponse:
        turn = sum(m.role == "assistant" for m in request.messages)
        script = [tool_turn(("p1", "pay", {"amount": 30})), Message.assistant("Paid.")]
        return ModelResponse(message=script[turn])

    async def pay(self, args: Amount, ctx: ToolContext) -> str:
        self.runs[ctx.tool_call_id] += 1
        return f"paid {args.amount}"


@pytest.fixture
def shop() -> Shop:
    return Shop()


@pytest.fixture
def driver(shop: Shop, redis_url: str, redis_store: RedisStore) -> Iterator[FleetDriver]:
    with FleetDriver(agents=[shop.agent], redis_url=redis_url, store=redis_store, provider=shop,
                     settings=SETTINGS) as fleet_driver:  # fmt: skip
        yield fleet_driver


def paused(driver: FleetDriver, session: str = "s") -> str:
    """Enqueue the shop's session and run it to its pause; the approval id it waits on."""
    driver.client.enqueue("shop", "pay for it", session_id=session)
    driver.run_until_idle()
    status = driver.client.status(session)
    assert status.status == "awaiting-approval" and status.approval_id is not None
    assert [a.id for a in driver.client.approvals(session)] == [status.approval_id]
    return status.approval_id


def repair(driver: FleetDriver) -> list[RepairedApproval]:
    return repair_approval_records(driver.store, driver.settings)


def decide_and_finish(driver: FleetDriver, approval_id: str, session: str = "s") -> None:
    driver.client.resolve_approval(approval_id, approved=True)
    driver.run_until_idle()
    assert_finished_with_every_result(driver.client.checkpoint(session), session)
    assert driver.client.approvals() == []


def session_keys(driver: FleetDriver, session: str) -> dict[bytes, bytes]:
    """Every key of the session's slot (its hash tag), DUMPed: what that slot's primary holds."""
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", driver.store.keys.prefix) + f"*{{{session}}}*"
    client = driver.store.client
    return {key: client.dump(key) for key in client.scan_iter(match=pattern, count=1000)}


def restore(driver: FleetDriver, saved: dict[bytes, bytes], session: str) -> None:
    """The session's slot as `saved` held it: its primary died having replicated nothing since."""
    client = driver.store.client
    client.delete(*session_keys(driver, session))
    for key, dumped in saved.items():
        client.restore(key, 0, dumped)


def assert_applied_with_nothing_left_to_repair(driver: FleetDriver, approval_id: str) -> None:
    """The human is not asked again (no approval listed), the decision is marked applied, the record complete."""
    assert driver.client.approvals() == []
    again = driver.store.approvals.load(approval_id)
    assert again is not None and again.status == "approved" and again.applied_at is not None
    assert repair(driver) == []


@contextlib.contextmanager
def paused_trip(redis_url: str, redis_store: RedisStore) -> Iterator[tuple[FleetDriver, Travel, str]]:
    """A planner paused on its cashier sub-agent's approval: the driver, the agents' model, the approval id."""
    travel = Travel()
    with FleetDriver(agents=[travel.planner], redis_url=redis_url, store=redis_store, provider=travel,
                     settings=SETTINGS) as driver:  # fmt: skip
        gated_trip(travel)
        driver.client.enqueue("planner", "plan", session_id="trip")
        driver.run_until_idle()
        approval_id = driver.client.status("trip").approval_id
        assert approval_id is not None and driver.client.status(CHILD).approval_id == approval_id
        yield driver, travel, approval_id


def test_a_paused_session_whose_approval_record_was_lost_gets_it_back(driver: FleetDriver, shop: Shop) -> None:
    approval_id = paused(driver)
    shown = driver.store.approvals.load(approval_id)
    driver.store.client.delete(driver.store.keys.approval(approval_id))  # its primary died before replicating it
    driver.store.client.zrem(driver.store.keys.pending_approvals_of(approval_id), approval_id)
    assert driver.client.approvals() == []

    assert repair(driver) == [RepairedApproval("s", approval_id, "lost")]

    [listed] = driver.client.approvals()
    assert shown is not None and listed.id == approval_id and listed.status == "pending"
    assert (listed.tool_call, listed.call_digest, listed.kind) == (shown.tool_call, shown.call_digest, shown.kind)
    assert listed.remaining_tool_calls == shown.remaining_tool_calls == []
    decide_and_finish(driver, approval_id)
    assert shop.runs == {"p1": 1}


def test_a_pending_approval_missing_from_the_pending_index_is_listed_again(driver: FleetDriver, shop: Shop) -> None:
    approval_id = paused(driver)
    driver.store.client.zrem(driver.store.keys.pending_approvals_of(approval_id), approval_id)
    assert driver.client.approvals() == []

    assert repair(driver) == [RepairedApproval("s", approval_id, "unlisted")]

    assert [a.id for a in driver.client.approvals()] == [approval_id]
    decide_and_finish(driver, approval_id)
    assert shop.runs == {"p1": 1}


def test_an_applied_mark_whose_result_the_checkpoint_lost_is_taken_back_and_the_decision_applied_again(
    driver: FleetDriver, shop: Shop
) -> None:
    approval_id = paused(driver)
    at_pause = session_keys(driver, "s")
    decide_and_finish(driver, approval_id)  # the tool ran, the run finished, the approval was marked applied
    restore(driver, at_pause, "s")  # the approval's primary kept all
    stored = driver.store.approvals.load(approval_id)
    assert stored is not None and stored.status == "approved" and stored.applied_at is not None
    assert driver.client.status("s").status == "awaiting-approval"

    run_reaper(driver.store, driver.client.app, driver.settings, passes=1)  # the repair, then the requeue
    driver.run_until_idle()

    assert_finished_with_every_result(driver.client.checkpoint("s"), "s")
    # The human is not asked again: the decision stands and is applied again. Its result was lost with the
    # session's slot, so the call runs again with the same tool_call_id, as after a crash (issue #18).
    assert shop.runs == {"p1": 2}
    assert_applied_with_nothing_left_to_repair(driver, approval_id)


def test_a_sub_agents_lost_approval_is_written_again_with_its_part_nested(
    redis_url: str, redis_store: RedisStore
) -> None:
    with paused_trip(redis_url, redis_store) as (driver, travel, approval_id):
        shown = driver.store.approvals.load(approval_id)
        driver.store.client.delete(driver.store.keys.approval(approval_id))

        assert repair(driver) == [RepairedApproval("trip", approval_id, "lost")]

        [listed] = driver.client.approvals()
        assert shown is not None and listed.session_id == "trip"
        assert (listed.waiting.session_id, listed.waiting.tool_call) == (CHILD, shown.waiting.tool_call)
        assert listed.waiting.call_digest == shown.waiting.call_digest
        driver.client.resolve_approval(approval_id, approved=True)
        driver.run_until_idle()
        assert_finished_with_every_result(driver.client.checkpoint("trip"), "trip")
        assert_finished_with_every_result(driver.client.checkpoint(CHILD), CHILD)
        assert travel.runs == {"c1": 1}


@pytest.mark.parametrize("lost", [("trip", CHILD), (CHILD,)], ids=["both-sessions", "the-sub-agent-alone"])
def test_a_sub_agents_applied_mark_whose_result_was_lost_is_taken_back_and_the_decision_applied_again(
    redis_url: str, redis_store: RedisStore, lost: tuple[str, ...]
) -> None:
    with paused_trip(redis_url, redis_store) as (driver, travel, approval_id):
        at_pause = {session: session_keys(driver, session) for session in lost}
        driver.client.resolve_approval(approval_id, approved=True)
        driver.run_until_idle()  # the sub-agent charged the card, the approval was marked applied, both finished
        for session in lost:  # what the sessions' slots saved since the pause is gone; the approval's kept all
            restore(driver, at_pause[session], session)
        stored = driver.store.approvals.load(approval_id)
        assert stored is not None and stored.status == "approved" and stored.applied_at is not None
        assert driver.client.status(CHILD).status == "awaiting-approval"

        run_reaper(driver.store, driver.client.app, driver.settings, passes=1)  # the repair, then the requeue
        driver.run_until_idle()

        assert_finished_with_every_result(driver.client.checkpoint("trip"), "trip")
        assert_finished_with_every_result(driver.client.checkpoint(CHILD), CHILD)
        assert travel.runs == {"c1": 2}  # its result was lost with the sub-agent's slot: it runs again
        assert_applied_with_nothing_left_to_repair(driver, approval_id)


def test_a_decision_whose_session_a_failover_left_out_of_the_in_flight_index_is_applied(
    driver: FleetDriver, shop: Shop
) -> None:
    approval_id = paused(driver)
    driver.client.resolve_approval(approval_id, approved=True)
    # resolve_approval's writes after the decision (the in-flight entry, the advance) were lost in a failover:
    # the approval is decided, so no listing shows it and deciding it again is refused.
    driver.store.client.zrem(driver.store.keys.inflight_of("s"), "s")
    [advance] = driver.pending()
    driver.drop(advance)
    assert driver.client.approvals() == [] and driver.client.status("s").status == "awaiting-approval"

    assert repair(driver) == [RepairedApproval("s", approval_id, "undelivered")]
    run_reaper(driver.store, driver.client.app, driver.settings, passes=1)  # the requeue
    driver.run_until_idle()

    assert_finished_with_every_result(driver.client.checkpoint("s"), "s")
    assert shop.runs == {"p1": 1}
    applied = driver.store.approvals.load(approval_id)
    assert applied is not None and applied.status == "approved" and applied.applied_at is not None
    assert repair(driver) == []


def test_a_complete_approval_record_is_left_untouched(driver: FleetDriver) -> None:
    paused(driver, "s")
    decided = paused(driver, "t")  # decided, back in the in-flight index, its advance not delivered: complete
    driver.client.resolve_approval(decided, approved=True)
    WRITES.drain()  # the steps' events held back for a moment (event_writes.py) are written before the snapshot
    client = driver.store.client
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", driver.store.keys.prefix) + "*"
    before = {key: client.dump(key) for key in client.scan_iter(match=pattern, count=1000)}

    assert repair(driver) == []

    assert {key: client.dump(key) for key in client.scan_iter(match=pattern, count=1000)} == before


def test_the_beat_reapers_repair_runs_on_the_pass_at_the_start_of_each_window(driver: FleetDriver) -> None:
    approval_id = paused(driver)
    driver.store.client.delete(driver.store.keys.approval(approval_id))
    window_ms = round(driver.settings.approval_repair_interval_s * 1000)

    assert repair_if_due(driver.store, driver.settings, now_ms=7 * window_ms + 50) == []  # one pass later
    assert driver.client.approvals() == []
    assert repair_if_due(driver.store, driver.settings, now_ms=7 * window_ms + 10) == [
        RepairedApproval("s", approval_id, "lost")
    ]
    assert [a.id for a in driver.client.approvals()] == [approval_id]
