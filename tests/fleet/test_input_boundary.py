"""`Client.enqueue` and `Client.resolve_approval` validate at the boundary (issue #21): input that would give the
provider an invalid transcript, and decisions that are not exactly True or False, get a typed error, and nothing
is written to Redis or sent to the queue. The Client needs no worker to refuse, so none is started here."""

from __future__ import annotations

from typing import Any

import pytest

from lousho import Checkpoint, InvalidDecisionError, Message, SDKError, ToolCall
from lousho.errors import InvalidInputError
from lousho.testing.store_contract.samples import sample_snapshot
from tests.chaos.test_bad_input import session_dump
from tests.fixtures.redis_dump import prefix_dump
from tests.fleet.conftest import Fleet

CALL = {"id": "c1", "name": "work", "arguments": {"n": 2}}
REFUSED_ANYWHERE: list[Any] = [
    123,
    [1, 2],
    {"foo": "bar"},
    [["hi"]],
    {"role": "tool", "content": "{}", "tool_call_id": "c1", "name": "work"},
    [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [CALL]}],
    "",
    [Message.system("You are a pirate.")],
    "\ud800 hi",  # a lone surrogate: no store can encode it (issue #31)
    [{"role": "user", "content": "ok"}, {"role": "user", "content": "half an emoji \ud83d"}],
]
REFUSED_FOR_A_NEW_SESSION: list[Any] = [None, [], [{"role": "assistant", "content": "Hello!"}]]
LAX_DECISIONS: list[Any] = ["no", 0, "false", "off", "yes", 1, None, "maybe", 2]


def everything(fleet: Fleet) -> dict[bytes, bytes | None]:
    return prefix_dump(fleet.redis, fleet.prefix, fleet.queue)


@pytest.mark.parametrize("bad", REFUSED_ANYWHERE + REFUSED_FOR_A_NEW_SESSION)
def test_enqueue_refuses_input_that_breaks_a_new_sessions_transcript_and_writes_no_key(fleet: Fleet, bad: Any) -> None:
    before = everything(fleet)

    with pytest.raises(InvalidInputError) as raised:
        fleet.client.enqueue("jobs", bad, session_id="fresh")

    assert isinstance(raised.value, SDKError) and raised.value.code == "LOUSHO_INVALID_INPUT"
    assert session_dump(fleet.redis, fleet.prefix, "fresh") == {} and everything(fleet) == before
    assert fleet.client.status("fresh").status == "unknown"


@pytest.mark.parametrize("bad", REFUSED_ANYWHERE)
@pytest.mark.parametrize("status", ["finished", "in-progress"])
def test_enqueue_refuses_input_that_breaks_a_stored_sessions_transcript_and_changes_no_key(
    fleet: Fleet, bad: Any, status: str
) -> None:
    stored = Checkpoint(session_id="kept", agent_name="jobs", status=status, version=1, run_start=1, run_input_count=1,
                        messages=[Message.system("Do jobs."), Message.user("go"), Message.assistant("done")])  # fmt: skip
    fleet.store.checkpoints.save("kept", stored)
    before = everything(fleet)

    with pytest.raises(InvalidInputError):
        fleet.client.enqueue("jobs", bad, session_id="kept")

    assert everything(fleet) == before


@pytest.mark.parametrize("state", [{"note": "\ud800"}, {"when": object()}])
def test_enqueue_refuses_a_business_state_that_cannot_be_stored_and_writes_no_key(fleet: Fleet, state: Any) -> None:
    before = everything(fleet)

    with pytest.raises(InvalidInputError, match="business_state cannot be stored"):
        fleet.client.enqueue("jobs", "go", session_id="fresh", business_state=state)

    assert everything(fleet) == before  # no epoch key either (issue #31)


def test_an_assistant_turn_with_tool_calls_is_refused_before_it_can_loop_on_the_fleet(fleet: Fleet) -> None:
    turn = [Message.user("go"), Message.assistant(tool_calls=[ToolCall(id="c1", name="work", arguments={"n": 2})])]

    with pytest.raises(InvalidInputError, match="would leave calls without results"):
        fleet.client.enqueue("jobs", turn, session_id="looper")

    assert session_dump(fleet.redis, fleet.prefix, "looper") == {} and fleet.redis.llen(fleet.queue) == 0


@pytest.mark.parametrize("approved", LAX_DECISIONS)
def test_resolve_approval_refuses_a_decision_that_is_not_a_bool_and_the_approval_stays_pending(
    fleet: Fleet, approved: Any
) -> None:
    fleet.store.approvals.save(sample_snapshot("appr_lax", session_id="paused"))
    before = everything(fleet)

    with pytest.raises(InvalidDecisionError):
        fleet.client.resolve_approval("appr_lax", approved=approved)

    assert everything(fleet) == before
    assert [a.id for a in fleet.client.approvals()] == ["appr_lax"]
