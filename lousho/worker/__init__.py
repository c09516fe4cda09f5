"""The fleet: each model turn and each tool call a Celery task; leases, heartbeats, fencing."""

from lousho.fleet.settings import FleetSettings, broker_url
from lousho.worker.app import create_app

__all__ = ["FleetSettings", "broker_url", "create_app"]
