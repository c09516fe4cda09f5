"""The fleet: each model turn and each tool call a Celery task; leases, heartbeats, fencing."""

from lousho.fleet.limits import FleetLimits, RateLimit
from lousho.fleet.settings import FleetSettings, broker_url
from lousho.worker.app import create_app

__all__ = ["FleetLimits", "FleetSettings", "RateLimit", "broker_url", "create_app"]
