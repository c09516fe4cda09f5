"""Approval pauses: the snapshot a paused run leaves, decisions, and the store contract.

A decision is recorded in the approval store *before* the run continues, so a
process that dies between the two leaves a decided approval that the next
`resume()` applies, instead of a session stuck waiting forever.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from lousho.checkpoint import Checkpoint
from lousho.errors import CorruptApprovalError, InvalidDecisionError
from lousho.fingerprint import AgentFingerprint
from lousho.messages import ToolCall

__all__ = [
    "ApprovalDecision",
    "ApprovalSnapshot",
    "ApprovalState",
    "ApprovalStore",
    "decode_snapshot",
    "parse_decision",
    "utc_now",
]

ApprovalState = Literal["pending", "approved", "rejected"]


def utc_now() -> str:
    return datetime.now(UTC).isoformat()


class ApprovalDecision(BaseModel):
    """A human's answer: `{"id": ..., "approved": bool, "note": str | None}`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: StrictStr
    approved: StrictBool
    """Exactly True or False: a lax "no" or 0 would be read as a decision nobody made (issue #21)."""
    note: StrictStr | None = None


def parse_decision(decision: ApprovalDecision | dict[str, Any]) -> ApprovalDecision:
    """The decision, checked; anything else raises `InvalidDecisionError` (every entry point, every store)."""
    if isinstance(decision, ApprovalDecision):
        return decision
    try:
        return ApprovalDecision.model_validate(decision)
    except ValidationError as exc:
        raise InvalidDecisionError(
            "a decision must be {'id': str, 'approved': True or False, 'note': str | None}; "
            f"got {decision!r:.300} ({exc.error_count()} problems)"
        ) from exc


class ApprovalSnapshot(BaseModel):
    """Everything needed to continue a run paused on one tool call, in any process."""

    model_config = ConfigDict(frozen=True)

    id: str
    session_id: str | None = None
    agent_name: str | None = None
    tool_call: ToolCall
    """The call waiting for a decision."""
    remaining_tool_calls: list[ToolCall] | None = None
    """Calls of the same turn after the paused one; None in snapshots written before the field existed."""
    checkpoint: Checkpoint
    """The run as it was when it paused (status 'awaiting-approval')."""
    fingerprint: AgentFingerprint | None = None
    max_steps: int | None = None
    status: ApprovalState = "pending"
    note: str | None = None
    created_at: str = Field(default_factory=utc_now)
    decided_at: str | None = None
    applied_at: str | None = None
    """When the decision's result was recorded in the run; a decided but unapplied approval
    (the process died in between) is applied by the next resume of its session."""
    child: ApprovalSnapshot | None = None
    """A sub-agent's own snapshot when the pause came from a sub-agent's tool call."""
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def waiting(self) -> ApprovalSnapshot:
        """The snapshot of the call that waits for the decision: the innermost sub-agent's when the
        pause came from a sub-agent (its tool call, arguments and session), else this one. Listings
        show it, naming this snapshot's session as its parent (issue #14)."""
        return self if self.child is None else self.child.waiting

    def for_session(self, session_id: str | None) -> ApprovalSnapshot | None:
        """The part of this snapshot that `session_id` paused on (this one, or a sub-agent's nested in
        it), carrying this snapshot's decision: a decision is recorded on the outermost snapshot, the one
        stored under the id, and each session of the chain applies it to its own part (issue #14)."""
        part: ApprovalSnapshot | None = self
        while part is not None and part.session_id != session_id:
            part = part.child
        if part is None or part is self:
            return part
        decision = {
            "status": self.status,
            "note": self.note,
            "decided_at": self.decided_at,
            "applied_at": self.applied_at,
        }
        return part.model_copy(update=decision)

    @property
    def decision(self) -> ApprovalDecision | None:
        if self.status == "pending":
            return None
        return ApprovalDecision(id=self.id, approved=self.status == "approved", note=self.note)


@runtime_checkable
class ApprovalStore(Protocol):
    """Where paused runs wait. Sync or async methods both work."""

    def save(self, snapshot: ApprovalSnapshot) -> Awaitable[None] | None:
        """Create or replace the snapshot under `snapshot.id`."""

    def load(self, approval_id: str) -> ApprovalSnapshot | Awaitable[ApprovalSnapshot | None] | None:
        """The snapshot, or None for an unknown id."""

    def decide(
        self, approval_id: str, approved: bool, note: str | None
    ) -> ApprovalSnapshot | Awaitable[ApprovalSnapshot]:
        """Atomically move a pending approval to approved/rejected and return it.

        Raises `ApprovalNotFoundError` for an unknown id and `ApprovalAlreadyResolvedError`
        when it was decided already, so a second caller can never run the tool again."""

    def reopen(self, approval_id: str) -> Awaitable[None] | None:
        """Put a decided approval back to pending (its decision could not be applied)."""

    def pending(self, session_id: str | None = None) -> list[ApprovalSnapshot] | Awaitable[list[ApprovalSnapshot]]:
        """Approvals still waiting for a decision, oldest first."""


def decode_snapshot(approval_id: str, raw: str | bytes) -> ApprovalSnapshot:
    """Read a stored snapshot, or raise `CorruptApprovalError` (the stored value is left as it is)."""
    try:
        return ApprovalSnapshot.model_validate_json(raw)
    except ValidationError as exc:
        raise CorruptApprovalError(
            f"the stored approval {approval_id!r} cannot be read ({exc.errors()[0]['msg']}); it was left as it is"
        ) from exc
