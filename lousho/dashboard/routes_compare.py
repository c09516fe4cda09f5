"""Two sessions side by side, the first divergence highlighted (`compare_sessions`, as `lousho compare`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from lousho.dashboard.pages import Pages
from lousho.dashboard.routes_sessions import refused
from lousho.dashboard.views import DashboardContext
from lousho.errors import SDKError
from lousho.operations import compare_sessions
from lousho.operations.drift import describe_drift

__all__ = ["add_routes"]


def add_routes(router: APIRouter, ctx: DashboardContext, pages: Pages) -> None:
    @router.get("/compare", name="compare", response_class=HTMLResponse)
    def compare(request: Request, a: str = "", b: str = "") -> HTMLResponse:
        if not (a and b):
            return pages.render(request, "compare.html", a=a, b=b, comparison=None, steps=[])
        try:
            comparison = compare_sessions(ctx, a, b)
        except SDKError as exc:
            return refused(pages, request, exc)
        count = max(len(comparison.a), len(comparison.b))
        steps = [
            (
                n,
                comparison.a[n - 1] if n <= len(comparison.a) else None,
                comparison.b[n - 1] if n <= len(comparison.b) else None,
            )
            for n in range(1, count + 1)
        ]
        return pages.render(
            request,
            "compare.html",
            a=a,
            b=b,
            comparison=comparison,
            steps=steps,
            drift_lines=describe_drift(comparison.drift),  # the table shows the steps; this, what drifted (#32)
        )
