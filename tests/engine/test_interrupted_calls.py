"""`on_interrupted` in process (issue #17): a call that was running when its process was SIGKILLed, or
when its run was aborted, is run again ('rerun'), waits for a human ('ask'), or gets an error result
the model reads ('fail'). The crash is real: a child process runs the agent on a file store and is
killed in the middle of the tool; the test process resumes the session from that store."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lousho import (
    AbortSignal,
    Agent,
    ConfigurationError,
    InvalidDecisionError,
    SessionAwaitingApprovalError,
    ToolContext,
    create_agent,
    define_tool,
    memory_store,
)
from lousho.engine import CANCELLED_RESULT
from lousho.providers import ScriptedProvider, tool_calls
from lousho.tools import interrupted_result
from tests.engine.helpers import assert_finished_with_every_result, assert_valid_transcript
from tests.engine.interrupted_app import Email, make_agent, runs

ROOT = Path(__file__).resolve().parents[2]


def crash_in_the_middle_of_the_call(folder: Path, policy: str) -> None:
    """Run session `s-<policy>` in a child process and SIGKILL it while `<policy>-send` runs."""
    child = subprocess.Popen([sys.executable, "-m", "tests.engine.interrupted_app", str(folder), policy], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not (folder / f"started-{policy}-send").exists():
            assert child.poll() is None, f"the child ended with {child.returncode} before the call started"
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def results(checkpoint: Any) -> dict[str, Any]:
    return {m.tool_call_id: m.result() for m in checkpoint.messages if m.role == "tool"}


@pytest.mark.timeout(60)
async def test_a_rerun_call_runs_again_with_the_same_id_after_a_crash(tmp_path: Path) -> None:
    crash_in_the_middle_of_the_call(tmp_path, "rerun")
    result = await make_agent(tmp_path).resume("s-rerun")

    assert result is not None and result.finish_reason == "stop"
    assert_finished_with_every_result(result.checkpoint, "s-rerun")
    assert runs(tmp_path, "rerun-send") == 2
    assert results(result.checkpoint)["rerun-send"] == {"sent_to": "ann@example.com"}
    assert result.checkpoint.started_calls == []


@pytest.mark.timeout(60)
async def test_a_fail_call_gets_the_interrupted_error_after_a_crash_and_the_model_goes_on(tmp_path: Path) -> None:
    crash_in_the_middle_of_the_call(tmp_path, "fail")
    result = await make_agent(tmp_path).resume("s-fail")

    assert result is not None and result.finish_reason == "stop" and result.text == "done after 2 results"
    assert_finished_with_every_result(result.checkpoint, "s-fail")
    assert runs(tmp_path, "fail-send") == 1
    assert results(result.checkpoint)["fail-send"] == interrupted_result("send_fail")
    assert results(result.checkpoint)["fail-note"] == "noted ann@example.com"


CHOICES: dict[str, tuple[dict[str, Any], Any, int]] = {
    # the decision -> the call's recorded result, and how many times the tool ran in all
    "rerun": ({"approved": True, "action": "rerun"}, {"sent_to": "ann@example.com"}, 2),
    "record": ({"approved": True, "action": "record", "result": {"sent_to": "ann", "by": "hand"}},
               {"sent_to": "ann", "by": "hand"}, 1),
    "fail": ({"approved": False, "action": "fail", "note": "the outbox shows nothing"},
             {"error": "interrupted", "note": interrupted_result("send_ask")["note"]
              + " A human's note: the outbox shows nothing"}, 1),
}


async def assert_asks_then_applies(tmp_path: Path, paused: Any, choice: str) -> None:
    """The session waits on an interrupted-call approval, ran nothing more, and the human's choice gives
    the expected transcript."""
    agent = make_agent(tmp_path)
    assert paused.checkpoint.status == "awaiting-approval"
    assert runs(tmp_path, "ask-send") == 1 and runs(tmp_path, "ask-note") == 0
    [approval] = await agent.approvals.pending("s-ask")
    assert approval.kind == "interrupted" and approval.tool_call.id == "ask-send"
    with pytest.raises(InvalidDecisionError):  # an action must fit approved
        await agent.approvals.resolve(approval.id, approved=False, action="rerun")

    decision, expected, total_runs = CHOICES[choice]
    result = await agent.approvals.resolve(approval.id, **decision)

    assert result.finish_reason == "stop"
    assert_finished_with_every_result(result.checkpoint, "s-ask")
    assert results(result.checkpoint)["ask-send"] == expected
    assert runs(tmp_path, "ask-send") == total_runs
    assert runs(tmp_path, "ask-note") == 1  # the calls after it run once the human decided


@pytest.mark.timeout(60)
@pytest.mark.parametrize("choice", list(CHOICES))
async def test_an_ask_call_pauses_after_a_crash_and_the_human_choice_is_recorded(tmp_path: Path, choice: str) -> None:
    crash_in_the_middle_of_the_call(tmp_path, "ask")
    paused = await make_agent(tmp_path).resume("s-ask")

    assert paused is not None and paused.finish_reason == "awaiting-approval"
    await assert_asks_then_applies(tmp_path, paused, choice)


def aborting_agent(tmp_path: Path) -> Any:
    """Its first run of a `send_*` call aborts the run and waits for the signal, like a slow request."""
    stop = asyncio.Event()

    async def abort_now(ctx: ToolContext) -> None:
        stop.set()
        await ctx.signal.wait()

    return make_agent(tmp_path, on_first_run=abort_now), stop


async def send_and_abort(tmp_path: Path, policy: str) -> Any:
    agent, stop = aborting_agent(tmp_path)
    abort = AbortSignal()

    async def press_stop() -> None:
        await stop.wait()
        abort.abort("user pressed stop")

    stopper = asyncio.ensure_future(press_stop())
    result = await agent.send("send it", session_id=f"s-{policy}", signal=abort)
    await stopper
    return result


async def test_an_aborted_rerun_call_gets_the_cancelled_result(tmp_path: Path) -> None:
    result = await send_and_abort(tmp_path, "rerun")
    assert result.finish_reason == "aborted"
    assert results(result.checkpoint) == {"rerun-send": CANCELLED_RESULT, "rerun-note": CANCELLED_RESULT}
    assert result.checkpoint.started_calls == []  # no start mark is saved for a 'rerun' tool


async def test_an_aborted_fail_call_gets_the_interrupted_error_and_a_resume_goes_on(tmp_path: Path) -> None:
    aborted = await send_and_abort(tmp_path, "fail")
    assert aborted.finish_reason == "aborted" and aborted.checkpoint.status == "in-progress"
    assert_valid_transcript(aborted.checkpoint.messages)
    assert results(aborted.checkpoint) == {"fail-send": interrupted_result("send_fail"), "fail-note": CANCELLED_RESULT}

    result = await make_agent(tmp_path).send("go on", session_id="s-fail")
    assert result.finish_reason == "stop" and runs(tmp_path, "fail-send") == 1
    assert_valid_transcript(result.checkpoint.messages)


@pytest.mark.parametrize("choice", list(CHOICES))
async def test_an_aborted_ask_call_pauses_and_the_human_choice_is_recorded(tmp_path: Path, choice: str) -> None:
    aborted = await send_and_abort(tmp_path, "ask")
    assert aborted.finish_reason == "aborted"
    assert results(aborted.checkpoint) == {}  # nothing recorded for it, nor after it
    with pytest.raises(SessionAwaitingApprovalError):  # the next resume shows the interrupted-call approval
        await make_agent(tmp_path).resume("s-ask")
    await assert_asks_then_applies(tmp_path, aborted, choice)


async def test_an_action_on_an_ordinary_approval_is_refused_and_changes_nothing() -> None:
    gated = define_tool(name="pay", description="", input=Email, execute=lambda a, c: "paid", needs_approval=True)
    agent = create_agent(provider=ScriptedProvider([tool_calls(("p1", "pay", {"to": "x"}))]), store=memory_store(),
                         agent=Agent(name="a", model="m", tools=[gated]))
    paused = await agent.send("pay", session_id="s")
    with pytest.raises(InvalidDecisionError, match="not an interrupted call"):
        await agent.approvals.resolve(paused.approval_id or "", approved=True, action="record", result="paid")
    [still] = await agent.approvals.pending("s")
    assert still.status == "pending" and still.action is None


def test_an_unknown_policy_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="on_interrupted"):
        define_tool(name="t", description="", input=Email, execute=lambda a, c: 1, on_interrupted="retry")  # type: ignore[arg-type]


@pytest.mark.timeout(60)
async def test_lousho_approvals_lists_an_interrupted_call_and_lousho_approve_records_the_typed_result(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from lousho.cli import app

    crash_in_the_middle_of_the_call(tmp_path, "ask")
    paused = await make_agent(tmp_path).resume("s-ask")
    assert paused is not None and paused.approval_id is not None
    env = {"LOUSHO_STORE_URL": f"file://{tmp_path / 'store'}", "LOUSHO_REDIS_URL": None, "REDIS_URL": None}

    listed = await asyncio.to_thread(CliRunner().invoke, app, ["approvals", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    assert '"kind": "interrupted"' in listed.stdout and paused.approval_id in listed.stdout
    bad = await asyncio.to_thread(
        CliRunner().invoke, app, ["approve", paused.approval_id, "--action", "record", "--result", "{oops"], env=env
    )
    assert bad.exit_code == 1 and "LOUSHO_INVALID_DECISION" in bad.stderr
    said = await asyncio.to_thread(
        CliRunner().invoke, app, ["approve", paused.approval_id, "--action", "record", "--result", '"sent by hand"'],
        env=env,
    )
    assert said.exit_code == 0 and said.stdout.startswith(f"approved (record) {paused.approval_id}"), said.output

    result = await make_agent(tmp_path).resume("s-ask")  # the next resume applies the recorded decision
    assert result is not None and result.finish_reason == "stop"
    assert_finished_with_every_result(result.checkpoint, "s-ask")
    assert results(result.checkpoint)["ask-send"] == "sent by hand" and runs(tmp_path, "ask-send") == 1


async def test_an_aborted_ask_call_of_a_sub_agent_pauses_its_parent_and_the_answer_reaches_the_sub_agent() -> None:
    from lousho import agent_tool

    started = asyncio.Event()

    async def send(args: Email, ctx: ToolContext) -> str:
        started.set()
        await asyncio.sleep(60)
        return "sent"

    mailer = Agent(name="mailer", model="m", tools=[
        define_tool(name="send", description="", input=Email, execute=send, on_interrupted="ask")])
    provider = ScriptedProvider([tool_calls(("h1", "helper", {"input": "mail ann"})),
                                 tool_calls(("m1", "send", {"to": "ann"})), "mailed", "all done"])
    boss = create_agent(provider=provider, store=memory_store(),
                        agent=Agent(name="boss", model="m", tools=[agent_tool(mailer, name="helper")]))
    signal = AbortSignal()

    async def press_stop() -> None:
        await started.wait()
        signal.abort("stop")

    stopper = asyncio.ensure_future(press_stop())
    stopped = await boss.send("go", session_id="boss", signal=signal)
    await stopper
    assert stopped.checkpoint.status == "awaiting-approval" and results(stopped.checkpoint) == {}
    [approval] = await boss.approvals.pending("boss")
    assert approval.waiting.kind == "interrupted" and approval.waiting.tool_call.id == "m1"

    done = await boss.approvals.resolve(approval.id, approved=True, action="record", result="sent by hand")
    assert done.finish_reason == "stop" and done.text == "all done"
    assert_finished_with_every_result(done.checkpoint, "boss")
    assert results(done.checkpoint) == {"h1": "mailed"}
    child = await boss.session("boss.sub-h1").checkpoint()
    assert child is not None and results(child) == {"m1": "sent by hand"}
