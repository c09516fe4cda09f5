"""Raw bytes on the queue: while real workers serve jobs, random entries (bytes, text, JSON, kombu envelopes
with a part taken out or replaced, seeded) are pushed straight onto the Redis lists the workers consume, as a
buggy or hostile producer with access to the broker would. Every worker lives on (the same processes), every
job finishes, and every entry is taken: none is left on a list, none is stuck among kombu's unacknowledged
messages, none is lost as a 'dropped connection', and each that is no kombu message is in the rejected list
(lousho/fleet/transport.py, issue #21)."""

from __future__ import annotations

import base64
import json
import random
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from lousho.fleet.settings import TASK_ADVANCE, TASK_MODEL_TURN, TASK_TOOL_CALL
from lousho.fleet.transport import rejected_key
from tests.chaos.harness import (
    SEED,
    Background,
    ChaosFleet,
    Row,
    check_sessions,
    install_scripts,
    pick,
    random_script,
    record,
    settled_count,
)

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

SESSIONS = pick(10, 60)
ENTRIES = pick(80, 600)
TAG = f"raw-{uuid.uuid4().hex[:8]}"
"""The delivery tags of the envelopes pushed here start with it (to find them among kombu's unacknowledged)."""


def json_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-(2**70), 2**70)
    if kind == 3:
        return rng.uniform(-1e9, 1e9)
    if kind == 4:
        return "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 12)))
    if kind in (5, 6):
        return {
            rng.choice(["task", "id", "body", "properties", "x", ""]): json_value(rng, depth + 1)
            for _ in range(rng.randint(0, 4))
        }
    return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def task_envelope(rng: random.Random, n: int) -> dict[str, Any]:
    """A task message as kombu's Redis transport writes one, for a session that does not exist."""
    task = rng.choice([TASK_MODEL_TURN, TASK_TOOL_CALL, TASK_ADVANCE, "no.such.task"])
    body = json.dumps(
        [[f"raw-session-{n}", 1], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    )
    return {
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": task, "id": f"{TAG}-task-{n}", "root_id": f"{TAG}-task-{n}", "retries": 0},
        "properties": {
            "correlation_id": f"{TAG}-task-{n}",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": "lousho"},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": f"{TAG}-{n}",
        },
    }


def places(value: Any, depth: int = 0) -> list[tuple[dict[str, Any], str]]:
    """Each (mapping, key) in `value`, three levels down."""
    if not isinstance(value, dict) or depth >= 3:
        return []
    return [(value, key) for key in value] + [place for part in value.values() for place in places(part, depth + 1)]


def mutated(rng: random.Random, message: dict[str, Any]) -> dict[str, Any]:
    """`message` with one to three of its parts taken out or replaced by random JSON (or by a random body)."""
    for _ in range(rng.randint(1, 3)):
        if not (found := places(message)):
            break
        # Most of the time a part only Celery reads (kombu reads the rest): the headers, the body.
        celery_parts = [(part, key) for part, key in found if part is message.get("headers") or key == "body"]
        container, key = rng.choice(celery_parts if celery_parts and rng.random() < 0.7 else found)
        action = rng.random()
        if action < 0.3:
            del container[key]
        elif action < 0.5 and key == "body":
            container[key] = base64.b64encode(json.dumps(json_value(rng)).encode()).decode()
        else:
            container[key] = json_value(rng)
    return message


def raw_entry(rng: random.Random, n: int) -> bytes:
    kind = rng.random()
    if kind < 0.25:
        return rng.randbytes(rng.randint(0, 300))
    if kind < 0.35:
        return "".join(chr(rng.randint(1, 0x10FFFF)) for _ in range(rng.randint(0, 60))).encode(
            "utf-8", "surrogatepass"
        )
    if kind < 0.5:
        return json.dumps(json_value(rng)).encode()
    if kind < 0.52:
        return b"[" * 50_000 + b"]" * 50_000
    return json.dumps(mutated(rng, task_envelope(rng, n))).encode()


def no_kombu_message(entry: bytes) -> bool:
    """What kombu cannot read at all (the oracle, apart from the code under test): not a JSON object, or one
    without a properties object (decoded as kombu decodes: invalid UTF-8 replaced)."""
    try:
        value = json.loads(entry.decode(errors="replace"))
    except (ValueError, RecursionError):
        return True
    return not isinstance(value, dict) or not isinstance(value.get("properties"), dict)


@pytest.mark.timeout(pick(120, 600))
def test_raw_bytes_on_the_queue_are_taken_and_the_fleet_goes_on(chaos_fleet: ChaosFleet) -> None:
    fleet, rng = chaos_fleet, random.Random(SEED + 21)
    sessions = [f"rq{i:03d}" for i in range(SESSIONS)]
    scripts = {s: random_script(rng, s, gates=False, max_turns=2) for s in sessions}
    install_scripts(fleet, rng, scripts, model_delay=0.1)
    entries = [raw_entry(rng, n) for n in range(ENTRIES)]
    lists = [fleet.queue, f"{fleet.queue}\x06\x163"]  # kombu's list for priority 0, and one for priority 3
    workers = [fleet.start_worker() for _ in range(2)]
    pids = sorted(w.pid for w in workers)
    pushed: Counter[str] = Counter()
    remaining = list(entries)

    def push_some() -> None:
        for _ in range(min(len(remaining), rng.randint(1, 4))):
            target = rng.choice(lists)
            fleet.redis.lpush(target, remaining.pop())
            pushed["raw entries pushed" if target == fleet.queue else "raw entries pushed onto a priority list"] += 1

    started = time.monotonic()
    helpers = Background()
    helpers.every(0.03, push_some, "pusher")
    try:
        for session in sessions:
            fleet.client.enqueue("jobs", f"job {session}", session_id=session)
        deadline = started + pick(90, 500)
        while time.monotonic() < deadline and (remaining or settled_count(fleet, sessions) < len(sessions)):
            time.sleep(0.1)
        while time.monotonic() < deadline and sum(fleet.redis.llen(name) for name in lists):
            time.sleep(0.1)
        helpers.stop()
        elapsed = time.monotonic() - started
        violations, figures = check_sessions(fleet, scripts)
        violations += helpers.errors
        violations += entry_violations(fleet, entries, lists)
        if sorted(w.pid for w in fleet.alive()) != pids:
            violations.append(
                f"a worker died: pids {pids} at the start, {sorted(w.pid for w in fleet.alive())} alive at the end"
            )
        moved = len(fleet.redis.lrange(rejected_key(fleet.queue), 0, -1))
        figures.update({"moved aside": moved, "read by Celery (refused, or run as a task)": len(entries) - moved})
    finally:
        helpers.stop()
        fleet.redis.delete(rejected_key(fleet.queue))
    record(Row("raw bytes on the queue", len(entries), "raw entries", dict(pushed), violations, elapsed, dict(figures)))
    other_lines = [line for line in fleet.worker_logs().splitlines() if "is no task message" not in line]
    assert violations == [], "\n".join(violations[:30] + other_lines[-80:])


def entry_violations(fleet: ChaosFleet, entries: list[bytes], lists: list[str]) -> list[str]:
    """Every entry taken (off the lists, not among kombu's unacknowledged, never lost as a 'dropped
    connection'), each that is no kombu message moved aside, and only pushed entries in the rejected list."""
    problems = [f"{n} entries left on {name!r}" for name in lists if (n := fleet.redis.llen(name))]
    stuck = [tag for tag in fleet.redis.hkeys("unacked") if tag.decode().startswith(TAG)]
    if stuck:
        problems.append(f"{len(stuck)} entries stuck among kombu's unacknowledged messages: {stuck[:5]}")
    moved = Counter(fleet.redis.lrange(rejected_key(fleet.queue), 0, -1))
    unread = Counter(entry for entry in entries if no_kombu_message(entry))
    if missing := unread - moved:
        problems.append(f"{sum(missing.values())} entries kombu cannot read were not moved aside: {list(missing)[:3]}")
    if stranger := moved - Counter(entries):
        problems.append(f"the rejected list holds {sum(stranger.values())} entries nobody pushed: {list(stranger)[:3]}")
    for line in fleet.worker_logs().splitlines():
        if "Connection to broker lost" in line or "Unrecoverable error" in line or "Restoring" in line:
            problems.append(f"a worker log says: {line[:300]}")
    return problems
