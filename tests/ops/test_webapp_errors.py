"""The web example's error answers never quote what was sent (a session id, an agent name, an approval id): each
says the error's code, and for a value its length and the rule, from the error's safe fields
(`examples.webapp.app.public_detail`), never from its message. No worker is needed: each request is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis

from lousho.checkpoint import SESSION_ID_RULE
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.testing.store_contract.samples import sample_checkpoint, sample_snapshot
from lousho.worker import FleetSettings, broker_url
from tests.ops.conftest import DemoFleet

SENT = "Sk-SECRET"
"""Part of every value sent: no answer may hold it."""


@pytest.fixture
def client(redis_url: str, redis_prefix: str, redis_client: redis.Redis) -> Client:
    settings = FleetSettings(queue=f"{redis_prefix}q")
    client = Client(
        broker=broker_url(redis_url), store=RedisStore(redis_client, prefix=redis_prefix), settings=settings
    )
    decided = sample_snapshot(f"{SENT}-decided", session_id=f"{SENT}-other")
    client.store.approvals.save(decided)
    client.store.approvals.decide(decided.id, approved=False, note=None)
    return client


@pytest.fixture
async def http(client: Client) -> AsyncIterator[httpx.AsyncClient]:
    from examples.webapp.app import create_app

    transport = httpx.ASGITransport(app=create_app(client))
    async with httpx.AsyncClient(transport=transport, base_url="http://webapp.test") as http:
        yield http


BAD_ID = f"{SENT} with spaces"
REFUSED: list[tuple[str, str, dict[str, Any] | None, int, str, str]] = [
    ("GET", f"/jobs/{BAD_ID}", None, 422, "LOUSHO_INVALID_SESSION_ID", f"({len(BAD_ID)} characters)"),
    ("GET", f"/jobs/{BAD_ID}/events", None, 422, "LOUSHO_INVALID_SESSION_ID", SESSION_ID_RULE),
    ("POST", "/jobs", {"agent": "jobs", "input": "hi", "session_id": BAD_ID}, 422, "LOUSHO_INVALID_SESSION_ID",
     SESSION_ID_RULE),
    ("POST", "/jobs", {"agent": f"{SENT}-agent", "input": "hi"}, 503, "LOUSHO_AGENT_NOT_SERVED",
     f"a name of {len(SENT) + 6} characters"),
    ("POST", f"/approvals/{SENT}-nowhere", {"approved": True}, 404, "LOUSHO_APPROVAL_NOT_FOUND", "GET /approvals"),
    ("POST", f"/approvals/{SENT}-decided", {"approved": True}, 409, "LOUSHO_APPROVAL_ALREADY_RESOLVED", "decided"),
    ("GET", f"/jobs/{SENT}-unknown", None, 404, "", "no job"),
    ("GET", f"/jobs/{SENT}-unknown/events", None, 404, "", "no job"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "status", "code", "says"), REFUSED)
async def test_an_error_answer_of_the_web_example_says_the_rule_and_never_quotes_what_was_sent(
    http: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None, status: int, code: str, says: str
) -> None:
    answer = await http.request(method, path, json=body)

    assert answer.status_code == status, answer.text
    assert SENT not in answer.text
    found = answer.json()
    assert found.get("error", "") == code and says in (found.get("detail") or "")


async def test_a_store_that_does_not_answer_is_a_503_that_quotes_nothing_sent() -> None:
    from examples.webapp.app import create_app

    nowhere = Client(broker=broker_url("redis://127.0.0.1:1/0"), store=RedisStore("redis://127.0.0.1:1/0"))
    transport = httpx.ASGITransport(app=create_app(nowhere))
    async with httpx.AsyncClient(transport=transport, base_url="http://webapp.test") as http:
        answer = await http.get(f"/jobs/{SENT}-job")

    assert answer.status_code == 503 and answer.json()["error"] == "LOUSHO_STORE_UNAVAILABLE"
    assert SENT not in answer.text and "try again" in answer.json()["detail"]


@pytest.mark.workers  # a live worker serves `booker`, so the job reaches the session's own check
async def test_a_job_for_a_session_awaiting_approval_is_a_409_naming_the_approval_not_the_session(
    demo_fleet: DemoFleet,
) -> None:
    from examples.webapp.app import create_app

    paused = f"{SENT}-paused"
    demo_fleet.client.store.checkpoints.save(paused, sample_checkpoint(paused, approval_id="appr_paused"))
    demo_fleet.start_worker("examples.webapp.agents")
    transport = httpx.ASGITransport(app=create_app(demo_fleet.client))
    async with httpx.AsyncClient(transport=transport, base_url="http://webapp.test") as http:
        answer = await http.post("/jobs", json={"agent": "booker", "input": "hi", "session_id": paused})

    assert answer.status_code == 409 and answer.json()["error"] == "LOUSHO_SESSION_AWAITING_APPROVAL", answer.text
    assert SENT not in answer.text and "POST /approvals/appr_paused" in answer.json()["detail"]
