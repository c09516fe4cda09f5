"""examples/webapp: a FastAPI app driven over HTTP (httpx, ASGI transport, in process) against a real
worker process and a real Redis: enqueue -> awaiting approval -> approve via HTTP -> finished."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import httpx

from tests.ops.conftest import ROOT, DemoFleet


async def wait_for(http: httpx.AsyncClient, session: str, status: str, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        body: dict[str, Any] = (await http.get(f"/jobs/{session}")).json()
        if body["status"] == status:
            return body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.05)


def test_the_web_app_imports_no_agent_code() -> None:
    probe = (
        "import sys, examples.webapp.app; "
        "bad = [m for m in sys.modules if m.startswith(('examples.webapp.agents', 'lousho.demo'))]; "
        "assert not bad, bad; print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


async def test_a_job_through_the_web_app_pauses_for_approval_and_finishes(demo_fleet: DemoFleet) -> None:
    from examples.webapp.app import create_app

    demo_fleet.start_worker("examples.webapp.agents")
    transport = httpx.ASGITransport(app=create_app(demo_fleet.client))
    async with httpx.AsyncClient(transport=transport, base_url="http://webapp.test") as http:
        created = await http.post(
            "/jobs", json={"agent": "booker", "input": "A table for 2 tonight", "session_id": "web-1"}
        )
        assert created.status_code == 202 and created.json() == {"session_id": "web-1", "status_url": "/jobs/web-1"}

        paused = await wait_for(http, "web-1", "awaiting-approval")
        pending = (await http.get("/approvals", params={"session_id": "web-1"})).json()
        assert [(a["id"], a["tool"], a["arguments"]) for a in pending] == [
            (paused["approval_id"], "book_table", {"restaurant": "Casa Lisboa", "people": 2})
        ]

        decided = await http.post(f"/approvals/{paused['approval_id']}", json={"approved": True, "note": "go ahead"})
        assert decided.status_code == 200 and decided.json()["status"] == "approved"
        done = await wait_for(http, "web-1", "finished")
        assert done["text"] == "Booked: Casa Lisboa at 20:00 for 2."
        assert (await http.get("/approvals")).json() == []

        again = await http.post(f"/approvals/{paused['approval_id']}", json={"approved": False})
        assert again.status_code == 409 and again.json()["error"] == "LOUSHO_APPROVAL_ALREADY_RESOLVED"
        assert (await http.post("/approvals/appr_nope", json={"approved": True})).status_code == 404
        assert (await http.get("/jobs/nobody")).status_code == 404
        assert (await http.get("/jobs/bad id")).status_code == 422
        created = await http.post("/jobs", json={"agent": "booker", "input": "and another", "session_id": "web-1"})
        assert created.status_code == 202  # a finished session takes the next message
        second = await wait_for(http, "web-1", "awaiting-approval")
        assert second["approval_id"] != paused["approval_id"]
        aborted = await http.post("/jobs/web-1/abort")
        assert aborted.status_code == 202 and aborted.json()["aborted"] is True
    checkpoint = demo_fleet.client.checkpoint("web-1")
    assert checkpoint is not None
    assert [m.tool_call_id for m in checkpoint.messages if m.role == "tool"] == ["find-1", "book-1", "find-2"]
