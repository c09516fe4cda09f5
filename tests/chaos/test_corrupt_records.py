"""Corrupt records among good ones, on a real fleet's Redis (issue #21).

A damaged approval snapshot and a damaged session head must not block a listing: `Client.approvals()`,
the store's `sessions()` and the `lousho approvals` / `lousho sessions` commands return every good
record and name exactly the damaged ones. A session this process holds in its cache (it read the
last save), whose messages list is then damaged by a raw write, must be refused when enqueued again,
and every one of its keys must stay as it was.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from typer.testing import CliRunner

from lousho import Message, ToolCall
from lousho.cli import app as cli
from lousho.errors import CorruptCheckpointError
from lousho.stores.listing import Listing
from tests.chaos.harness import ChaosFleet, Row, pick, record
from tests.chaos.test_bad_input import session_dump

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

GOOD = pick(4, 20)
"""Good sessions of each kind: finished ones, and ones paused on an approval."""


def run_good_sessions(fleet: ChaosFleet) -> tuple[list[str], list[str]]:
    """Finished sessions and sessions awaiting approval, run on the fleet."""
    finished = [f"done-{i}" for i in range(GOOD)]
    paused = [f"pay-{i}" for i in range(GOOD)]
    for session in finished:
        fleet.script(session, [Message.assistant(f"{session} is done")])
    for i, session in enumerate(paused):
        call = ToolCall(id=f"c{i}", name="charge", arguments={"amount": i + 1})
        fleet.script(session, [Message.assistant(tool_calls=[call]), Message.assistant("charged")])
    for session in finished + paused:
        fleet.client.enqueue("jobs", "go", session_id=session)
    fleet.wait_for(finished)
    fleet.wait_for(paused, status="awaiting-approval")
    return finished, paused


def check(problems: list[str], what: str, listed: Any, good: list[str], bad: str) -> None:
    """`listed` (ids) holds every good id and not the bad one, and names exactly the bad one as skipped."""
    listing = Listing.of(listed)
    if sorted(set(listing) - {bad}) != sorted(good) or bad in listing:
        problems.append(f"{what} listed {sorted(listing)}, not the good ones {sorted(good)}")
    if list(listing.skipped) != [bad]:
        problems.append(f"{what} skipped {list(listing.skipped)}, not [{bad!r}]")


def check_cli(problems: list[str], fleet: ChaosFleet, command: str, good: list[str], bad: str) -> None:
    env = {"LOUSHO_REDIS_URL": fleet.env["LOUSHO_TEST_FLEET_REDIS"], "LOUSHO_PREFIX": fleet.prefix,
           "LOUSHO_STORE_URL": None, "REDIS_URL": None, "LOUSHO_QUEUE": fleet.queue}  # fmt: skip
    result = CliRunner().invoke(cli, [command], env=env)
    if result.exit_code != 0:
        problems.append(f"lousho {command} exited {result.exit_code}: {result.output[-300:]}")
    missing = [record_id for record_id in good if record_id not in result.stdout]
    if missing or bad in result.stdout:
        problems.append(f"lousho {command}: rows missing {missing}, or the bad {bad!r} printed")
    what = "approval" if command == "approvals" else "session"
    if not result.stderr.startswith(f"warning: skipped 1 unreadable {what}: {bad}\n"):
        problems.append(f"lousho {command} warned {result.stderr[:300]!r}")


def check_warm_cache(problems: list[str], fleet: ChaosFleet, session: str) -> None:
    """Read through the client (its cache now holds the session), damage a message, enqueue again."""
    if fleet.client.checkpoint(session) is None or fleet.store.checkpoints.reader.cached(session) is None:
        problems.append(f"{session}: the client does not hold it after reading it")
        return
    fleet.redis.lset(fleet.store.keys.messages(session), 1, b'{"role": "assistant", "content": ')
    before = session_dump(fleet.redis, fleet.prefix, session)
    try:
        fleet.client.enqueue("jobs", "more", session_id=session)
        problems.append(f"{session}: enqueue on a damaged transcript held in the cache was accepted")
    except CorruptCheckpointError:
        pass
    if session_dump(fleet.redis, fleet.prefix, session) != before:
        problems.append(f"{session}: its keys changed")


@pytest.mark.timeout(pick(120, 600))
def test_corrupt_records_among_good_ones(chaos_fleet: ChaosFleet) -> None:
    fleet = chaos_fleet
    fleet.start_worker()
    started = time.monotonic()
    finished, paused = run_good_sessions(fleet)
    approvals = [a.id for a in fleet.client.approvals()]
    assert len(approvals) == len(paused)
    fleet.store.approvals.put_raw("appr_damaged", '{"id": "appr_damaged", "status": "pending", ')
    fleet.store.checkpoints.put_raw("damaged", b"\xff not a checkpoint")
    problems: list[str] = []

    pending = Listing.of(fleet.client.approvals())
    check(problems, "Client.approvals()", Listing([a.id for a in pending], skipped=pending.skipped), approvals,
          "appr_damaged")  # fmt: skip
    check(problems, "sessions(status='finished')", fleet.store.checkpoints.sessions(status="finished"),
          finished, "damaged")  # fmt: skip
    check(problems, "Client.sessions('awaiting-approval')", fleet.client.sessions("awaiting-approval"),
          paused, "damaged")  # fmt: skip
    check_cli(problems, fleet, "approvals", approvals, "appr_damaged")
    check_cli(problems, fleet, "sessions", finished + paused, "damaged")
    check_warm_cache(problems, fleet, finished[0])
    record(Row("corrupt records among good ones", 6, "listings and reads", {"damaged records": 3},
               problems, time.monotonic() - started,
               {"good sessions": len(finished) + len(paused), "good approvals": len(approvals)}))  # fmt: skip
    assert problems == []
