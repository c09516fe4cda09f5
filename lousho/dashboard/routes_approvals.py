"""Pending approvals, by the call that waits, approved or rejected from the page with a note (issue #19); live:
the page's rows are polled as the sessions page's are, and the navigation shows the pending count (issue #32)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from lousho.dashboard.pages import Pages
from lousho.dashboard.routes_sessions import refused
from lousho.dashboard.security import check_post, flash
from lousho.dashboard.views import DashboardContext
from lousho.errors import SDKError
from lousho.operations import decide_approval, pending_approvals, pending_count

__all__ = ["add_routes"]


def add_routes(router: APIRouter, ctx: DashboardContext, pages: Pages) -> None:
    @router.get("/approvals", name="approvals", response_class=HTMLResponse)
    def approvals(request: Request) -> HTMLResponse:
        try:
            pending = pending_approvals(ctx)
        except SDKError as exc:
            return refused(pages, request, exc)
        return pages.render(request, "approvals.html", pending=pending, skipped=pending.skipped)

    @router.get("/approvals/rows", name="approval_rows", response_class=HTMLResponse)
    def rows(request: Request) -> HTMLResponse:
        """The approvals table's rows alone: what the page's script polls for (live updates, no build step)."""
        try:
            pending = pending_approvals(ctx)
        except SDKError as exc:
            return refused(pages, request, exc)
        response = pages.render(request, "approval_rows.html", pending=pending, partial=True)
        response.headers["X-Lousho-Pending"] = str(len(pending))
        return response

    @router.get("/approvals/count", name="approval_count")
    def count() -> dict[str, int]:
        """How many approvals are pending: the navigation's count, which every page's script keeps current."""
        try:
            return {"pending": pending_count(ctx)}
        except SDKError as exc:
            raise HTTPException(409, str(exc)) from None

    @router.post("/approvals/{approval_id}", name="decide")
    async def decide(request: Request, approval_id: str) -> Response:
        await check_post(request, read_only=ctx.read_only)
        form = await request.form()
        approved = form.get("decision") == "approve"
        answer = {name: str(form.get(name) or "") or None for name in ("note", "action", "result")}
        if answer["action"] != "record":
            answer["result"] = None  # a result goes with 'record' only (an interrupted call's form)
        try:
            decided = await run_in_threadpool(decide_approval, ctx, approval_id, approved=approved, **answer)
        except SDKError as exc:
            return refused(pages, request, exc)
        return flash(request, RedirectResponse(str(request.url_for("approvals")), status_code=303), decided.summary)
