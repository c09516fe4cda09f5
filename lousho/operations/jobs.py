"""Steering runs on the fleet (issue #32): enqueue (and wait), resume, abort; `lousho enqueue / resume / abort`
and the dashboard's buttons, one way. Each says what happened, including when nothing did."""

from __future__ import annotations

import time
from dataclasses import dataclass

from lousho.errors import OperationTimeoutError
from lousho.operations.target import Target, load_session
from lousho.scheduler.client import SessionStatus

__all__ = ["Aborted", "Resumed", "abort_session", "enqueue", "resume_session", "wait_until_settled"]

SETTLED = ("finished", "awaiting-approval", "parked")
"""The statuses `enqueue --wait` stops at: nothing runs until someone acts (or, finished, ever)."""


def enqueue(
    target: Target, agent: str, text: str, *, session_id: str | None = None, require_worker: bool = True
) -> str:
    """Enqueue a job on the fleet; its session id."""
    client = target.fleet_client("enqueue")
    return client.enqueue(agent, text, session_id=session_id, require_worker=require_worker)


def wait_until_settled(target: Target, session_id: str, *, timeout_s: float, poll_s: float = 0.1) -> SessionStatus:
    """The session's status once it settles (finished, awaiting approval, parked); `OperationTimeoutError`
    after `timeout_s` (the run goes on)."""
    client = target.fleet_client("waiting for a run")
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.status(session_id)
        if status.status in SETTLED:
            return status
        if time.monotonic() > deadline:
            raise OperationTimeoutError(
                f"{session_id} is still {status.status} after {timeout_s}s; it goes on: "
                f"`lousho show {session_id} --follow` to watch it"
            )
        time.sleep(poll_s)


@dataclass(frozen=True)
class Resumed:
    session_id: str
    resumed: bool
    """False: nothing was pending (a finished session, one awaiting approval); nothing was sent."""
    message: str


def resume_session(target: Target, session_id: str) -> Resumed:
    """Wake the fleet on a parked, aborted or forked session. A finished session, or one that waits on an
    approval, has nothing to resume: nothing is sent, and the answer says so (issue #32)."""
    client = target.fleet_client("resume")
    checkpoint = load_session(target, session_id)
    if checkpoint.status == "finished":
        message = f"{session_id} is finished: nothing to resume, nothing changed (fork it to run it again)"
        return Resumed(session_id, False, message)
    if checkpoint.status == "awaiting-approval":
        approval = checkpoint.approval_id
        message = f"{session_id} is awaiting approval {approval}: nothing to resume; `lousho approve {approval}`"
        return Resumed(session_id, False, message)
    client.resume(session_id)
    return Resumed(session_id, True, f"resumed {session_id}: the fleet runs it now")


@dataclass(frozen=True)
class Aborted:
    session_id: str
    aborted: bool
    message: str


def abort_session(target: Target, session_id: str) -> Aborted:
    """Abort a run on the fleet: the running tool sees its signal, unfinished calls get 'cancelled'."""
    client = target.fleet_client("abort")
    checkpoint = load_session(target, session_id)
    if checkpoint.status == "awaiting-approval":  # no run to stop: it waits on a human, and goes on waiting
        approval = checkpoint.approval_id
        return Aborted(
            session_id,
            False,
            f"{session_id} is awaiting approval {approval}: no run to abort, nothing changed; it stays awaiting "
            f"approval until `lousho approve {approval}` (or `lousho approve {approval} --reject`)",
        )
    if not client.abort(session_id):
        return Aborted(session_id, False, f"{session_id} has no run to abort (it is finished): nothing changed")
    return Aborted(
        session_id,
        True,
        f"aborted {session_id}: it stays in-progress and idle until new input or `lousho resume {session_id}`",
    )
