"""What the dashboard's pages show that is the page's own: the transcript folded into turns, the fingerprint's
drift (issue #19). Every operation (listing, loading, history, approvals) is `lousho.operations`' (issue #32),
which `lousho` renders too; nothing here knows FastAPI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lousho.checkpoint import Checkpoint, HistoryEntry, child_session_id
from lousho.fingerprint import Drift, diff_fingerprints
from lousho.messages import Message
from lousho.operations import Target
from lousho.operations.sessions import STATUSES

__all__ = ["PAGE_ROWS", "STATUSES", "DashboardContext", "TranscriptTurn", "fingerprint_drift", "transcript_turns"]

PAGE_ROWS = 100
"""Sessions per page: each row reads its checkpoint, and the page's rows are read again at every poll."""


@dataclass(frozen=True)
class DashboardContext(Target):
    """What every page reads: the operations' `Target` (the store bundle, and on a fleet the `Client` that decides
    and wakes runs), and whether the dashboard only shows."""

    read_only: bool = False


@dataclass
class ShownCall:
    """A tool call beside its result (`has_result` False: none recorded yet)."""

    id: str
    name: str
    arguments: str
    result: str = ""
    has_result: bool = False
    sub_session: str | None = None
    """The sub-agent session this call runs (`<parent>.sub-<call id>`), when there is one."""


@dataclass
class TranscriptTurn:
    """One message of the transcript; an assistant turn carries its calls, each with its result."""

    index: int
    role: str
    content: str
    calls: list[ShownCall] = field(default_factory=list)


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False, default=str, sort_keys=True)


def transcript_turns(checkpoint: Checkpoint, sub_ids: set[str] | None = None) -> list[TranscriptTurn]:
    """The transcript as the session page shows it: tool messages folded into their calls' rows."""
    results = {m.tool_call_id: m for m in checkpoint.messages if m.role == "tool" and m.tool_call_id}
    subs = sub_ids or set()
    turns: list[TranscriptTurn] = []
    for index, message in enumerate(checkpoint.messages):
        if message.role == "tool" and message.tool_call_id in {c.id for t in turns for c in t.calls}:
            continue  # shown beside its call
        turns.append(TranscriptTurn(index=index, role=message.role, content=_content(message)))
        for call in message.tool_calls:
            shown = ShownCall(id=call.id, name=call.name, arguments=_json(call.arguments))
            answer = results.get(call.id)
            if answer is not None:
                shown.result, shown.has_result = _content(answer), True
            sub = child_session_id(checkpoint.session_id, call)  # as the sub-agent's run names its session
            shown.sub_session = sub if sub in subs else None
            turns[-1].calls.append(shown)
    return turns


def _content(message: Message) -> str:
    if message.role != "tool":
        return message.content or ""
    try:
        return _json(message.result())
    except (ValueError, TypeError):
        return message.content or ""


def fingerprint_drift(checkpoint: Checkpoint, history: list[HistoryEntry]) -> Drift | None:
    """How the agent's fingerprint changed since the session's oldest kept save (None: nothing to compare)."""
    oldest = next((e.checkpoint.fingerprint for e in reversed(history) if e.checkpoint.fingerprint), None)
    if oldest is None or checkpoint.fingerprint is None:
        return None
    return diff_fingerprints(oldest, checkpoint.fingerprint)
