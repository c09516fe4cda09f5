"""Rendering the dashboard's templates (Jinja2, autoescaped), with what every page needs (issue #19)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from lousho.dashboard.security import CSRF_FIELD, csrf_token, remember_token, take_flash
from lousho.dashboard.views import DashboardContext

__all__ = ["Pages", "age_text"]

TEMPLATES = Path(__file__).parent / "templates"


class Pages:
    """Renders a template with the request, the CSRF token, and whether the dashboard is read-only."""

    def __init__(self, ctx: DashboardContext) -> None:
        self.ctx = ctx
        self.templates = Jinja2Templates(directory=str(TEMPLATES))
        self.templates.env.filters["age"] = age_text

    def render(self, request: Request, template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        context = {
            "csrf_field": CSRF_FIELD,
            "csrf_token": csrf_token(request),
            "read_only": self.ctx.read_only,
            "on_fleet": self.ctx.fleet_store is not None,
            "can_run": self.ctx.client is not None and not self.ctx.read_only,
            "note": take_flash(request),  # what the last POST did: signed by the server, never from the URL
            **values,
        }
        response = self.templates.TemplateResponse(request, template, context, status_code=status_code)
        remember_token(request, response)
        return response

    def error(self, request: Request, status_code: int, message: str) -> HTMLResponse:
        return self.render(request, "error.html", status_code=status_code, message=message)


def age_text(iso_time: str, now: datetime | None = None) -> str:
    """How long ago an ISO 8601 time was, for a person: '42 s', '5 min', '3 h', '2 d' ('?' if unreadable)."""
    try:
        then = datetime.fromisoformat(iso_time)
    except (TypeError, ValueError):
        return "?"
    then = then if then.tzinfo else then.replace(tzinfo=UTC)
    seconds = max(0.0, ((now or datetime.now(UTC)) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"
