"""The sessions dashboard (issue #19): `lousho dashboard`, or mounted in your own FastAPI app.

Needs the `dashboard` extra (`pip install 'lousho[dashboard]'`: FastAPI, Jinja2, python-multipart, uvicorn).
"""

from lousho.dashboard.app import create_dashboard, dashboard_router
from lousho.dashboard.views import DashboardContext

__all__ = ["DashboardContext", "create_dashboard", "dashboard_router"]
