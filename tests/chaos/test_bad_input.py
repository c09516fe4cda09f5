"""Bad input on the fleet: each gives a typed error (an `SDKError`) or an error result the model reads, never
a crashed worker (the same worker process serves the next job), and stored data stays as it was (a DUMP
of every key of the session, before and after)."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from lousho import Message, SDKError, ToolCall
from lousho.errors import (
    AgentNotServedError,
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    CorruptCheckpointError,
    InvalidSessionIdError,
)
from lousho.executor import InvalidDecisionError
from lousho.fleet.settings import TASK_ADVANCE, TASK_MODEL_TURN, TASK_TOOL_CALL
from tests.chaos.harness import ChaosFleet, Row, pick, record

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

EXAMPLES = pick(50, 300)


class Work(BaseModel):  # the fleet app's `work` input, to know which generated arguments are valid
    n: int
    sleep_s: float = 0.0


def session_dump(client: redis.Redis, prefix: str, session: str) -> dict[bytes, bytes | None]:
    """DUMP of every key of the session (its lease, held only while a worker is on it, left out)."""
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", f"{prefix}{{{session}}}:") + "*"
    keys = sorted(k for k in client.scan_iter(match=pattern, count=1000) if not k.endswith(b":lease"))
    return {k: client.dump(k) for k in keys}


def serving(fleet: ChaosFleet, tag: str) -> None:
    """The worker still serves: a good job finishes, on the very process that took the bad ones."""
    pids = [w.pid for w in fleet.workers]
    session = f"good-{tag}-{uuid.uuid4().hex[:6]}"
    fleet.script(session, [Message.assistant("fine")])
    fleet.client.enqueue("jobs", "hello", session_id=session)
    fleet.wait_for([session], timeout_s=60)
    assert [w.pid for w in fleet.alive()] == pids, "a worker died"


def _raise() -> None:
    raise InvalidSessionIdError("session_id=None asks enqueue() for a new id: not an odd id there")


def unexpected_failures(fleet: ChaosFleet) -> list[str]:
    return [line for line in fleet.worker_logs().splitlines() if "raised unexpected" in line]


# -- tool arguments, through a model turn ------------------------------------------------------

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=12)
arguments = st.one_of(
    st.fixed_dictionaries({"n": json_value}, optional={"sleep_s": json_value}),
    st.dictionaries(st.text(max_size=20), json_value, max_size=5),
    st.fixed_dictionaries({"n": st.integers()}),
)
valid_call = st.tuples(st.just("work"), st.fixed_dictionaries({"n": st.integers()}, optional={"sleep_s": st.just(0)}))
tool_names = st.sampled_from(["work", "work", "work", "nope", "", "Work", "wörk", "work ", "charge_card"]) | st.text(max_size=30)


@pytest.mark.timeout(pick(150, 600))
def test_generated_tool_arguments_become_results_the_model_reads(chaos_fleet: ChaosFleet) -> None:
    fleet = chaos_fleet
    fleet.start_worker()
    fleet.start_reaper()
    seen: dict[str, int] = {"calls": 0, "valid": 0, "error results": 0}
    problems: list[str] = []
    started = time.monotonic()

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(batch=st.lists(valid_call | st.tuples(tool_names, arguments), min_size=1, max_size=4))
    def one_session(batch: list[tuple[str, dict[str, Any]]]) -> None:
        session = f"h-{uuid.uuid4().hex[:10]}"
        calls, expected = [], {}
        for i, (name, args) in enumerate(batch):
            try:
                valid = name == "work" and Work.model_validate(args) is not None
            except ValidationError:
                valid = False
            if valid:
                args = {**args, "sleep_s": 0}
                expected[f"{session}-{i}"] = {"n": Work.model_validate(args).n, "square": Work.model_validate(args).n ** 2}
            calls.append(ToolCall(id=f"{session}-{i}", name=name, arguments=args))
        fleet.script(session, [Message.assistant(tool_calls=calls), Message.assistant("read them")])
        fleet.client.enqueue("jobs", "go", session_id=session)
        fleet.wait_for([session], timeout_s=60)
        checkpoint = fleet.client.checkpoint(session)
        assert checkpoint is not None
        results = {m.tool_call_id: m.result() for m in checkpoint.messages if m.role == "tool"}
        runs = fleet.counts("runs")
        assert list(results) == [c.id for c in calls]
        for call in calls:
            seen["calls"] += 1
            if call.id in expected:
                seen["valid"] += 1
                assert results[call.id] == expected[call.id] and runs.get(call.id) == 1, call
            else:
                seen["error results"] += 1
                assert isinstance(results[call.id], dict) and "error" in results[call.id], (call, results[call.id])
                assert call.id not in runs, f"{call} ran with invalid arguments"

    try:
        one_session()
    except AssertionError as exc:
        problems.append(str(exc)[:2000])
    serving(fleet, "args")
    problems += unexpected_failures(fleet)
    record(Row("bad input: generated tool calls (hypothesis)", EXAMPLES, "sessions", {"generated calls": seen["calls"]},
               problems, time.monotonic() - started, {"valid, ran once": seen["valid"], "error results, never ran": seen["error results"]}))  # fmt: skip
    assert problems == []


# -- session ids ------------------------------------------------------------------------------

ODD_IDS: list[Any] = ["", "a" * 201, "x" * 100_000, "ünïcödé", "日本語", "{", "}", "a{b}", "{a}", "*", "a*", "a?b",
                      "[a]", "a b", " a", "a\n", "a\x00b", "a/b", "../x", "-a", ".a", "a\u200bb", "é" * 3, None, 5, 1.5,
                      ["a"], {"a": 1}, b"bytes"]  # fmt: skip
ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@=+-]{0,199}")  # what the README promises to accept
VALID_ODD_IDS = ["a:b", "a:b:c", "x" * 200, "a@b=c+d-e.f", "_a"]


@pytest.mark.timeout(120)
def test_odd_session_ids_get_a_typed_error_and_touch_nothing(chaos_fleet: ChaosFleet) -> None:
    fleet = chaos_fleet
    fleet.start_worker()
    started = time.monotonic()
    problems: list[str] = []
    keys_before = set(fleet.redis.scan_iter(match=f"{fleet.prefix}*", count=1000))
    client = fleet.client
    calls = [
        ("enqueue", lambda s: client.enqueue("jobs", "hi", session_id=s) if s is not None else _raise()),
        ("status", client.status),
        ("checkpoint", client.checkpoint),
        ("abort", client.abort),
        ("resume", client.resume),
    ]
    for session in ODD_IDS:
        for name, call in calls:
            try:
                call(session)
                problems.append(f"Client.{name}({session!r:.40}) was accepted")
            except InvalidSessionIdError:
                pass
            except Exception as exc:
                problems.append(f"Client.{name}({session!r:.40}): {type(exc).__name__}: {exc!s:.200}")
    generated = [0]

    @settings(max_examples=pick(300, 2000), deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(session=st.text(max_size=300))
    def any_text(session: str) -> None:
        generated[0] += 1
        try:
            status = client.status(session)
        except InvalidSessionIdError:
            assert not ID.fullmatch(session), session
            return
        assert ID.fullmatch(session) and status.status == "unknown", session

    try:
        any_text()
    except AssertionError as exc:
        problems.append(f"Client.status on generated text: {exc!s:.300}")
    # The same ids (and ill-typed arguments) straight onto the queue, as a buggy or hostile producer would.
    sent = 0
    for session in ODD_IDS:
        for name, args in ((TASK_MODEL_TURN, [session, 1]), (TASK_TOOL_CALL, [session, "c1", "work"]), (TASK_ADVANCE, [session, "x"])):
            client.app.send_task(name, args=args, task_id=uuid.uuid4().hex, queue=fleet.queue)
            sent += 1
    malformed = [(TASK_MODEL_TURN, ["ok-id", "not a number"]), (TASK_MODEL_TURN, []), (TASK_TOOL_CALL, ["ok-id"]),
                 (TASK_ADVANCE, ["ok-id", "x", "y", "z"]), (TASK_MODEL_TURN, [{"session": 1}, None])]  # fmt: skip
    for name, args in malformed:
        client.app.send_task(name, args=args, task_id=uuid.uuid4().hex, queue=fleet.queue)
        sent += 1
    serving(fleet, "ids")
    keys_after = set(fleet.redis.scan_iter(match=f"{fleet.prefix}*", count=1000))
    new_keys = sorted(k.decode() for k in keys_after - keys_before if b"good-ids" not in k and b"test:" not in k)
    if new_keys:
        problems.append(f"bad ids created keys: {new_keys[:10]}")
    refused = fleet.worker_logs().count("LOUSHO_INVALID_SESSION_ID")
    untyped = unexpected_failures(fleet)
    for session in VALID_ODD_IDS:  # odd but allowed: they work end to end
        fleet.script(session, [Message.assistant("ok")])
        client.enqueue("jobs", "hi", session_id=session)
    fleet.wait_for(VALID_ODD_IDS, timeout_s=60)
    record(Row("bad input: session ids", len(ODD_IDS) * len(calls) + sent + len(VALID_ODD_IDS) + generated[0], "cases",
               {"odd ids": len(ODD_IDS), "straight to the queue": sent, "generated ids (hypothesis)": generated[0]}, problems, time.monotonic() - started,
               {"refused by the worker (typed)": refused, "malformed task arguments (Celery/ValueError, worker kept serving)": len(untyped),
                "odd but valid ids finished": len(VALID_ODD_IDS)}))  # fmt: skip
    assert problems == []
    assert refused >= 3 * (len(ODD_IDS) - 5)  # the non-strings are refused as well, by validate_session_id
    assert len(untyped) <= len(malformed)


# -- corrupt and foreign checkpoints ------------------------------------------------------------


@pytest.mark.timeout(120)
def test_corrupt_and_foreign_checkpoints_are_refused_and_left_as_they_are(chaos_fleet: ChaosFleet) -> None:
    fleet = chaos_fleet
    fleet.start_worker()
    started = time.monotonic()
    fleet.script("donor", [Message.assistant(tool_calls=[ToolCall(id="d1", name="work", arguments={"n": 2})]), Message.assistant("done")])
    fleet.client.enqueue("jobs", "go", session_id="donor")
    fleet.wait_for(["donor"], timeout_s=60)
    donor_head = fleet.redis.get(f"{fleet.prefix}{{donor}}:cp")
    assert donor_head is not None
    head = json.loads(donor_head)
    raws: dict[str, bytes | str] = {
        "not-json": b"not json {",
        "empty": b"",
        "binary": b"\xff\xfe\x00garbage",
        "a-list": b"[1, 2, 3]",
        "a-number": b"42",
        "newer-schema": json.dumps({**head, "schema_version": 999}),
        "wrong-shape": json.dumps({**head, "messages": "not a list", "version": "seven"}),
        "foreign": donor_head,  # another session's record under this id
        "no-messages": json.dumps(head),  # a head whose transcript segments point at nothing
        "huge-garbage": b"{" * 1_000_000,
    }
    problems: list[str] = []
    dumps = {}
    for name, raw in raws.items():
        session = f"bad-{name}"
        fleet.store.checkpoints.put_raw(session, raw)
        dumps[session] = session_dump(fleet.redis, fleet.prefix, session)
        for what, call in (("status", fleet.client.status), ("enqueue", lambda s: fleet.client.enqueue("jobs", "more", session_id=s))):
            try:
                call(session)
                problems.append(f"Client.{what} on a {name} checkpoint was accepted")
            except CorruptCheckpointError:
                pass
            except Exception as exc:
                problems.append(f"Client.{what} on a {name} checkpoint: {type(exc).__name__}: {exc!s:.200}")
        for task, args in ((TASK_MODEL_TURN, [session, 1]), (TASK_TOOL_CALL, [session, "d1", "work"]), (TASK_ADVANCE, [session, "reaper"])):
            fleet.client.app.send_task(task, args=args, task_id=uuid.uuid4().hex, queue=fleet.queue)
    serving(fleet, "corrupt")
    parked = set(fleet.client.sessions(status="parked"))
    for session, before in dumps.items():
        if session_dump(fleet.redis, fleet.prefix, session) != before:
            problems.append(f"{session}: its keys changed")
        if session == "bad-newer-schema":  # a newer lousho's: its steps handed back, never parked (issue #35)
            if session in parked:
                problems.append(f"{session}: parked, where its steps are to wait for a worker that reads it")
        elif session not in parked:
            problems.append(f"{session}: not parked for a human")
    problems += unexpected_failures(fleet)
    record(Row("bad input: corrupt and foreign checkpoints", len(raws) * 5, "cases", {"damaged records": len(raws)},
               problems, time.monotonic() - started, {"parked for a human": len(parked & set(dumps)), "handed back": 1, "keys changed": 0}))  # fmt: skip
    assert problems == []


# -- oversized input, unknown agents and tools ----------------------------------------------------


@pytest.mark.timeout(120)
def test_oversized_input_unknown_agent_and_unknown_tool(chaos_fleet: ChaosFleet) -> None:
    fleet = chaos_fleet
    fleet.start_worker()
    started = time.monotonic()
    problems: list[str] = []
    big = "x" * (5 * 1024 * 1024)
    fleet.script("big-input", [Message.assistant("that was long")])
    fleet.script("big-args", [Message.assistant(tool_calls=[
        ToolCall(id="b1", name="work", arguments={"n": 1, "padding": big}),  # valid: extra fields are ignored
        ToolCall(id="b2", name="work", arguments={"n": big}),  # invalid: a 5 MB string where an int goes
    ]), Message.assistant("done")])  # fmt: skip
    fleet.script("ghost-tool", [Message.assistant(tool_calls=[ToolCall(id="g1", name="delete_everything", arguments={})]), Message.assistant("ok")])
    t0 = time.monotonic()
    fleet.client.enqueue("jobs", big, session_id="big-input")
    fleet.client.enqueue("jobs", "go", session_id="big-args")
    fleet.client.enqueue("jobs", "go", session_id="ghost-tool")
    with pytest.raises(AgentNotServedError) as refused:  # no worker serves it: refused, nothing written (issue #15)
        fleet.client.enqueue("no-such-agent", "hi", session_id="ghost-agent")
    if "'jobs'" not in str(refused.value) or fleet.client.checkpoint("ghost-agent") is not None:
        problems.append(f"an unknown agent refused at enqueue: {refused.value} (written: {fleet.client.checkpoint('ghost-agent')})")
    fleet.client.enqueue("no-such-agent", "hi", session_id="ghost-agent", require_worker=False)  # a worker parks it
    fleet.wait_for(["big-input", "big-args", "ghost-tool"], timeout_s=90)
    five_mb_s = time.monotonic() - t0
    fleet.wait_for(["ghost-agent"], status="parked", timeout_s=30)
    big_args = fleet.client.checkpoint("big-args")
    assert big_args is not None
    results = {m.tool_call_id: m.result() for m in big_args.messages if m.role == "tool"}
    if results["b1"] != {"n": 1, "square": 1}:
        problems.append(f"5 MB of extra arguments: {str(results['b1'])[:200]}")
    if not (isinstance(results["b2"], dict) and "error" in results["b2"]):
        problems.append("a 5 MB invalid argument did not give an error result")
    elif len(json.dumps(results["b2"])) > 100_000:
        problems.append(f"the error result for a 5 MB argument is {len(json.dumps(results['b2']))} bytes (it repeats the input)")
    ghost = fleet.client.checkpoint("ghost-tool")
    assert ghost is not None
    if "unknown tool" not in str(ghost.messages[-2].result()):
        problems.append(f"unknown tool: {ghost.messages[-2].content}")
    reason = fleet.client.status("ghost-agent").parked_reason or ""
    if "no agent named 'no-such-agent'" not in reason:
        problems.append(f"unknown agent: {reason}")
    serving(fleet, "big")
    problems += unexpected_failures(fleet)
    record(Row("bad input: 5 MB input and arguments, unknown agent and tool", 4, "sessions", {}, problems,
               time.monotonic() - started, {"three sessions with 5 MB parts finished in": f"{five_mb_s:.2f} s"}))  # fmt: skip
    assert problems == []


# -- approval decisions ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_malformed_approval_decisions_get_typed_errors_and_change_nothing(chaos_fleet: ChaosFleet) -> None:
    fleet = chaos_fleet
    fleet.start_worker()
    started = time.monotonic()
    fleet.script("pay", [Message.assistant(tool_calls=[ToolCall(id="p1", name="charge", arguments={"amount": 9})]), Message.assistant("paid")])
    fleet.client.enqueue("jobs", "pay", session_id="pay")
    fleet.wait_for(["pay"], status="awaiting-approval", timeout_s=60)
    approval = fleet.client.approvals("pay")[0]
    key = f"{fleet.prefix}approval:{approval.id}"
    before = (fleet.redis.dump(key), session_dump(fleet.redis, fleet.prefix, "pay"))
    bad: list[tuple[Any, Any, Any, type[SDKError]]] = [
        ("appr_nope", True, None, ApprovalNotFoundError),
        ("", True, None, ApprovalNotFoundError),
        ("x" * 10_000, False, None, ApprovalNotFoundError),
        (f"{approval.id}*", True, None, ApprovalNotFoundError),
        (None, True, None, InvalidDecisionError),
        (42, True, None, InvalidDecisionError),
        (approval.id, None, None, InvalidDecisionError),
        (approval.id, "maybe", None, InvalidDecisionError),
        (approval.id, {"yes": 1}, None, InvalidDecisionError),
        (approval.id, True, {"note": "not text"}, InvalidDecisionError),
        (approval.id, False, 12, InvalidDecisionError),
    ]
    problems: list[str] = []
    for approval_id, approved, note, expected in bad:
        try:
            fleet.client.resolve_approval(approval_id, approved=approved, note=note)
            problems.append(f"resolve_approval({approval_id!r:.30}, approved={approved!r}, note={note!r}) was accepted")
        except expected:
            pass
        except Exception as exc:
            problems.append(f"resolve_approval({approval_id!r:.30}, approved={approved!r}, note={note!r}): {type(exc).__name__}: {exc!s:.200}")
    if (fleet.redis.dump(key), session_dump(fleet.redis, fleet.prefix, "pay")) != before:
        problems.append("a refused decision changed the approval or the session")
    fleet.client.resolve_approval(approval.id, approved=True, note="fine")
    try:
        fleet.client.resolve_approval(approval.id, approved=False, note="changed my mind")
        problems.append("a second decision was accepted")
    except ApprovalAlreadyResolvedError:
        pass
    fleet.wait_for(["pay"], timeout_s=60)
    if fleet.counts("runs").get("p1") != 1:
        problems.append(f"the approved call ran {fleet.counts('runs').get('p1')} times")
    serving(fleet, "approvals")
    record(Row("bad input: approval decisions", len(bad) + 1, "cases", {}, problems, time.monotonic() - started))
    assert problems == []
