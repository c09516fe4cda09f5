"""The fleet: each model turn and each tool call a Celery task; leases, heartbeats, fencing."""

from lousho.worker.app import create_app
from lousho.worker.config import FleetSettings, broker_url

__all__ = ["FleetSettings", "broker_url", "create_app"]
