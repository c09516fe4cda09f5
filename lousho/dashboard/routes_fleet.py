"""The fleet page: workers by name, queues, in-flight sessions and leases, running calls, parked sessions
(issue #19), from `lousho.operations.fleet_status` (issue #32)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from lousho.dashboard.pages import Pages
from lousho.dashboard.routes_sessions import refused
from lousho.dashboard.views import DashboardContext
from lousho.errors import SDKError
from lousho.operations import fleet_status

__all__ = ["add_routes"]


def add_routes(router: APIRouter, ctx: DashboardContext, pages: Pages) -> None:
    @router.get("/fleet", name="fleet", response_class=HTMLResponse)
    def fleet(request: Request) -> HTMLResponse:
        try:
            view = fleet_status(ctx)
        except SDKError as exc:
            return refused(pages, request, exc)
        return pages.render(request, "fleet.html", view=view)
