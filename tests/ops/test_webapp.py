"""examples/webapp: a FastAPI app driven over HTTP (httpx, ASGI transport, in process) against a real
worker process and a real Redis: enqueue -> awaiting approval -> approve via HTTP -> finished."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url
from tests.ops.conftest import ROOT, DemoFleet

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


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
        aborted = await http.post("/jobs/web-1/abort")  # paused on an approval: nothing runs, nothing to stop
        assert aborted.status_code == 202 and aborted.json()["aborted"] is False
        assert aborted.json()["status"] == "awaiting-approval"
    checkpoint = demo_fleet.client.checkpoint("web-1")
    assert checkpoint is not None
    assert [m.tool_call_id for m in checkpoint.messages if m.role == "tool"] == ["find-1", "book-1", "find-2"]


async def post_job(app: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://webapp.test") as http:
        return await http.post("/jobs", json={"agent": "booker", "input": "A table for 2", "session_id": "web-9"})


async def test_an_agent_no_worker_serves_is_a_503_that_says_so(redis_url: str, redis_prefix: str) -> None:
    from examples.webapp.app import create_app

    store = RedisStore(redis_url, prefix=redis_prefix)
    client = Client(broker=broker_url(redis_url), store=store, settings=FleetSettings(queue=f"{redis_prefix}web"))

    answer = await post_job(create_app(client))

    assert answer.status_code == 503, answer.text  # the server's side: start a worker (issue #15)
    assert answer.json()["error"] == "LOUSHO_AGENT_NOT_SERVED"
    assert store.checkpoints.load("web-9") is None


async def test_with_nothing_configured_the_web_app_uses_the_local_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from examples.webapp.app import create_app

    for name in ("REDIS_URL", "LOUSHO_REDIS_URL", "LOUSHO_STORE_URL", "LOUSHO_PREFIX", "LOUSHO_QUEUE"):
        monkeypatch.delenv(name, raising=False)

    answer = await post_job(create_app())

    # Not a 400 "no Redis configured" (issue #15): the local store answers, and says no worker serves booker.
    assert (answer.status_code, answer.json()["error"]) == (503, "LOUSHO_AGENT_NOT_SERVED"), answer.text


async def test_a_web_app_that_cannot_be_configured_is_a_500_not_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    from examples.webapp.app import create_app

    for name in ("REDIS_URL", "LOUSHO_REDIS_URL", "LOUSHO_STORE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOUSHO_LOCAL_REDIS", "off")

    answer = await post_job(create_app())

    assert (answer.status_code, answer.json()["error"]) == (500, "LOUSHO_CONFIGURATION"), answer.text
