"""The reaper's repair of approval records a Redis Cluster failover lost in part (issue #18).

A paused session's approval is several writes in different slots, maybe on different primaries: the
approval `<prefix>approval:<id>` with its entry in the pending index's shard of that slot, the paused
checkpoint `<prefix>{<session>}:cp`, and later the decision's result folded into the checkpoint and the
approval's "applied" mark. Replication is asynchronous, so a failover can lose one and keep the others;
the session would then wait for ever in one of four ways, each repaired here from the checkpoint, which
holds what the approval needs (the call it paused on, the approval id; `pausing.approval_snapshot`):

- `lost`: the approval is gone: it is written again, pending, as the pause wrote it (a sub-agent's chain
  with each session's part, rebuilt from each session's checkpoint);
- `unlisted`: it is pending but its pending-index entry is gone (no listing shows it): written again
  as it is, which puts the entry back;
- `unapplied`: it is decided and marked applied, but the checkpoint still waits on it (the save that
  recorded the decision's result is gone): the mark is taken back and the session sent to a worker,
  which applies the decision again (see `_reopen_applied_mark` for why not ask the human again). For a
  sub-agent's approval, the session sent is the parent when it still waits on it (it hands the decision
  on again), else the sub-agent, which its parent's save outlived;
- `undelivered`: it is decided, not applied, and the session is out of the in-flight index: `resolve_approval`
  writes the decision, then puts the session back in the index, two writes in different slots; a failover
  between them (or one that lost the second) left a decision no worker will ever be sent to apply, and a
  human who tries again is told it is decided already. The session is put back in the index, due now.

Paused sessions are out of the in-flight index and no index lists them by status, so finding them costs a
`SCAN` of the store's session heads (`RedisCheckpointStore.sessions`): a pass does it once every
`FleetSettings.approval_repair_interval_s` (30 s by default), not on each reaper pass, and reads only the
paused sessions' records after that: `lousho reaper` on its first pass and then every that many seconds of
passes (`repair_on_pass`), the Celery beat task `lousho.reap` on the pass that falls at the start of each such
window of the Redis clock (`repair_if_due`). Each write is a transaction that checks what it read (WATCH), so
several reapers at once, or a human deciding meanwhile, are harmless; no reaper lock is needed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, cast

from lousho.approvals import ApprovalSnapshot, approval_snapshot
from lousho.checkpoint import Checkpoint, child_session_id
from lousho.errors import SDKError, StoreUnavailableError
from lousho.fleet.inflight import InflightIndex
from lousho.fleet.keys import FleetKeys
from lousho.fleet.settings import FleetSettings
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors

__all__ = ["Repair", "RepairedApproval", "repair_approval_records", "repair_if_due", "repair_on_pass"]

log = logging.getLogger("lousho.reaper")

Repair = Literal["lost", "unlisted", "unapplied", "undelivered"]


@dataclass(frozen=True)
class RepairedApproval:
    session_id: str
    approval_id: str
    repair: Repair


def repair_on_pass(store: RedisStore, settings: FleetSettings, pass_number: int) -> list[RepairedApproval]:
    """`repair_approval_records` on the first reaper pass and then once every `approval_repair_interval_s`
    (counted in passes of `reaper_interval_s`); 0 turns it off. What `run_reaper` calls on each pass."""
    if settings.approval_repair_interval_s <= 0:
        return []
    every = max(1, math.ceil(settings.approval_repair_interval_s / settings.reaper_interval_s))
    return repair_approval_records(store, settings) if (pass_number - 1) % every == 0 else []


def repair_if_due(store: RedisStore, settings: FleetSettings, now_ms: int | None = None) -> list[RepairedApproval]:
    """For a reaper that keeps no pass count (the Celery beat task `lousho.reap`, a pass each `reaper_interval_s`
    in a worker): `repair_approval_records` when the Redis server's time falls in the first `reaper_interval_s`
    of a window of `approval_repair_interval_s`, so about one pass in each window runs it. 0 turns it off."""
    if settings.approval_repair_interval_s <= 0:
        return []
    if now_ms is None:
        now_ms = InflightIndex.of(store, settings.lease_ttl_ms).server_time_ms()
    window_ms = max(1, round(settings.approval_repair_interval_s * 1000))
    if now_ms % window_ms >= round(settings.reaper_interval_s * 1000):
        return []
    return repair_approval_records(store, settings)


def repair_approval_records(store: RedisStore, settings: FleetSettings) -> list[RepairedApproval]:
    """Write again every paused session's approval record a failover lost in part; what was repaired."""
    repaired = []
    for session_id in store.checkpoints.sessions(status="awaiting-approval"):
        try:
            found = _repair_session(store, settings, session_id)
        except StoreUnavailableError:
            raise  # the whole pass fails and is retried (run_reaper)
        except SDKError as exc:  # a damaged record is left as it is; the others are still repaired
            log.warning("approval repair: session %r left as it is: %s", session_id, exc)
            continue
        if found is not None:
            repaired.append(found)
    if repaired:
        log.warning(
            "approval repair: %d record(s) a failover lost in part written again: %s",
            len(repaired),
            ", ".join(f"{r.session_id} ({r.repair})" for r in repaired[:20]),
        )
    return repaired


def _repair_session(store: RedisStore, settings: FleetSettings, session_id: str) -> RepairedApproval | None:
    keys = FleetKeys(store)
    paused = _paused(store, session_id)
    if paused is None or paused.approval_id is None:
        return None
    approval_id = paused.approval_id
    with redis_errors(store.client, f"read the approval record of {session_id!r}"):
        if store.client.exists(keys.lease(session_id)):
            return None  # a worker is on it now: what it saves next is the record's truth
        pipe = store.client.pipeline(transaction=False)  # the approval and its index entry share a slot
        pipe.exists(store.keys.approval(approval_id))
        pipe.zscore(store.keys.pending_approvals_of(approval_id), approval_id)
        exists, score = cast(list[int | float | None], pipe.execute())
        in_flight = store.client.zscore(store.keys.inflight_of(session_id), session_id) is not None
    if _parent_waits_on(store, paused):
        return None  # a sub-agent's approval is stored as its parent's snapshot: repaired from the parent
    if not exists:
        rebuilt = _rebuild(store, keys, paused)
        if rebuilt is None:
            return None
        written = store.approvals.rewrite(
            approval_id, _only_if(lambda stored: stored is None, lambda _: rebuilt), action="write a lost approval"
        )
        return _done(session_id, approval_id, "lost", written)
    stored = store.approvals.load(approval_id)
    if stored is None or stored.for_session(session_id) is None:
        return None
    outer = stored.session_id == session_id  # else a sub-agent's part, and its parent no longer waits on it
    if outer and stored.status == "pending" and score is None:
        written = store.approvals.rewrite(
            approval_id,
            _only_if(lambda s: s is not None and s.status == "pending", lambda s: s),
            action="list an unlisted approval",
        )
        return _done(session_id, approval_id, "unlisted", written)
    if stored.status != "pending" and stored.applied_at is not None:
        if _paused(store, session_id) != paused:  # read after the mark: a worker that recorded it moved on
            return None
        return _reopen_applied_mark(store, settings, paused, stored)
    if outer and stored.status != "pending" and stored.applied_at is None and not in_flight:
        _due_now(store, settings, session_id)
        return RepairedApproval(session_id, approval_id, "undelivered")
    return None


def _reopen_applied_mark(
    store: RedisStore, settings: FleetSettings, paused: Checkpoint, stored: ApprovalSnapshot
) -> RepairedApproval | None:
    """The decision is in the approval, marked applied, but the checkpoint's save of its result is gone.

    Issue #18: the decision is kept and applied again, rather than the approval reopened for the human. The
    human decided once and the record still says what; asking again could get another answer for a call
    that may have run already (an approved call that ran, then "rejected"). So the applied mark, which
    here claims what the run does not hold, is taken back and the session sent to a worker, which applies
    the decision as after a crash: a committed result of the call is folded in as it is; without one, the
    approved call runs again with the same `tool_call_id` (the idempotency key, as for any call a crash
    interrupted). "A decision is used once" still holds: `decide` refuses a second decision, the run records
    this one's result once, and the worker checks again that the call is the one shown (`call_digest`,
    `ApprovalCallChangedError`) before it applies it."""
    approval_id, session_id = stored.id, paused.session_id
    written = store.approvals.rewrite(
        approval_id,
        _only_if(
            lambda s: s is not None and s.status != "pending" and s.applied_at is not None,
            lambda s: s.model_copy(update={"applied_at": None}),
        ),
        action="take back an applied mark the run does not hold",
    )
    if written is None:
        return None
    _due_now(store, settings, session_id)
    return RepairedApproval(session_id, approval_id, "unapplied")


def _due_now(store: RedisStore, settings: FleetSettings, session_id: str) -> None:
    """Put the session in the in-flight index due now (a deadline just past: `due` reads those strictly before
    now), so the reaper pass that follows sends it to a worker; as after `resolve_approval`, the index also
    retries a message that is lost. Twice is harmless: the worker that holds the session's lease applies it."""
    inflight = InflightIndex.of(store, settings.lease_ttl_ms)
    inflight.touch(session_id, inflight.server_time_ms() - 1)


def _rebuild(store: RedisStore, keys: FleetKeys, paused: Checkpoint) -> ApprovalSnapshot | None:
    """The snapshot the session's pause wrote, from its checkpoint: the call it paused on is the first
    without a result (a pause happens only there); a sub-agent's part nested, from the child's checkpoint."""
    pending = paused.pending_tool_calls()
    if not pending:
        return None
    call = pending[0]
    child_cp = _paused(store, child_session_id(paused.session_id, call))
    child = None
    if child_cp is not None and child_cp.approval_id == paused.approval_id:
        child = _rebuild(store, keys, child_cp)
    interrupted = call.id in paused.started_calls or keys.has_interrupted_mark(paused, call)
    return approval_snapshot(
        paused,
        call,
        session_id=paused.session_id,
        max_steps=None,  # not in the checkpoint: the resume takes the agent's own
        child=child,
        kind="interrupted" if interrupted else "approval",
    )


def _paused(store: RedisStore, session_id: str) -> Checkpoint | None:
    checkpoint = store.checkpoints.load(session_id)
    return checkpoint if checkpoint is not None and checkpoint.status == "awaiting-approval" else None


def _parent_waits_on(store: RedisStore, paused: Checkpoint) -> bool:
    if paused.parent_session_id is None:
        return False
    parent = _paused(store, paused.parent_session_id)
    return parent is not None and parent.approval_id == paused.approval_id


def _only_if(
    holds: Callable[[ApprovalSnapshot | None], bool], write: Callable[[ApprovalSnapshot], ApprovalSnapshot]
) -> Callable[[ApprovalSnapshot | None], ApprovalSnapshot | None]:
    """A `rewrite` change that writes only while what it found still is the loss it repairs."""

    def change(stored: ApprovalSnapshot | None) -> ApprovalSnapshot | None:
        if not holds(stored):
            return None
        return write(cast(ApprovalSnapshot, stored))

    return change


def _done(
    session_id: str, approval_id: str, repair: Repair, written: ApprovalSnapshot | None
) -> RepairedApproval | None:
    return None if written is None else RepairedApproval(session_id, approval_id, repair)
