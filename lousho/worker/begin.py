"""Begin: a step takes its lease and reads everything it needs, in one script (issue #30).

A session's step (`begin_step`, open_step.lua): the session's lease taken, the model turn's start counted, and at
the same moment the parked and abort marks, the committed results, the checkpoint (only its head when this process
holds the transcript already) and the session's epoch read. A tool call's task (`begin_call`, call_begin.lua): the
checkpoint, the abort flag and the epoch read and, unless the call's result is committed, the call's lease taken
and its start counted. A damaged checkpoint is handed back untouched: what the begin counted is taken back.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass
from typing import Any, cast

from lousho.backoff import jittered_s
from lousho.checkpoint import Checkpoint
from lousho.errors import CorruptCheckpointError
from lousho.stores.redis_common import redis_errors, text
from lousho.stores.segments import Known
from lousho.worker.leases import Lease
from lousho.worker.scripts import FleetScripts

__all__ = ["Begun", "CallBegun", "CallState", "begin_call", "begin_step", "begin_when_free", "undo_call"]


@dataclass(frozen=True)
class Begun:
    """What a step read as it took the session's lease (one script, so all of it at one moment)."""

    parked: bool
    aborted: bool
    attempts: int
    """Starts of the model turn counted with the lease (0 when none was)."""
    results: dict[str, bytes]
    """The committed results hash, field -> JSON (`commit.turn_results` picks one turn's)."""
    checkpoint: Checkpoint | None
    epoch: str
    """The session's incarnation (epoch.lua): every later write of the step checks it is still this."""


class CallState(enum.Enum):
    """Where a tool call's task finds the call as it tries the call's lease (call_begin.lua)."""

    COMMITTED = "committed"
    """Its result is committed already: only the fold may be left to do."""
    BUSY = "busy"
    """Someone else holds its lease: it runs elsewhere."""
    STARTED = "started"
    """The lease is ours and this start is counted: run it."""


@dataclass(frozen=True)
class CallBegun:
    """What a tool call's task read as it tried the call's lease (`begin_call`)."""

    state: CallState
    starts: int
    """With `STARTED`: the starts counted against the call, this one included (poison detection)."""
    aborted: bool
    checkpoint: Checkpoint | None
    epoch: str
    """The session's incarnation as the call began (epoch.lua)."""
    shared: int = 0
    """Starts of the call whose run died together with other sessions' runs (not counted in `starts`)."""


def begin_step(scripts: FleetScripts, session_id: str, lease: Lease, attempt_field: str = "") -> Begun | None:
    """Take the session's lease and read the step's state; None when someone else holds it."""
    keys, args, known = begin_parts(scripts, session_id, lease, attempt_field)
    started = time.monotonic()
    with redis_errors(scripts.client, f"take the lease of session {session_id!r}"):
        reply = scripts.open_step(keys=keys, args=args)
    return begun_from_reply(scripts, session_id, (lease, attempt_field), reply, started, known)


LEASE_POLL_S = 0.02
"""How often a step that waits for the session's lease tries again (and up to half that again)."""


async def begin_when_free(scripts: FleetScripts, session_id: str, lease: Lease, wait_s: float) -> Begun | None:
    """`begin_step`, waiting up to `wait_s` while another step holds the lease; None when it stays busy (the
    caller sends its task again)."""
    deadline = time.monotonic() + wait_s
    while (begun := begin_step(scripts, session_id, lease)) is None:
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(jittered_s(floor_s=LEASE_POLL_S))  # steps that wait together look apart
    return begun


def begin_call(scripts: FleetScripts, session_id: str, field: str, lease: Lease, entry: str) -> CallBegun:
    """Read the checkpoint and the abort flag; unless the call's result is committed, take the
    call's lease and count this start. A damaged checkpoint is handed back untouched."""
    reader = scripts.store.checkpoints.reader
    known = reader.cached(session_id)
    keys = [
        scripts.keys.results(session_id),
        lease.key,
        scripts.keys.attempts(session_id),
        scripts.keys.abort(session_id),
        *reader.read_keys(session_id),
        scripts.keys.epoch(session_id),
        scripts.keys.running_of(session_id),
    ]
    args: list[str | int] = [field, lease.token, lease.ttl_ms, known.writer if known else "", entry, scripts.expiring]
    started = time.monotonic()
    with redis_errors(scripts.client, f"take the lease of call {field!r} of session {session_id!r}"):
        reply = scripts.call_begin(keys=keys, args=args)
    starts, epoch = int(reply[0]), text(reply[3])
    state = CallState.STARTED if starts > 0 else CallState.BUSY if starts == 0 else CallState.COMMITTED
    lease.held, lease.confirmed_at = state is CallState.STARTED, started
    if lease.held:  # the lease's token names the incarnation it is held for (call_begin.lua)
        lease.token = f"{lease.token}@{epoch}"
    try:
        checkpoint = reader.from_reply(session_id, reply[2], known)
    except CorruptCheckpointError:
        undo_call(scripts, session_id, field, lease, (epoch, entry))
        raise
    return CallBegun(state, max(starts, 0), bool(reply[1]), checkpoint, epoch, shared=int(reply[4]))


def undo_call(scripts: FleetScripts, session_id: str, field: str, lease: Lease, run: tuple[str, str]) -> None:
    """Take back `begin_call` (the call does not run after all: recorded, stale, not approved).
    `run`: the call's epoch and its entry in the running index."""
    if lease.held:
        scripts.count(session_id, run[0], f"call:{field}", -1)
        scripts.leave_running(run[1])
        lease.release()


def begin_parts(
    scripts: FleetScripts, session_id: str, lease: Lease, attempt_field: str
) -> tuple[list[str], list[Any], Known | None]:
    """open_step.lua's KEYS and ARGV (call_commit.lua takes them too), and the cached save whose writer id
    they name."""
    reader = scripts.store.checkpoints.reader
    known = reader.cached(session_id)
    keys = [
        lease.key,
        scripts.keys.parked_of(session_id),
        scripts.keys.abort(session_id),
        scripts.keys.attempts(session_id),
        scripts.keys.results(session_id),
        *reader.read_keys(session_id),
        scripts.keys.epoch(session_id),
    ]
    args = [lease.token, lease.ttl_ms, session_id, attempt_field, known.writer if known else "", scripts.expiring]
    return keys, args, known


def begun_from_reply(
    scripts: FleetScripts,
    session_id: str,
    taking: tuple[Lease, str],
    reply: list[Any],
    started: float,
    known: Known | None,
) -> Begun | None:
    """begin_step.lua's reply, typed. `taking`: the lease it took and the start it counted ('' for none), given
    back when the checkpoint it read is damaged."""
    lease, attempt_field = taking
    if not reply[0]:
        return None
    lease.held, lease.confirmed_at = True, started
    try:
        flat = reply[4]
        return Begun(
            parked=bool(reply[1]),
            aborted=bool(reply[2]),
            attempts=int(reply[3]),
            results={text(flat[i]): scripts.unseal(session_id, flat[i], flat[i + 1]) for i in range(0, len(flat), 2)},
            checkpoint=scripts.store.checkpoints.reader.from_reply(session_id, reply[5], known),
            epoch=text(reply[6]),
        )
    except CorruptCheckpointError:
        _undo_begin(scripts, session_id, lease, attempt_field)
        raise


def _undo_begin(scripts: FleetScripts, session_id: str, lease: Lease, attempt_field: str) -> None:
    """A damaged checkpoint is left exactly as it was, its session's keys included: the start
    counted with the lease is taken back (no turn started), and the lease released."""
    if attempt_field:
        key = scripts.keys.attempts(session_id)
        with redis_errors(scripts.client, f"take back a start counted for {attempt_field!r} of {session_id!r}"):
            if int(cast(int, scripts.client.hincrby(key, attempt_field, -1))) <= 0:
                scripts.client.hdel(key, attempt_field)
    lease.release()
