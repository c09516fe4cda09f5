"""Commit: a tool call's result is committed once, whoever ran it (issue #30).

The results hash of a session keeps each call's one result (first writer wins), sealed by the store's codec.
A call's task commits its result and, in the same script, releases the call's lease and takes the session's to
fold it (`commit_call`, call_commit.lua: `begin.begin_step`'s reads included). A step commits a result it
decided itself (a preset result, an abort's 'cancelled') with `commit_result` (guarded.lua). When the call is
the last its turn waits for, the commit goes with the fold instead (`fold.py`).
"""

from __future__ import annotations

import json
import time
from typing import Any

from lousho.errors import SessionSupersededError
from lousho.stores.redis_common import redis_errors, text
from lousho.worker.begin import Begun, begin_parts, begun_from_reply
from lousho.worker.leases import Lease
from lousho.worker.scripts import FleetScripts

__all__ = ["commit_call", "commit_result", "committed_results", "turn_results"]


def commit_call(
    scripts: FleetScripts,
    session_id: str,
    committing: tuple[str, str, Lease],
    lease: Lease,
    run: tuple[str, str],
) -> Begun | None:
    """Commit the call's result (first writer wins), release its lease, then `begin_step` on `lease`.
    `committing`: the call's field, its result's JSON and its lease; `run`: the call's epoch and its entry in the
    running index. Raises `SessionSupersededError` when the session is another incarnation than that epoch now."""
    field, result_json, call_lease = committing
    keys, args, known = begin_parts(scripts, session_id, lease, "")
    commit_keys = [keys[4], call_lease.key, *keys[:4], *keys[5:], scripts.keys.running_of(session_id)]
    commit_args = [field, scripts.seal(session_id, field, result_json), call_lease.token, run[0], *args, run[1]]
    started = time.monotonic()
    store = scripts.store
    with redis_errors(scripts.client, f"commit the result of call {field!r} of session {session_id!r}"):
        reply, acked = store.replica_ack.run(scripts.client, scripts.call_commit, commit_keys, commit_args)
    call_lease.held = False
    if int(reply[0]) < 0:
        raise SessionSupersededError(session_id, f"the result of call {field!r}")
    # a result a failover may lose is not done: the step fails, the session's lease expires (issue #18)
    store.replica_ack.check(scripts.client, acked, f"the result of call {field!r} of session {session_id!r}")
    return begun_from_reply(scripts, session_id, (lease, ""), reply, started, known)


def commit_result(scripts: FleetScripts, session_id: str, epoch: str, field: str, result: Any) -> bool:
    """Commit a call's one result (first writer wins) while the session is incarnation `epoch`."""
    keys = [scripts.keys.epoch(session_id), scripts.keys.results(session_id)]
    args = [epoch, "commit", field, scripts.seal(session_id, field, json.dumps(result, default=str))]
    store = scripts.store
    with redis_errors(scripts.client, f"commit the result of call {field!r} of session {session_id!r}"):
        reply, acked = store.replica_ack.run(scripts.client, scripts.guarded, keys, args)
    store.replica_ack.check(scripts.client, acked, f"the result of call {field!r} of session {session_id!r}")
    return int(reply) == 1


def committed_results(scripts: FleetScripts, session_id: str) -> dict[str, bytes]:
    """The committed results hash as it is now (`turn_results` picks one turn's)."""
    with redis_errors(scripts.client, f"read the committed results of session {session_id!r}"):
        raw = scripts.client.hgetall(scripts.keys.results(session_id))
    return {text(field): scripts.unseal(session_id, field, value) for field, value in raw.items()}  # type: ignore[union-attr]


def turn_results(raw: dict[str, bytes], turn: int) -> dict[str, Any]:
    """The committed results of tool turn `turn` in the results hash `raw`, by call id."""
    prefix = f"{turn}:"
    return {field[len(prefix) :]: json.loads(value) for field, value in raw.items() if field.startswith(prefix)}
