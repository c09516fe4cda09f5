"""The sessions page (filter, search, live rows) and a session's page (issue #19), from `lousho.operations`
(issue #32)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from lousho.dashboard.pages import Pages
from lousho.dashboard.security import check_post, flash
from lousho.dashboard.views import PAGE_ROWS, STATUSES, DashboardContext, fingerprint_drift, transcript_turns
from lousho.errors import ConfigurationError, SDKError, SessionLiveError, SessionNotFoundError, StoreNotFoundError
from lousho.operations import (
    delete_sessions,
    latest_event_id,
    list_sessions,
    load_session,
    parse_age,
    prune_sessions,
    resume_session,
    session_events,
    session_history,
    show_session,
)

__all__ = ["add_routes", "refused"]


def refused(pages: Pages, request: Request, exc: SDKError) -> HTMLResponse:
    """An error from the library as a page: 404 for what is not there, 400 for bad input, else 409. A missing
    session is said plainly, without the store's repr the command line shows (issue #32)."""
    missing = isinstance(exc, (SessionNotFoundError, StoreNotFoundError))
    status = 404 if missing else 400 if isinstance(exc, ConfigurationError) else 409
    if isinstance(exc, SessionNotFoundError):
        return pages.error(
            request, status, f"No session {exc.session_id!r} in this store: it was never saved, or it was deleted."
        )
    return pages.error(request, status, str(exc))


def add_routes(router: APIRouter, ctx: DashboardContext, pages: Pages) -> None:
    @router.get("/", name="sessions", response_class=HTMLResponse)
    def sessions(request: Request, status: str = "", q: str = "", start: int = 0) -> HTMLResponse:
        try:
            found = list_sessions(ctx, status or None, search=q, start=start, limit=PAGE_ROWS)
        except SDKError as exc:
            return refused(pages, request, exc)
        return pages.render(
            request,
            "sessions.html",
            page=found,
            rows=found.rows,
            statuses=STATUSES,
            status=status,
            q=q,
        )

    @router.get("/rows", name="session_rows", response_class=HTMLResponse)
    def rows(request: Request, status: str = "", q: str = "", start: int = 0) -> HTMLResponse:
        """The sessions table's rows alone: what the page's script polls for (live updates, no build step)."""
        try:
            found = list_sessions(ctx, status or None, search=q, start=start, limit=PAGE_ROWS)
        except SDKError as exc:
            return refused(pages, request, exc)
        response = pages.render(request, "session_rows.html", rows=found.rows, partial=True)
        shown = f"{found.start + 1 if found.rows else 0}-{found.start + len(found.rows)} of {found.total}"
        response.headers["X-Lousho-Shown"] = shown  # the pager's text, which the script updates too
        return response

    @router.get("/sessions/{session_id}", name="session", response_class=HTMLResponse)
    def session(request: Request, session_id: str) -> HTMLResponse:
        try:
            events_after = latest_event_id(ctx, session_id)  # before the checkpoint: the page follows on from it
            view = show_session(ctx, session_id, with_sub_sessions=True)
            try:
                history = session_history(ctx, session_id)
            except ConfigurationError:
                history = []
        except SDKError as exc:
            return refused(pages, request, exc)
        checkpoint = view.checkpoint
        return pages.render(
            request,
            "session.html",
            cp=checkpoint,
            status=view.status,
            parked_reason=view.parked_reason,
            turns=transcript_turns(checkpoint, set(view.sub_sessions)),
            subs=view.sub_sessions,
            drift=fingerprint_drift(checkpoint, history),
            fork_source=view.forked_from.session_id if view.forked_from else None,
            forked_from=view.forked_from,
            events_after=events_after,
        )

    @router.get("/sessions/{session_id}/events", name="session_events")
    def events(session_id: str, after: str = "", last_event_id: Annotated[str, Header()] = "") -> StreamingResponse:
        """The session's live events as Server-Sent Events (issue #34), after `Last-Event-ID` (a reconnect) or
        `?after=` (the page's first connection); 404 off a fleet, where the page looks at the saves instead."""
        try:
            feed = session_events(ctx, session_id, last_event_id or after or None)
        except SDKError as exc:
            raise HTTPException(400, str(exc)) from None
        if feed is None:
            raise HTTPException(404, "no event stream: this store is not a fleet's")

        async def body() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            async for event in feed:
                yield event.sse()
            yield "event: end\ndata: {}\n\n"

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @router.get("/sessions/{session_id}/version", name="session_version")
    def version(session_id: str) -> dict[str, int | str]:
        """The session's save number and status: the session page reloads itself when they change (live)."""
        try:
            checkpoint = load_session(ctx, session_id)
        except SessionNotFoundError as exc:
            raise HTTPException(404, str(exc)) from None
        return {"version": checkpoint.version, "status": checkpoint.status}

    @router.post("/sessions/{session_id}/resume", name="resume")
    async def resume(request: Request, session_id: str) -> Response:
        await check_post(request, read_only=ctx.read_only)
        try:
            resumed = await run_in_threadpool(resume_session, ctx, session_id)
        except SDKError as exc:
            return refused(pages, request, exc)
        url = request.url_for("session", session_id=session_id)
        return flash(request, RedirectResponse(str(url), status_code=303), resumed.message)

    @router.post("/sessions/{session_id}/delete", name="delete")
    async def delete(request: Request, session_id: str) -> Response:
        """`lousho delete SESSION` from the session's page, once its box is ticked. A session a worker
        is running asks a second confirmation (the `force` box): then its run is aborted first, as `--force`."""
        await check_post(request, read_only=ctx.read_only)
        form = await request.form()
        if form.get("confirm") != "on":
            return pages.error(request, 400, "Tick the box to confirm: a deleted session cannot be brought back.")
        force = form.get("force") == "on"
        try:
            deleted = await run_in_threadpool(lambda: delete_sessions(ctx, [session_id], force=force))
        except SessionLiveError as exc:
            return pages.render(request, "delete_live.html", 409, session_id=session_id, live=exc.live)
        except SDKError as exc:
            return refused(pages, request, exc)
        aborted = " (its run aborted first)" if deleted.aborted else ""
        note = f"deleted {', '.join(deleted.sessions)}{aborted}"
        return flash(request, RedirectResponse(str(request.url_for("sessions")), status_code=303), note)

    @router.post("/prune", name="prune", response_class=HTMLResponse)
    async def prune(request: Request) -> Response:
        """`lousho prune --status S --older-than AGE` from the sessions page (issue #32): first what it would
        delete (a dry run), then, once its box is ticked, the prune itself."""
        await check_post(request, read_only=ctx.read_only)
        form = await request.form()
        status, older_than = str(form.get("status", "")), str(form.get("older_than", "")).strip()
        confirmed = form.get("confirm") == "on"
        try:
            age = parse_age(older_than)
            found = await run_in_threadpool(lambda: prune_sessions(ctx, status, age, dry_run=not confirmed))
        except SDKError as exc:
            return refused(pages, request, exc)
        if not confirmed:
            return pages.render(request, "prune.html", found=found, status=status, older_than=older_than)
        note = f"pruned {len(found.sessions)} session(s): {', '.join(found.sessions) or 'none'}"
        if found.kept:
            note += f"; kept {len(found.kept)} live: {', '.join(found.kept)}"
        return flash(request, RedirectResponse(str(request.url_for("sessions")), status_code=303), note)
