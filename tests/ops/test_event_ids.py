"""Event ids a reader resumes from: `Client.events(after=...)`, and `Last-Event-ID` (or `?after=`) on the web
example and the dashboard. An id that is no id of the stream, out of Redis's range (a part past 2^64-1) as much as
malformed, is an `InvalidEventIdError` (an `InvalidInputError`) before Redis is asked, telling the id's length and
the rule, never the id; the web example and the dashboard answer 400 instead of starting a stream that breaks. No
worker is needed: the session waits on its queue."""

from __future__ import annotations

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from lousho.dashboard import create_dashboard
from lousho.errors import InvalidEventIdError, InvalidInputError
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url

PAST_RANGE = ["99999999999999999999-0", "0-18446744073709551616", "18446744073709551616-18446744073709551616"]
"""Well-formed ids with a part past 2^64-1: Redis refuses them."""
MALFORMED = ["not-an-id", "$", "1-2-3", "-1-0", "1-"]
LARGEST = "18446744073709551615-18446744073709551615"


@pytest.fixture
def client(redis_url: str, redis_prefix: str, redis_client: redis.Redis) -> Client:
    settings = FleetSettings(queue=f"{redis_prefix}q")
    return Client(broker=broker_url(redis_url), store=RedisStore(redis_client, prefix=redis_prefix), settings=settings)


@pytest.fixture
def session(client: Client) -> str:
    return client.enqueue("writer", "hello", session_id="reader", require_worker=False)


@pytest.mark.parametrize("event_id", PAST_RANGE + MALFORMED)
def test_an_event_id_out_of_range_or_malformed_is_refused_before_redis_is_asked_without_quoting_it(
    event_id: str,
) -> None:
    nowhere = Client(broker=broker_url("redis://127.0.0.1:1/0"), store=RedisStore("redis://127.0.0.1:1/0"))

    with pytest.raises(InvalidEventIdError) as raised:  # not StoreUnavailableError: no Redis call was made
        nowhere.events("reader", after=event_id)

    error = raised.value
    assert isinstance(error, InvalidInputError) and error.code == "LOUSHO_INVALID_INPUT"
    assert event_id not in str(error) and f"({len(event_id)} characters)" in str(error)
    assert "at most 18446744073709551615" in str(error)


def test_the_largest_event_id_redis_takes_is_taken(client: Client, session: str) -> None:
    feed = client.events(session, after=LARGEST, block_s=0.1)

    assert feed.read(block=False) == []  # Redis read from it: nothing comes after the largest id


@pytest.mark.parametrize("event_id", [PAST_RANGE[0], MALFORMED[0]])
async def test_the_web_example_answers_a_bad_last_event_id_with_400_before_the_stream(
    client: Client, session: str, event_id: str
) -> None:
    from examples.webapp.app import create_app

    transport = httpx.ASGITransport(app=create_app(client))
    async with httpx.AsyncClient(transport=transport, base_url="http://webapp.test") as http:
        answer = await http.get(f"/jobs/{session}/events", headers={"Last-Event-ID": event_id})

    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/json"  # no stream started, so no `retry:` either
    assert answer.json()["error"] == "LOUSHO_INVALID_INPUT" and event_id not in answer.text


@pytest.mark.parametrize("where", ["header", "query"])
def test_the_dashboards_event_feed_answers_an_event_id_out_of_range_with_400(
    client: Client, session: str, where: str
) -> None:
    dashboard = TestClient(create_dashboard(client.store, client=client))
    event_id = PAST_RANGE[0]

    if where == "header":
        answer = dashboard.get(f"/sessions/{session}/events", headers={"Last-Event-ID": event_id})
    else:
        answer = dashboard.get(f"/sessions/{session}/events", params={"after": event_id})

    assert answer.status_code == 400, answer.text
    assert not answer.headers["content-type"].startswith("text/event-stream") and event_id not in answer.text
