"""A web app in front of a lousho fleet: enqueue jobs, follow them, and let humans decide approvals.

It talks to the fleet only through `lousho.scheduler.Client` (the broker and the store):
it imports no agent code, so it deploys apart from the workers and never runs a tool.

    LOUSHO_REDIS_URL=redis://localhost:6379/0 uvicorn examples.webapp.app:app

    POST /jobs                 {"agent": "booker", "input": "...", "session_id": null}  -> 202 {"session_id", "status_url"}
    GET  /jobs/{id}            the session's status (in-progress, awaiting-approval, finished, parked)
    GET  /jobs/{id}/events     its live events as Server-Sent Events (text deltas, tool calls, saves), from the
                               start or after `Last-Event-ID` (a reconnecting browser misses none); ends when the
                               run pauses or finishes, with an `end` event (issue #34)
    GET  /                     a page that sends a question to the `writer` agent and shows its answer streaming
    POST /jobs/{id}/abort      stop the run (running tools see their signal)
    GET  /approvals            pending approvals (?session_id=...)
    POST /approvals/{id}       {"approved": true, "note": "..."}: the fleet continues the run at once
                               an interrupted call (kind "interrupted": it may have run when its worker died)
                               also takes "action": "rerun" | "record" (with "result") | "fail"

Limits (issue #31): a request body over `max_body_bytes` (default 16 MiB) is a 413 before it is read; a job's
input, agent name or session id over the `Client`'s `FleetSettings.max_input_chars`, `max_agent_name_chars`,
`max_session_id_chars` (`LOUSHO_MAX_INPUT_CHARS`, ...) is a 413 (`LOUSHO_INPUT_TOO_LARGE`). No error answer
quotes what was sent: it says its length and the rule (`public_detail`); a bad `Last-Event-ID` is a 400.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, JsonValue, StrictBool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lousho.approvals import ApprovalSnapshot
from lousho.errors import (
    AgentNotServedError,
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    ConfigurationError,
    InputTooLargeError,
    InvalidDecisionError,
    InvalidEventIdError,
    InvalidInputError,
    InvalidSessionIdError,
    SDKError,
    SessionAwaitingApprovalError,
    StoreUnavailableError,
)
from lousho.scheduler import Client, SessionStatus
from lousho.settings import LoushoSettings

__all__ = ["app", "create_app", "get_client", "public_detail"]

STATIC = Path(__file__).parent / "static"
log = logging.getLogger("examples.webapp")


class JobIn(BaseModel):
    agent: str
    input: str
    session_id: str | None = None


class JobOut(BaseModel):
    session_id: str
    status_url: str


class ApprovalOut(BaseModel):
    id: str
    session_id: str | None
    """The session whose call waits: a sub-agent's, when the call was made inside a sub-agent."""
    parent_session_id: str | None = None
    """For a sub-agent's call: the job's session that the sub-agent runs for (paused on the same id)."""
    kind: str = "approval"
    """'interrupted': the call may have run already (its worker died in it); decide it with an action (issue #17)."""
    tool: str
    arguments: dict[str, Any]
    created_at: str

    @classmethod
    def of(cls, snapshot: ApprovalSnapshot) -> ApprovalOut:
        waiting = snapshot.waiting  # the inner call of a sub-agent's approval (issue #14)
        return cls(
            id=snapshot.id,
            session_id=waiting.session_id,
            parent_session_id=snapshot.session_id if waiting is not snapshot else None,
            kind=waiting.kind,
            tool=waiting.tool_call.name,
            arguments=waiting.tool_call.arguments,
            created_at=snapshot.created_at,
        )


class DecisionIn(BaseModel):
    approved: StrictBool
    """JSON true or false: "yes", 1 or "false" get a 422, never a decision nobody made (issue #21)."""
    note: str | None = None
    action: Literal["rerun", "record", "fail"] | None = None
    """Only for an interrupted call: run it again, record `result`, or record a failure (issue #17)."""
    result: JsonValue = None


class DecisionOut(BaseModel):
    id: str
    status: str
    action: str | None = None
    session_id: str | None


_STATUS_OF_ERROR: list[tuple[type[SDKError], int]] = [
    (ApprovalNotFoundError, 404),
    (ApprovalAlreadyResolvedError, 409),
    (SessionAwaitingApprovalError, 409),
    (InvalidSessionIdError, 422),
    (InputTooLargeError, 413),
    (InvalidEventIdError, 400),  # a header (Last-Event-ID), not the body: answered before the stream starts
    (InvalidInputError, 422),
    (InvalidDecisionError, 422),
    (StoreUnavailableError, 503),
    # The server's side, not the request's (issue #15): no live worker serves the agent yet, or the app
    # itself is not configured (no Redis it may use). Both say what to do in their detail.
    (AgentNotServedError, 503),
    (ConfigurationError, 500),
]


def public_detail(exc: SDKError) -> str:
    """What an error answer says: made from the error's type and its safe fields (sizes, limits, rules, ids the
    fleet made), never from a message that may quote what was sent (a session id, an agent name, a decision's
    note). The whole error goes to the server's log instead."""
    if isinstance(exc, InputTooLargeError | InvalidEventIdError):
        return str(exc.args[0])  # sizes, limits and rules only
    if isinstance(exc, InvalidSessionIdError):
        given = "it is no text" if exc.length is None else f"{exc.length} characters"
        return f"the session id ({given}) is not allowed: {exc.rule}"
    if isinstance(exc, AgentNotServedError):
        served = sorted({agent for agents in exc.served.values() for agent in agents})
        return (
            f"no live worker serves the agent named (a name of {len(exc.agent)} characters) where this app sends "
            f"jobs; nothing was enqueued. Agents served: {', '.join(served) or 'none'}. Check the agent's name, "
            "or start a worker that serves it"
        )
    if isinstance(exc, SessionAwaitingApprovalError):
        return f"the session waits on approval {exc.approval_id}: decide it (POST /approvals/{exc.approval_id}) first"
    if isinstance(exc, InvalidDecisionError):
        return (
            'a decision is {"approved": true or false, "note": text or null}; "action" ("rerun", "record" with '
            '"result", "fail") only decides an approval of kind "interrupted"; nothing was recorded'
        )
    if isinstance(exc, InvalidInputError):
        return str(exc.args[0])  # about the input's shape: a job's input is text, whose messages quote none of it
    return _GENERIC_DETAIL.get(type(exc), f"the request was refused ({exc.code}); the server's log says why")


_GENERIC_DETAIL: dict[type[SDKError], str] = {
    ApprovalNotFoundError: "no approval has this id; GET /approvals lists the pending ones",
    ApprovalAlreadyResolvedError: "the approval was already decided; its call is not run again",
    StoreUnavailableError: "the fleet's store did not answer; try again (the server's log says why)",
    ConfigurationError: "the app cannot reach its fleet as configured; the server's log says why",
}


def get_client(request: Request) -> Client:
    """The app's `Client`: the one given to `create_app`, else one from the environment (`LoushoSettings`)."""
    client: Client | None = getattr(request.app.state, "client", None)
    if client is None:
        client = request.app.state.client = LoushoSettings().client()
    return client


ClientDep = Annotated[Client, Depends(get_client)]


class BodyLimit:
    """Answers 413 to a request whose body is over `max_bytes`, before the app reads it (issue #31)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            return await self._refuse(send)
        seen = 0

        async def counted() -> Message:  # a chunked body declares no length: count what comes
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        detail = f"the request body is over {self.max_bytes:,} bytes; nothing was read or written"
        await JSONResponse(status_code=413, content={"error": "LOUSHO_INPUT_TOO_LARGE", "detail": detail})(
            {"type": "http"}, _no_body, send
        )


class _TooLarge(Exception):
    pass


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def create_app(client: Client | None = None, *, max_body_bytes: int = 16 * 1024 * 1024) -> FastAPI:
    """The app; `client` defaults to one built from the environment on first use."""
    api = FastAPI(title="lousho jobs", version="1")
    api.state.client = client
    api.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @api.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's 422 without the `input` it quotes by default: a 1 MB value is not sent back (issue #31)."""
        errors = [{"loc": e["loc"], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": errors})

    @api.exception_handler(SDKError)
    async def sdk_error(request: Request, exc: SDKError) -> JSONResponse:
        status = next((code for kind, code in _STATUS_OF_ERROR if isinstance(exc, kind)), 400)
        log.log(logging.WARNING if status >= 500 else logging.INFO, "%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(status_code=status, content={"error": exc.code, "detail": public_detail(exc)})

    @api.post("/jobs", status_code=202)
    def enqueue(job: JobIn, client: ClientDep) -> JobOut:
        session_id = client.enqueue(job.agent, job.input, session_id=job.session_id)
        return JobOut(session_id=session_id, status_url=f"/jobs/{session_id}")

    @api.get("/jobs/{session_id}")
    def status(session_id: str, client: ClientDep) -> SessionStatus:
        found = client.status(session_id)
        if found.status == "unknown":
            raise HTTPException(status_code=404, detail="no job has this session id")
        return found

    @api.get("/jobs/{session_id}/events")
    def events(
        session_id: str, client: ClientDep, last_event_id: Annotated[str | None, Header()] = None
    ) -> StreamingResponse:
        """Server-Sent Events: each event's `id` is its stream id, so a browser that reconnects sends it back as
        `Last-Event-ID` and goes on after it. Ends with an `end` event once the run pauses or finishes."""
        feed = client.events(session_id, after=last_event_id or None)  # a bad id: a 400, before the stream
        if client.status(session_id).status == "unknown":
            raise HTTPException(status_code=404, detail="no job has this session id")

        async def body() -> AsyncIterator[str]:
            yield "retry: 1000\n\n"
            async for event in feed:
                yield event.sse()
            yield f"event: end\ndata: {client.status(session_id).model_dump_json()}\n\n"

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

    @api.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    api.mount("/static", StaticFiles(directory=STATIC), name="static")

    @api.post("/jobs/{session_id}/abort", status_code=202)
    def abort(session_id: str, client: ClientDep) -> SessionStatus:
        client.abort(session_id)
        return client.status(session_id)

    @api.get("/approvals")
    def approvals(client: ClientDep, session_id: str | None = None) -> list[ApprovalOut]:
        return [ApprovalOut.of(a) for a in client.approvals(session_id)]

    @api.post("/approvals/{approval_id}")
    def decide(approval_id: str, decision: DecisionIn, client: ClientDep) -> DecisionOut:
        snapshot = client.resolve_approval(
            approval_id, approved=decision.approved, note=decision.note, action=decision.action, result=decision.result
        )
        return DecisionOut(
            id=snapshot.id, status=snapshot.status, action=snapshot.action, session_id=snapshot.session_id
        )

    return api


app = create_app()
