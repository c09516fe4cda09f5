"""Rendering the dashboard's templates (Jinja2, autoescaped), with what every page needs (issue #19)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from lousho.dashboard.security import CSRF_FIELD, csrf_token, remember_token, take_flash
from lousho.dashboard.views import DashboardContext
from lousho.errors import SDKError
from lousho.operations import age_text, pending_count, short, time_text

__all__ = ["Pages"]

TEMPLATES = Path(__file__).parent / "templates"


class Pages:
    """Renders a template with the request, the CSRF token, and whether the dashboard is read-only."""

    def __init__(self, ctx: DashboardContext) -> None:
        self.ctx = ctx
        self.templates = Jinja2Templates(directory=str(TEMPLATES))
        self.templates.env.filters["age"] = age_text
        self.templates.env.filters["short"] = short
        self.templates.env.filters["time"] = time_text

    def render(
        self, request: Request, template: str, status_code: int = 200, *, partial: bool = False, **values: Any
    ) -> HTMLResponse:
        """`template` as an answer. `partial`: a fragment a live page polls for (its rows), not a page a person
        sees: it leaves the flash message for the next full page (issue #32: a 2 s poll used to take it first)."""
        context = {
            "csrf_field": CSRF_FIELD,
            "csrf_token": csrf_token(request),
            "read_only": self.ctx.read_only,
            "on_fleet": self.ctx.fleet_store is not None,
            "can_run": self.ctx.client is not None and not self.ctx.read_only,
            "note": None if partial else take_flash(request),  # what the last POST did: signed, never from the URL
            "pending_count": self._pending_count(),
            **values,
        }
        response = self.templates.TemplateResponse(request, template, context, status_code=status_code)
        remember_token(request, response)
        return response

    def _pending_count(self) -> int | None:
        """The navigation's count of pending approvals (None when the store cannot say: the page still shows)."""
        try:
            return pending_count(self.ctx)
        except SDKError:
            return None

    def error(self, request: Request, status_code: int, message: str) -> HTMLResponse:
        return self.render(request, "error.html", status_code=status_code, message=message)
