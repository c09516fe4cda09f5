"""Versioned formats on the fleet (issue #35): every step message says its protocol, every worker says which
lousho it runs and the protocols it speaks, and a worker hands back, unrun and untouched, a message of a newer
protocol or a session a newer lousho wrote, for a worker that reads it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

import lousho
from lousho import Message
from lousho.fleet.protocol import PROTOCOL_HEADER
from lousho.formats import MESSAGE_PROTOCOL, written_formats
from lousho.telemetry.counters import FleetCounters
from tests.fleet.conftest import Fleet, tool_turn
from tests.ops.test_cli import lousho as run_lousho

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

NEWER = MESSAGE_PROTOCOL + 1


def queued(fleet: Fleet) -> list[dict[str, Any]]:
    """The messages waiting on the fleet's queue, oldest first."""
    return [json.loads(entry) for entry in reversed(fleet.redis.lrange(fleet.queue, 0, -1))]


def make_newer(fleet: Fleet) -> dict[str, Any]:
    """Rewrite the one message on the queue as a worker of the next protocol would send it."""
    (message,) = queued(fleet)
    message["headers"][PROTOCOL_HEADER] = NEWER
    fleet.redis.delete(fleet.queue)
    fleet.redis.lpush(fleet.queue, json.dumps(message))
    return message


def handed_back(fleet: Fleet) -> int:
    return FleetCounters.of(fleet.store).read()["messages_handed_back"]


def wait_until(what: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, f"not so after {timeout_s}s"
        time.sleep(0.1)


def raw_session(fleet: Fleet, session: str) -> dict[str, Any]:
    """The session's checkpoint keys as stored, byte for byte."""
    return {key: fleet.redis.dump(key) for key in sorted(fleet.redis.keys(f"{fleet.prefix}{{{session}}}:*"))}


def test_every_step_message_carries_the_protocol_it_is_written_in(fleet: Fleet) -> None:
    fleet.script("s1", [tool_turn(("c1", "work", {"n": 2})), Message.assistant("done")])
    fleet.client.enqueue("jobs", "go", session_id="s1", require_worker=False)
    (first,) = queued(fleet)
    assert first["headers"][PROTOCOL_HEADER] == MESSAGE_PROTOCOL  # the Client's
    fleet.start_worker()
    fleet.wait_for(["s1"])
    assert fleet.counts("asked") == {"s1:1": 1, "s1:2": 1}  # the worker's own messages (outbox) ran too


def test_a_worker_hands_back_a_message_of_a_newer_protocol_untouched_for_a_worker_that_speaks_it(
    fleet: Fleet,
) -> None:
    fleet.script("s1", [tool_turn(("c1", "work", {"n": 3})), Message.assistant("done")])
    fleet.client.enqueue("jobs", "go", session_id="s1", require_worker=False)
    newer = make_newer(fleet)
    before = raw_session(fleet, "s1")

    old = fleet.start_worker("old")
    wait_until(lambda: handed_back(fleet) >= 2)  # taken, held, handed back, taken again...
    old.stop()

    assert fleet.counts("asked") == {}  # never run: no model asked
    assert raw_session(fleet, "s1") == before  # the session untouched
    assert fleet.client.status("s1").status == "in-progress"
    (again,) = queued(fleet)  # the very message is back on the queue, for a worker that speaks it
    assert again["headers"][PROTOCOL_HEADER] == NEWER
    assert (again["headers"]["id"], again["body"]) == (newer["headers"]["id"], newer["body"])
    assert f"handed back lousho.model_turn {newer['headers']['id']} unrun" in old.log()
    assert f"its message is of protocol {NEWER}" in old.log()

    fleet.start_worker("new", LOUSHO_TEST_MESSAGE_PROTOCOL=str(NEWER))  # a stand-in for the next release's
    fleet.wait_for(["s1"])
    assert fleet.counts("asked") == {"s1:1": 1, "s1:2": 1}
    assert fleet.counts("runs") == {"c1": 1}


def test_a_session_a_newer_lousho_wrote_is_handed_back_never_parked(fleet: Fleet) -> None:
    fleet.script("s1", [Message.assistant("done")])
    fleet.client.enqueue("jobs", "go", session_id="s1", require_worker=False)
    stored = json.loads(fleet.redis.get(f"{fleet.prefix}{{s1}}:cp") or b"")
    fleet.store.checkpoints.put_raw("s1", json.dumps({**stored, "schema_version": 2}))  # as the next release's
    before = raw_session(fleet, "s1")

    worker = fleet.start_worker()
    wait_until(lambda: handed_back(fleet) >= 2)
    worker.stop()

    assert "s1" not in fleet.client.sessions(status="parked")
    assert raw_session(fleet, "s1") == before
    assert fleet.counts("asked") == {}
    assert "schema version 2 is newer than this lousho reads" in worker.log()
    assert len(queued(fleet)) == 1  # the step's message waits for a worker that reads the session


def test_each_worker_says_which_lousho_it_runs_and_the_protocols_it_speaks(fleet: Fleet) -> None:
    fleet.start_worker()
    (worker,) = fleet.client.registry.live().workers
    assert worker.version == lousho.__version__
    assert worker.message_protocols == (1, MESSAGE_PROTOCOL)
    assert dict(worker.formats or ()) == written_formats()

    env = {"LOUSHO_REDIS_URL": fleet.env["LOUSHO_TEST_FLEET_REDIS"], "LOUSHO_PREFIX": fleet.prefix}
    listed = json.loads(run_lousho("workers", "--json", env=env).stdout)
    assert [(w["id"], w["version"], w["message_protocols"]) for w in listed] == [
        (worker.id, lousho.__version__, [1, MESSAGE_PROTOCOL])
    ]
    table = run_lousho("workers", env=env).stdout
    assert worker.id in table and f"{lousho.__version__}; messages 1" in table
