"""The operations layer (issue #32): every operation the `lousho` command and the dashboard offer, once.

Each takes a `Target` (a store bundle, and on a fleet its `Client`) and returns plain typed results; the CLI
renders them as tables or JSON, the dashboard as pages. Neither front end holds operation logic of its own,
and neither imports the other (import contracts in pyproject.toml).

- sessions: `list_sessions`, `show_session`, `session_history`, `compare_sessions`, `delete_sessions`,
  `prune_sessions`
- liveness: `live_sessions` (whether a worker is running a session, and why: a `LiveReason`)
- approvals: `pending_approvals`, `pending_count`, `decide_approval`
- forking: `fork` (a `ForkRequest`), `start_session`
- jobs: `enqueue`, `wait_until_settled`, `resume_session`, `abort_session`
- fleet: `fleet_status`, `live_workers`
- drift: `drift_report`
- reseal: `reseal_sessions` (issue #31)
- events: `session_events`, `latest_event_id`, `describe_event` (issue #34)
"""

from __future__ import annotations

from lousho.operations.approvals import Decided, PendingApproval, decide_approval, pending_approvals, pending_count
from lousho.operations.drift import DriftReport, drift_report
from lousho.operations.events import describe_event, latest_event_id, session_events
from lousho.operations.fleet import FleetView, fleet_status, live_workers
from lousho.operations.forking import Forked, ForkRequest, fork, start_session
from lousho.operations.jobs import Aborted, Resumed, abort_session, enqueue, resume_session, wait_until_settled
from lousho.operations.liveness import LiveReason, live_sessions
from lousho.operations.reseal import ResealedSessions, reseal_sessions
from lousho.operations.sessions import (
    STATUSES,
    Deleted,
    SessionPage,
    SessionRow,
    SessionView,
    compare_sessions,
    delete_sessions,
    list_sessions,
    prune_sessions,
    session_history,
    show_session,
)
from lousho.operations.target import Target, load_session, open_target, sync
from lousho.operations.text import age_text, parse_age, short, time_text

__all__ = [
    "STATUSES",
    "Aborted",
    "Decided",
    "Deleted",
    "DriftReport",
    "FleetView",
    "LiveReason",
    "ForkRequest",
    "Forked",
    "PendingApproval",
    "ResealedSessions",
    "Resumed",
    "SessionPage",
    "SessionRow",
    "SessionView",
    "Target",
    "abort_session",
    "age_text",
    "compare_sessions",
    "decide_approval",
    "delete_sessions",
    "describe_event",
    "drift_report",
    "enqueue",
    "fleet_status",
    "fork",
    "list_sessions",
    "live_sessions",
    "latest_event_id",
    "live_workers",
    "load_session",
    "open_target",
    "parse_age",
    "pending_approvals",
    "pending_count",
    "prune_sessions",
    "reseal_sessions",
    "resume_session",
    "session_events",
    "session_history",
    "short",
    "show_session",
    "start_session",
    "sync",
    "time_text",
    "wait_until_settled",
]
