"""The operator-facing entry points refuse what `Client` refuses (issue #21): `lousho enqueue` with input that
has no text prints one `LOUSHO_INVALID_INPUT` line, and the web example answers bad input and decisions that
are not JSON true/false with a 422. Nothing is written either way (a DUMP of every key of the test, before
and after); no worker is needed to refuse."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import redis

from lousho.testing.store_contract.samples import sample_snapshot
from tests.fixtures.redis_dump import prefix_dump
from tests.ops.conftest import DemoFleet, cli_env
from tests.ops.test_cli import assert_one_line_error, lousho

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def everything(fleet: DemoFleet, client: redis.Redis) -> dict[bytes, bytes | None]:
    return prefix_dump(client, fleet.settings.prefix, fleet.settings.fleet.queue)


@pytest.mark.parametrize("text", ["", "   "])
def test_lousho_enqueue_refuses_input_without_text_in_one_line_and_writes_nothing(
    demo_fleet: DemoFleet, redis_client: redis.Redis, text: str
) -> None:
    before = everything(demo_fleet, redis_client)

    result = lousho("enqueue", "trip_planner", text, "--session", "cli-empty", env=cli_env(demo_fleet), ok=False)

    assert_one_line_error(result, "LOUSHO_INVALID_INPUT", "without text")
    assert everything(demo_fleet, redis_client) == before


async def test_the_web_app_answers_bad_input_and_lax_decisions_with_a_422_and_writes_nothing(
    demo_fleet: DemoFleet, redis_client: redis.Redis
) -> None:
    from examples.webapp.app import create_app

    demo_fleet.client.store.approvals.save(sample_snapshot("appr_web", session_id="web-paused"))
    before = everything(demo_fleet, redis_client)
    bad_jobs: list[Any] = ["", "  ", 123, ["hi"], {"role": "tool", "content": "{}"}, None]
    lax: list[Any] = ["yes", 1, "false", 0, "no", "off", None, "maybe", 2]
    transport = httpx.ASGITransport(app=create_app(demo_fleet.client))
    async with httpx.AsyncClient(transport=transport, base_url="http://webapp.test") as http:
        for bad in bad_jobs:
            answer = await http.post("/jobs", json={"agent": "booker", "input": bad, "session_id": "web-bad"})
            assert answer.status_code == 422, (bad, answer.text)
        typed = await http.post("/jobs", json={"agent": "booker", "input": ""})
        for approved in lax:
            answer = await http.post("/approvals/appr_web", json={"approved": approved})
            assert answer.status_code == 422, (approved, answer.text)
        pending = (await http.get("/approvals")).json()

    assert typed.json()["error"] == "LOUSHO_INVALID_INPUT" and "without text" in typed.json()["detail"]
    assert [a["id"] for a in pending] == ["appr_web"]
    assert everything(demo_fleet, redis_client) == before
