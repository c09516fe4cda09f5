"""Pending approvals and deciding them (issue #32): what `lousho approvals` / `lousho approve` and the
dashboard's approvals page show and do, one way.

A sub-agent's pause is shown by its innermost call, the one that waits (`ApprovalSnapshot.waiting`: the
sub-agent's `charge_card {"amount": 30}`, in its own session), naming the parent session paused on the
same id; the page showed the parent's `pay` call while the command showed the inner one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lousho.approvals import ApprovalDecision, ApprovalSnapshot, decide, parse_decision
from lousho.errors import InvalidDecisionError
from lousho.messages import ToolCall
from lousho.operations.target import Target, sync
from lousho.pausing import check_stored_calls_unchanged
from lousho.stores.listing import Listing

__all__ = ["Decided", "PendingApproval", "decide_approval", "parse_approval_decision", "pending_approvals"]


@dataclass(frozen=True)
class PendingApproval:
    """One pending approval, by the call that waits: the innermost sub-agent's when the pause came from one."""

    id: str
    session_id: str | None
    """The session of the call that waits (a sub-agent's own session when it is a sub-agent's call)."""
    parent_session_id: str | None
    """The outermost session paused on the same id, when that is another session (a sub-agent's pause)."""
    tool_call: ToolCall
    created_at: str
    kind: str
    snapshot: ApprovalSnapshot

    @classmethod
    def of(cls, snapshot: ApprovalSnapshot) -> PendingApproval:
        waiting = snapshot.waiting
        parent = snapshot.session_id if waiting is not snapshot else None
        return cls(
            id=snapshot.id,
            session_id=waiting.session_id,
            parent_session_id=parent,
            tool_call=waiting.tool_call,
            created_at=snapshot.created_at,
            kind=waiting.kind,
            snapshot=snapshot,
        )


def pending_approvals(target: Target, session_id: str | None = None) -> Listing[PendingApproval]:
    """Every pending approval (of one session when given: on a fleet a sub-agent's session finds those stored
    under its parent); `.skipped` names the unreadable ones."""
    if target.client is not None:
        snapshots = Listing.of(target.client.approvals(session_id))
    else:
        snapshots = Listing.of(sync(target.bundle.approvals.pending(session_id)))
    return Listing([PendingApproval.of(snapshot) for snapshot in snapshots], skipped=snapshots.skipped)


def pending_count(target: Target) -> int:
    """How many approvals are pending (the dashboard's navigation shows it)."""
    return len(Listing.of(sync(target.bundle.approvals.pending(None))))


def parse_approval_decision(
    approval_id: str, approved: bool, note: str | None, action: str | None, result: str | None
) -> ApprovalDecision:
    """A decision checked before anything is written: `result` (with action 'record') is JSON (issue #17)."""
    try:
        parsed = None if result is None else json.loads(result)
    except ValueError as exc:
        raise InvalidDecisionError(
            f"the result must be JSON (a string in quotes: '\"sent\"'); got {result!r:.200}"
        ) from exc
    return parse_decision({"id": approval_id, "approved": approved, "note": note, "action": action, "result": parsed})


@dataclass(frozen=True)
class Decided:
    """A recorded decision, and what happens next."""

    snapshot: ApprovalSnapshot
    then: str

    @property
    def summary(self) -> str:
        """One line: '<status> (<action>) <id> (<tool> of <session>): <what next>', by the call that waited."""
        waiting = self.snapshot.waiting
        answer = f" ({self.snapshot.action})" if self.snapshot.action else ""
        where = f"{waiting.tool_call.name} of {waiting.session_id}"
        return f"{self.snapshot.status}{answer} {self.snapshot.id} ({where}): {self.then}"


def decide_approval(
    target: Target,
    approval_id: str,
    *,
    approved: bool,
    note: str | None = None,
    action: str | None = None,
    result: str | None = None,
) -> Decided:
    """Approve or reject a paused call, or answer an interrupted one (`action` rerun / record with `result` as
    JSON / fail). On a fleet the run goes on at once (`Client.resolve_approval`); elsewhere the decision is
    recorded after checking that the call shown is the call that would run (issue #17), and the next resume
    of the session applies it."""
    decision = parse_approval_decision(approval_id, approved and action != "fail", note or None, action or None, result)
    if target.client is not None:
        snapshot = target.client.resolve_approval(
            approval_id, approved=decision.approved, note=decision.note, action=decision.action, result=decision.result
        )
        return Decided(snapshot, "the fleet continues the run")
    sync(check_stored_calls_unchanged(target.bundle.approvals, target.bundle.checkpoints, approval_id))
    stored: ApprovalSnapshot = sync(decide(target.bundle.approvals, decision))
    return Decided(stored, "the next resume of the session applies it")
