"""A session deleted and enqueued again under the same id is a new incarnation (issue #21): work the
old run still has under way commits nothing into the new one and stands nothing of it down."""

from __future__ import annotations

import time

import pytest

from lousho import Message
from lousho.fleet.keys import FleetKeys
from tests.engine.helpers import assert_valid_transcript
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def tool_results(fleet: Fleet, session: str) -> list[str | None]:
    checkpoint = fleet.client.checkpoint(session)
    assert checkpoint is not None and checkpoint.status == "finished"
    assert_valid_transcript(checkpoint.messages)
    return [m.content for m in checkpoint.messages if m.role == "tool"]


def test_a_recreated_session_never_takes_the_old_runs_result(fleet: Fleet) -> None:
    """The old run's call is still running when the session is deleted and enqueued again; the new
    run's model reuses the call id with other arguments. The new run records its own call's result."""
    fleet.script("again", [tool_turn(("call_0", "work", {"n": 1, "sleep_s": 3.0})), Message.assistant("old done")])
    fleet.start_worker()
    fleet.start_worker()
    fleet.start_reaper()
    fleet.client.enqueue("jobs", "first run", session_id="again")
    fleet.pid_running("call_0")

    fleet.store.checkpoints.delete("again")  # the README's way to start a session over
    fleet.script("again", [tool_turn(("call_0", "work", {"n": 7})), Message.assistant("new done")])
    fleet.client.enqueue("jobs", "second run", session_id="again")
    fleet.wait_for(["again"], timeout_s=60)
    time.sleep(3.5)  # the old call has ended by now too: it must not have changed anything

    results = tool_results(fleet, "again")
    assert results == ['{"n": 7, "square": 49}'], results
    checkpoint = fleet.client.checkpoint("again")
    assert checkpoint is not None and checkpoint.messages[-1].content == "new done"
    assert fleet.counts("runs")["call_0"] == 2  # the old run's execution, and the new run's own
    assert fleet.violations() == []


def test_work_of_a_deleted_session_writes_nothing(fleet: Fleet) -> None:
    """Deleted while its call runs, and not created again: the call's end leaves no key behind."""
    fleet.script("gone", [tool_turn(("g-1", "work", {"n": 2, "sleep_s": 1.5})), Message.assistant("done")])
    fleet.start_worker()
    fleet.client.enqueue("jobs", "run", session_id="gone")
    fleet.pid_running("g-1")
    fleet.store.checkpoints.delete("gone")
    time.sleep(2.5)

    assert fleet.client.checkpoint("gone") is None
    left = [k for k in fleet.redis.scan_iter(match=f"{fleet.prefix}{{gone}}:*") if not k.decode().endswith(":lease:g-1")]
    assert left == [], left
    assert fleet.client.status("gone").status == "unknown"


def test_aborting_a_finished_session_changes_nothing(fleet: Fleet) -> None:
    fleet.script("done", [Message.assistant("all done")])
    fleet.start_worker()
    fleet.client.enqueue("jobs", "hello", session_id="done")
    fleet.wait_for(["done"])

    assert fleet.client.abort("done") is False
    assert not fleet.redis.exists(FleetKeys(fleet.store).abort("done"))
    status = fleet.client.status("done")
    assert (status.status, status.aborted) == ("finished", False)
