"""Pending approvals, approved or rejected from the page with a note (issue #19)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from lousho.dashboard.actions import decide_approval
from lousho.dashboard.pages import Pages
from lousho.dashboard.routes_sessions import refused
from lousho.dashboard.security import check_post, flash
from lousho.dashboard.views import DashboardContext, pending_approvals
from lousho.errors import SDKError

__all__ = ["add_routes"]


def add_routes(router: APIRouter, ctx: DashboardContext, pages: Pages) -> None:
    @router.get("/approvals", name="approvals", response_class=HTMLResponse)
    def approvals(request: Request) -> HTMLResponse:
        try:
            pending = pending_approvals(ctx)
        except SDKError as exc:
            return refused(pages, request, exc)
        return pages.render(request, "approvals.html", pending=pending, skipped=pending.skipped)

    @router.post("/approvals/{approval_id}", name="decide")
    async def decide(request: Request, approval_id: str) -> Response:
        await check_post(request, read_only=ctx.read_only)
        form = await request.form()
        approved = form.get("decision") == "approve"
        answer = {name: str(form.get(name) or "") or None for name in ("note", "action", "result")}
        if answer["action"] != "record":
            answer["result"] = None  # a result goes with 'record' only (an interrupted call's form)
        try:
            snapshot = await run_in_threadpool(decide_approval, ctx, approval_id, approved=approved, **answer)
        except SDKError as exc:
            return refused(pages, request, exc)
        then = "the fleet continues the run" if ctx.client else "the next resume of the session applies it"
        chose = f" ({snapshot.action})" if getattr(snapshot, "action", None) else ""
        note = f"{snapshot.status}{chose} {snapshot.id} ({snapshot.tool_call.name} of {snapshot.session_id}): {then}"
        return flash(request, RedirectResponse(str(request.url_for("approvals")), status_code=303), note)
