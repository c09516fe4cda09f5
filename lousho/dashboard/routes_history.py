"""A session's history (the timeline of saves) and forking from a save, patched from a form (issue #19)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from lousho.dashboard.actions import ForkForm, fork_request
from lousho.dashboard.pages import Pages
from lousho.dashboard.routes_sessions import refused
from lousho.dashboard.security import check_post, flash
from lousho.dashboard.views import DashboardContext
from lousho.errors import ConfigurationError, SDKError
from lousho.operations import fork as fork_session
from lousho.operations import load_session, session_history

__all__ = ["add_routes"]

FORM_FIELDS = ("tool_call_id", "tool_result", "append_input", "message_index", "message_content")


def add_routes(router: APIRouter, ctx: DashboardContext, pages: Pages) -> None:
    @router.get("/sessions/{session_id}/history", name="history", response_class=HTMLResponse)
    def history(request: Request, session_id: str) -> HTMLResponse:
        try:
            checkpoint = load_session(ctx, session_id)
            entries = session_history(ctx, session_id)
        except SDKError as exc:
            return refused(pages, request, exc)
        calls = [call for message in checkpoint.messages for call in message.tool_calls]
        texts = [(i, m) for i, m in enumerate(checkpoint.messages) if m.role in ("user", "assistant") and m.content]
        return pages.render(request, "history.html", cp=checkpoint, entries=entries, calls=calls, texts=texts)

    @router.post("/sessions/{session_id}/fork", name="fork")
    async def fork(request: Request, session_id: str) -> Response:
        await check_post(request, read_only=ctx.read_only)
        form = await request.form()
        try:
            fields = {name: str(form.get(name) or "") for name in FORM_FIELDS}
            save = str(form.get("save") or "")
            if not save.isdigit():
                raise ConfigurationError(f"pick a save to fork from (a number from the history), not {save!r}")
            new_id, run = str(form.get("new_session_id") or ""), form.get("run") == "on"
            asked = fork_request(session_id, ForkForm(save=int(save), new_session_id=new_id, run=run, **fields))
            forked = await run_in_threadpool(fork_session, ctx, asked)
        except SDKError as exc:
            return refused(pages, request, exc)
        then = "not started: run it from its page" if ctx.client is not None and not asked.run else forked.then
        note = f"forked {session_id} at step {forked.step} (save {forked.save}); {then}"
        url = request.url_for("session", session_id=forked.session_id)
        return flash(request, RedirectResponse(str(url), status_code=303), note)
