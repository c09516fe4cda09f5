"""examples/webapp's live events (issue #34): `GET /jobs/{id}/events` as Server-Sent Events against a real worker
process and a real Redis, honouring `Last-Event-ID`; and its page in a real headless chromium, where the `writer`
agent's answer grows before the run finishes."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.dashboard.browser import chromium_page, serving
from tests.ops.conftest import DemoFleet

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def parse_sse(body: str) -> list[dict[str, Any]]:
    """Each message's `id`, `event` and decoded `data`."""
    messages = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            messages.append({"id": fields.get("id"), "event": fields["event"], "data": json.loads(fields["data"])})
    return messages


async def test_the_events_endpoint_streams_the_answer_and_a_reconnect_with_last_event_id_misses_nothing(
    demo_fleet: DemoFleet,
) -> None:
    from examples.webapp.app import create_app

    demo_fleet.start_worker("examples.webapp.agents", WRITER_DELTA_DELAY_S="0.02")
    transport = httpx.ASGITransport(app=create_app(demo_fleet.client))
    async with httpx.AsyncClient(transport=transport, base_url="http://webapp.test", timeout=60) as http:
        created = await http.post("/jobs", json={"agent": "writer", "input": "Why SSE?", "session_id": "sse-1"})
        assert created.status_code == 202
        answer = await http.get("/jobs/sse-1/events")
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        messages = parse_sse(answer.text)
        assert messages[-1]["event"] == "end" and messages[-1]["data"]["status"] == "finished"
        deltas = [m["data"]["text"] for m in messages if m["event"] == "text-delta"]
        assert "".join(deltas) == messages[-1]["data"]["text"]
        assert all(m["id"] == m["data"]["id"] for m in messages[:-1])

        cut = next(i for i, m in enumerate(messages) if m["event"] == "text-delta")
        again = parse_sse((await http.get("/jobs/sse-1/events", headers={"Last-Event-ID": messages[cut]["id"]})).text)
        assert [m["id"] for m in messages[: cut + 1] + again] == [m["id"] for m in messages]

        assert (await http.get("/jobs/nobody/events")).status_code == 404
        bad = await http.get("/jobs/sse-1/events", headers={"Last-Event-ID": "not-an-id"})
        assert bad.status_code == 400 and bad.json()["error"] == "LOUSHO_INVALID_INPUT"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_example_page_shows_the_answer_growing_before_the_run_finishes(demo_fleet: DemoFleet) -> None:
    from examples.webapp.app import create_app

    demo_fleet.start_worker("examples.webapp.agents", WRITER_DELTA_DELAY_S="0.25")
    with serving(create_app(demo_fleet.client)) as base, chromium_page() as page:
        page.goto(base + "/")
        page.fill("#question", "Does it stream?")
        page.click("button[type=submit]")
        page.wait_for_function("document.getElementById('answer').textContent.length > 0", timeout=60_000)
        session = page.evaluate("document.body.dataset.session")
        lengths = []
        while page.text_content("#status") != "finished":
            lengths.append((len(page.text_content("#answer") or ""), demo_fleet.client.status(session).status))
            assert len(lengths) < 600, lengths
            time.sleep(0.1)
        final = page.text_content("#answer")

    growing = [n for n, status in lengths if status == "in-progress"]
    assert len(set(growing)) >= 3, f"the answer did not grow while the run was in progress: {lengths}"
    assert growing == sorted(growing)
    assert final == demo_fleet.client.status(session).text
