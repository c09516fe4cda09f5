"""Approval pauses: the snapshot a paused run leaves, decisions, and the store contract.

A decision is recorded in the approval store *before* the run continues, so a
process that dies between the two leaves a decided approval that the next
`resume()` applies, instead of a session stuck waiting forever.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictBool, StrictStr, ValidationError, model_validator

from lousho.checkpoint import Checkpoint
from lousho.errors import ApprovalCallChangedError, CorruptApprovalError, InvalidDecisionError
from lousho.fingerprint import AgentFingerprint
from lousho.formats import APPROVAL_SCHEMA_VERSION
from lousho.messages import ToolCall

__all__ = [
    "REOPENED",
    "ApprovalDecision",
    "ApprovalKind",
    "ApprovalSnapshot",
    "ApprovalState",
    "ApprovalStore",
    "approval_chain",
    "approval_snapshot",
    "call_digest",
    "check_call_unchanged",
    "check_calls_unchanged",
    "InterruptedAction",
    "decide",
    "decided_update",
    "decode_snapshot",
    "parse_decision",
    "utc_now",
]

ApprovalState = Literal["pending", "approved", "rejected"]
ApprovalKind = Literal["approval", "interrupted"]
"""'approval': a gated call waits to run; 'interrupted': a call that may have run when its run was
interrupted waits for a human to say what it did (`on_interrupted='ask'`, issue #17)."""
InterruptedAction = Literal["rerun", "record", "fail"]


def utc_now() -> str:
    return datetime.now(UTC).isoformat()


class ApprovalDecision(BaseModel):
    """A human's answer: `{"id": ..., "approved": bool, "note": str | None}`; for an interrupted-call
    approval also `action` ('rerun' or 'record' with approved=True, 'fail' with approved=False) and,
    with 'record', the `result` to record (issue #17)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: StrictStr
    approved: StrictBool
    """Exactly True or False: a lax "no" or 0 would be read as a decision nobody made (issue #21)."""
    note: StrictStr | None = None
    action: InterruptedAction | None = None
    """Only for an interrupted-call approval; None there means 'rerun' if approved, else 'fail'."""
    result: JsonValue = None
    """With action='record': the call's result, as the human typed it."""

    @model_validator(mode="after")
    def _action_fits(self) -> ApprovalDecision:
        if self.action in ("rerun", "record") and not self.approved:
            raise ValueError(f"action {self.action!r} needs approved=True")
        if self.action == "fail" and self.approved:
            raise ValueError("action 'fail' needs approved=False")
        if (self.action == "record") != (self.result is not None):
            raise ValueError("a result goes with action 'record', and only with it")
        return self


def parse_decision(decision: ApprovalDecision | dict[str, Any]) -> ApprovalDecision:
    """The decision, checked; anything else raises `InvalidDecisionError` (every entry point, every store)."""
    if isinstance(decision, ApprovalDecision):
        return decision
    try:
        return ApprovalDecision.model_validate(decision)
    except ValidationError as exc:
        raise InvalidDecisionError(
            "a decision must be {'id': str, 'approved': True or False, 'note': str | None} (and, for an "
            "interrupted call, 'action': 'rerun' | 'record' | 'fail' with 'result' for 'record'); "
            f"got {decision!r:.300} ({exc.error_count()} problems: {exc.errors()[0]['msg']})"
        ) from exc


class ApprovalSnapshot(BaseModel):
    """Everything needed to continue a run paused on one tool call, in any process."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = APPROVAL_SCHEMA_VERSION
    """Format of this record (issue #35; 0.1.0's snapshots have none: 1); a reader refuses a newer one."""
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
    call_digest: str | None = None
    """SHA-256 of the call shown to the human (tool, arguments, the agent fingerprint's digest): a decision
    is applied only to that call (`pausing.check_call_unchanged`). None in snapshots from before it (issue #17)."""
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
    kind: ApprovalKind = "approval"
    """'interrupted': the call may have run already; the decision says what it did (issue #17)."""
    action: InterruptedAction | None = None
    """An interrupted-call approval's decision: what the human chose (None: by `status`)."""
    result: JsonValue = None
    """With action 'record': the result the human typed."""

    @property
    def interrupted_action(self) -> InterruptedAction:
        """A decided interrupted-call approval's choice: its `action`, else 'rerun' if approved, else 'fail'."""
        return self.action or ("rerun" if self.status == "approved" else "fail")

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
            "action": self.action,
            "result": self.result,
        }
        return part.model_copy(update=decision)

    @property
    def decision(self) -> ApprovalDecision | None:
        if self.status == "pending":
            return None
        return ApprovalDecision(
            id=self.id, approved=self.status == "approved", note=self.note, action=self.action, result=self.result
        )


REOPENED: dict[str, Any] = {"status": "pending", "note": None, "decided_at": None, "action": None, "result": None}
"""What `ApprovalStore.reopen` puts back: no decision."""


def decided_update(
    snapshot: ApprovalSnapshot,
    approved: bool,
    note: str | None,
    action: InterruptedAction | None = None,
    result: Any = None,
) -> dict[str, Any]:
    """The fields `ApprovalStore.decide` changes on a pending snapshot. An `action` on an approval that
    is not an interrupted call's raises `InvalidDecisionError` before anything is written (issue #17)."""
    parse_decision({"id": snapshot.id, "approved": approved, "note": note, "action": action, "result": result})
    kind = snapshot.waiting.kind  # a sub-agent's interrupted call is nested in its parent's snapshot
    if action is not None and kind != "interrupted":
        raise InvalidDecisionError(
            f"approval {snapshot.id!r} is a {kind!r}, not an interrupted call: decide it with "
            "approved and note only ('action' and 'result' are for interrupted-call approvals)"
        )
    update = {"status": "approved" if approved else "rejected", "note": note, "decided_at": utc_now()}
    return {**update, "action": action, "result": result}


@runtime_checkable
class ApprovalStore(Protocol):
    """Where paused runs wait. Sync or async methods both work."""

    def save(self, snapshot: ApprovalSnapshot) -> Awaitable[None] | None:
        """Create or replace the snapshot under `snapshot.id`."""

    def load(self, approval_id: str) -> ApprovalSnapshot | Awaitable[ApprovalSnapshot | None] | None:
        """The snapshot, or None for an unknown id."""

    def decide(
        self,
        approval_id: str,
        approved: bool,
        note: str | None,
        action: InterruptedAction | None = None,
        result: Any = None,
    ) -> ApprovalSnapshot | Awaitable[ApprovalSnapshot]:
        """Atomically move a pending approval to approved/rejected and return it.

        Raises `ApprovalNotFoundError` for an unknown id and `ApprovalAlreadyResolvedError`
        when it was decided already, so a second caller can never run the tool again.
        `action` and `result` are passed only for an interrupted-call approval (callers leave them
        out otherwise); a store records them with `decided_update` (issue #17)."""

    def reopen(self, approval_id: str) -> Awaitable[None] | None:
        """Put a decided approval back to pending (its decision could not be applied)."""

    def pending(self, session_id: str | None = None) -> list[ApprovalSnapshot] | Awaitable[list[ApprovalSnapshot]]:
        """Approvals still waiting for a decision, oldest first."""


def decide(store: ApprovalStore, decision: ApprovalDecision) -> Any:
    """`store.decide(...)` for a checked decision: an interrupted call's `action` and `result` are passed
    only when given, so a store written before them still decides ordinary approvals (issue #17)."""
    if decision.action is None:
        return store.decide(decision.id, decision.approved, decision.note)
    return store.decide(decision.id, decision.approved, decision.note, action=decision.action, result=decision.result)


def decode_snapshot(approval_id: str, raw: str | bytes) -> ApprovalSnapshot:
    """Read a stored snapshot, or raise `CorruptApprovalError` (the stored value is left as it is)."""
    try:
        snapshot = ApprovalSnapshot.model_validate_json(raw)
    except ValidationError as exc:
        raise CorruptApprovalError(
            f"the stored approval {approval_id!r} cannot be read ({exc.errors()[0]['msg']}); it was left as it is"
        ) from exc
    if snapshot.schema_version > APPROVAL_SCHEMA_VERSION:  # written by a newer lousho (issue #35)
        raise CorruptApprovalError(
            f"the stored approval {approval_id!r} has schema version {snapshot.schema_version}, newer than this "
            f"lousho reads ({APPROVAL_SCHEMA_VERSION}); it was left as it is: upgrade lousho"
        )
    return snapshot


# -- approvals bound to the call shown (issue #17) ------------------------------------------------


def call_digest(call: ToolCall, fingerprint: AgentFingerprint | None) -> str:
    """SHA-256 of what the human is shown and approves: the tool, its arguments, and the agent (its
    fingerprint's digest) that asked for it. The call id is left out: it names the call, the rest is it."""
    shown = [call.name, call.arguments, fingerprint.digest if fingerprint is not None else None]
    return hashlib.sha256(json.dumps(shown, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def check_call_unchanged(snapshot: ApprovalSnapshot, checkpoint: Checkpoint | None) -> None:
    """Raise `ApprovalCallChangedError` when the call a decision would run is not the one shown: the
    snapshot's own call was changed after the pause, or the session's checkpoint (when it still waits on
    this approval) holds another call under that id. Snapshots from before the digest are not checked."""
    if snapshot.call_digest is None:
        return
    changed = []
    if call_digest(snapshot.tool_call, snapshot.fingerprint) != snapshot.call_digest:
        changed.append("the stored approval's call")
    if checkpoint is not None and checkpoint.approval_id == snapshot.id:
        current = {c.id: c for c in checkpoint.pending_tool_calls()}.get(snapshot.tool_call.id)
        if current is None or call_digest(current, checkpoint.fingerprint) != snapshot.call_digest:
            changed.append(f"session {snapshot.session_id!r}'s checkpoint")
    if changed:
        raise ApprovalCallChangedError(
            f"approval {snapshot.id!r} was shown for {snapshot.tool_call.name!r} with other arguments or another "
            f"agent than {' and '.join(changed)} now holds: nothing was decided or run; the session is as it was. "
            "Restore the checkpoint, or fork the session and let the run ask again for the call as it is now"
        )


def check_calls_unchanged(snapshot: ApprovalSnapshot, load: Callable[[str], Checkpoint | None]) -> None:
    """`check_call_unchanged` for the snapshot and each sub-agent's nested in it, against each session's
    stored checkpoint (`load(session_id)`): run before a decision is recorded, so a refused one records nothing."""
    for part in approval_chain(snapshot):
        check_call_unchanged(part, load(part.session_id) if part.session_id is not None else None)


def approval_chain(snapshot: ApprovalSnapshot) -> Iterator[ApprovalSnapshot]:
    """The snapshot, then each sub-agent's nested in it, outermost first."""
    part: ApprovalSnapshot | None = snapshot
    while part is not None:
        yield part
        part = part.child


def approval_snapshot(
    paused: Checkpoint,
    call: ToolCall,
    *,
    session_id: str | None,
    max_steps: int | None,
    child: ApprovalSnapshot | None,
    kind: ApprovalKind,
) -> ApprovalSnapshot:
    """The approval a session paused at `paused` ('awaiting-approval', stamped with its `approval_id`) waits on,
    for `call`: what `pause_for_approval` writes, and what the fleet writes again from the checkpoint when a
    Redis Cluster failover lost it (issue #18, `lousho.scheduler.approval_repair`); `lousho.pausing` saves it."""
    assert paused.approval_id is not None
    turn = paused.last_tool_turn()
    calls = turn[1].tool_calls if turn else []
    return ApprovalSnapshot(
        id=paused.approval_id,
        session_id=session_id,
        agent_name=paused.agent_name,
        tool_call=call,
        remaining_tool_calls=calls[[c.id for c in calls].index(call.id) + 1 :],
        checkpoint=paused,
        fingerprint=paused.fingerprint,
        call_digest=call_digest(call, paused.fingerprint),
        max_steps=max_steps,
        child=child,
        kind=kind,
    )
