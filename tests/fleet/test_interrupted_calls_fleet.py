"""`on_interrupted` on a real fleet (issue #17): the worker running a call is SIGKILLed in the middle of
it (trigger `tool:<call id>`, tests/fleet/fleet_app.py); 'rerun' runs it once more with the same id,
'fail' records the interrupted error and the model goes on, 'ask' pauses without running anything more
until a human decides: run again, record a result they typed, or record a failure."""

from __future__ import annotations

from typing import Any

import pytest

from lousho import Message
from lousho.tools import interrupted_result
from tests.engine.helpers import assert_finished_with_every_result
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def killed_mid_call(fleet: Fleet, session: str, tool: str) -> None:
    """Script `session`: its first turn calls `tool` (whose worker dies in the middle) and `work`."""
    fleet.script(session, [
        tool_turn((f"{session}-send", tool, {"n": 3, "sleep_s": 0.2}), (f"{session}-note", "work", {"n": 2})),
        Message.assistant(f"{session} done"),
    ])
    fleet.kill_on(f"tool:{session}-send")


def results(fleet: Fleet, session: str) -> dict[str, Any]:
    checkpoint = fleet.client.checkpoint(session)
    assert checkpoint is not None
    return {m.tool_call_id: m.result() for m in checkpoint.messages if m.role == "tool"}


def start(fleet: Fleet, sessions: list[str]) -> None:
    for _ in range(2):
        fleet.start_worker()
    fleet.start_reaper()
    for session in sessions:
        fleet.client.enqueue("jobs", f"job {session}", session_id=session)


def test_rerun_runs_the_call_again_and_fail_records_the_interrupted_error(fleet: Fleet) -> None:
    killed_mid_call(fleet, "rerun", "work")
    killed_mid_call(fleet, "fail", "mail_fail")
    start(fleet, ["rerun", "fail"])
    fleet.start_worker()  # the killed workers' replacements
    fleet.start_worker()
    fleet.wait_for(["rerun", "fail"], timeout_s=90)

    runs = fleet.counts("runs")
    for session in ("rerun", "fail"):
        assert_finished_with_every_result(fleet.client.checkpoint(session), session)
        assert not fleet.redis.sismember(fleet.key("kill"), f"tool:{session}-send")  # the worker did die mid-call
    assert runs["rerun-send"] == 2  # once more, with the same tool_call_id
    assert results(fleet, "rerun")["rerun-send"] == {"n": 3, "square": 9}
    assert runs["fail-send"] == 1  # not run again: the model read the error and went on
    assert results(fleet, "fail")["fail-send"] == interrupted_result("mail_fail")
    assert results(fleet, "fail")["fail-note"] == {"n": 2, "square": 4}
    assert fleet.violations() == []


CHOICES: dict[str, tuple[dict[str, Any], Any, int]] = {
    # the decision -> the call's recorded result, and its runs in all
    "ask-rerun": ({"approved": True, "action": "rerun"}, {"n": 3, "square": 9}, 2),
    "ask-record": ({"approved": True, "action": "record", "result": {"sent": "by hand"}}, {"sent": "by hand"}, 1),
    "ask-fail": ({"approved": False, "action": "fail"}, interrupted_result("mail_ask"), 1),
}


def test_ask_pauses_runs_nothing_more_and_each_human_choice_gives_its_transcript(fleet: Fleet) -> None:
    for session in CHOICES:
        killed_mid_call(fleet, session, "mail_ask")
    start(fleet, list(CHOICES))
    fleet.start_worker()
    fleet.start_worker()
    fleet.wait_for(list(CHOICES), status="awaiting-approval", timeout_s=90)

    runs = fleet.counts("runs")
    approvals = {a.session_id: a for a in fleet.client.approvals()}
    for session in CHOICES:
        assert runs[f"{session}-send"] == 1, session  # it ran once, and was not run again
        assert approvals[session].kind == "interrupted" and approvals[session].tool_call.id == f"{session}-send"
        assert f"{session}-send" not in results(fleet, session)

    for session, (decision, _, _) in CHOICES.items():
        fleet.client.resolve_approval(approvals[session].id, **decision)
    fleet.wait_for(list(CHOICES), timeout_s=90)

    runs = fleet.counts("runs")
    for session, (_, expected, total_runs) in CHOICES.items():
        assert_finished_with_every_result(fleet.client.checkpoint(session), session)
        assert results(fleet, session)[f"{session}-send"] == expected, session
        assert runs[f"{session}-send"] == total_runs, session
        assert runs[f"{session}-note"] == 1, session
    assert fleet.violations() == []
