"""For web apps and operators: the `Client` (enqueue, status, approvals, abort) and the reaper."""

from lousho.fleet.events import SessionEvent
from lousho.scheduler.client import Client, SessionStatus
from lousho.scheduler.events import EventFeed
from lousho.scheduler.reaper import reap_once, run_reaper

__all__ = ["Client", "EventFeed", "SessionEvent", "SessionStatus", "reap_once", "run_reaper"]
