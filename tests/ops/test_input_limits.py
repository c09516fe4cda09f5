"""Limits on what a job may carry (issue #31, finding 6): `Client.enqueue` and the web example refuse an input, an
agent name or a session id over its configured limit with `InputTooLargeError` (`LOUSHO_INPUT_TOO_LARGE`, HTTP
413), which quotes no part of it, and write nothing. Before, a 30 MB input passed and a 1 MB agent name was sent
back in the error. The limits are `FleetSettings` fields, so `LOUSHO_MAX_INPUT_CHARS` and friends set them. No
worker is needed to refuse."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import redis

from lousho.errors import InputTooLargeError, InvalidInputError, InvalidSessionIdError
from lousho.scheduler import Client
from lousho.settings import LoushoSettings
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url
from tests.fixtures.redis_dump import prefix_dump

SECRET_PART = "Sk-SECRET"  # what an error must not send back


@pytest.fixture
def limited(redis_url: str, redis_prefix: str, redis_client: redis.Redis) -> Client:
    settings = FleetSettings(
        queue=f"{redis_prefix}q", max_input_chars=1000, max_agent_name_chars=20, max_session_id_chars=30,
        max_input_messages=5, max_business_state_chars=100,
    )  # fmt: skip
    return Client(broker=broker_url(redis_url), store=RedisStore(redis_client, prefix=redis_prefix), settings=settings)


@pytest.fixture
def default_client(redis_url: str, redis_prefix: str, redis_client: redis.Redis) -> Client:
    """A client with the default limits."""
    settings = FleetSettings(queue=f"{redis_prefix}q")
    return Client(broker=broker_url(redis_url), store=RedisStore(redis_client, prefix=redis_prefix), settings=settings)


def everything(client: Client) -> dict[bytes, bytes | None]:
    assert client.settings.queue is not None
    return prefix_dump(client.store.client, client.store.prefix, client.settings.queue)


@pytest.mark.parametrize(
    ("agent", "job", "session_id", "what"),
    [
        ("jobs", SECRET_PART * 200, None, "input"),
        ("jobs", ["short", {"role": "user", "content": SECRET_PART * 120}], None, "input"),
        (SECRET_PART * 3, "hi", None, "agent name"),
        ("jobs", "hi", SECRET_PART * 4, "session id"),
    ],
)
def test_enqueue_refuses_what_is_over_its_limit_without_quoting_it_and_writes_nothing(
    limited: Client, agent: str, job: Any, session_id: str | None, what: str
) -> None:
    before = everything(limited)

    with pytest.raises(InputTooLargeError) as raised:
        limited.enqueue(agent, job, session_id=session_id, require_worker=False)

    error = raised.value
    assert isinstance(error, InvalidInputError) and error.what == what
    if what == "session id":  # an invalid session id, as one over 200 characters always was
        assert isinstance(error, InvalidSessionIdError) and error.code == "LOUSHO_INVALID_SESSION_ID"
    else:
        assert error.code == "LOUSHO_INPUT_TOO_LARGE"
    assert SECRET_PART not in str(error) and f"over the limit of {error.limit:,}" in str(error)
    assert everything(limited) == before


def test_enqueue_refuses_a_business_state_over_its_limit_by_its_json_size_without_quoting_it_and_writes_nothing(
    limited: Client,
) -> None:
    state = {"note": SECRET_PART * 10}  # 90 characters of text, 101 of its JSON ({"note":"..."})

    with pytest.raises(InputTooLargeError) as raised:
        limited.enqueue("jobs", "hi", business_state=state, require_worker=False)

    error = raised.value
    assert (error.code, error.what, error.size, error.limit) == ("LOUSHO_INPUT_TOO_LARGE", "business_state", 101, 100)
    assert "101 characters of JSON" in str(error) and "LOUSHO_MAX_BUSINESS_STATE_CHARS" in str(error)
    assert SECRET_PART not in str(error)
    assert everything(limited) == {b"queue length": b"0"}  # no key under the prefix, nothing sent


@pytest.mark.parametrize("stored", [False, True])
def test_enqueue_refuses_an_input_of_more_messages_than_its_limit_and_writes_nothing(
    limited: Client, stored: bool
) -> None:
    if stored:
        limited.enqueue("jobs", "first", session_id="many", require_worker=False)
    before = everything(limited)
    job = [{"role": "user", "content": SECRET_PART}] * 6

    with pytest.raises(InputTooLargeError) as raised:
        limited.enqueue("jobs", job, session_id="many", require_worker=False)

    error = raised.value
    assert (error.code, error.what, error.size, error.limit) == ("LOUSHO_INPUT_TOO_LARGE", "input", 6, 5)
    assert "6 messages" in str(error) and "LOUSHO_MAX_INPUT_MESSAGES" in str(error)
    assert SECRET_PART not in str(error)
    assert everything(limited) == before
    if not stored:
        assert before == {b"queue length": b"0"}


def test_what_is_within_the_limits_is_enqueued(limited: Client) -> None:
    state = {"note": "y" * 89}  # 100 characters of its JSON
    job = ["x" * 200] * 5
    session = limited.enqueue("a" * 20, job, session_id="s" * 30, business_state=state, require_worker=False)

    assert limited.status(session).status == "in-progress"
    checkpoint = limited.checkpoint(session)
    assert checkpoint is not None and checkpoint.business_state == state and len(checkpoint.pending_input) == 5


def test_the_default_limits_refuse_a_30_mb_input_and_a_1_mb_agent_name(default_client: Client) -> None:
    client = default_client

    with pytest.raises(InputTooLargeError, match="input has 31,457,280 characters"):
        client.enqueue("jobs", "x" * 30 * 1024 * 1024, require_worker=False)
    with pytest.raises(InputTooLargeError, match="agent name has 1,048,576 characters"):
        client.enqueue("y" * 1024 * 1024, "hi", require_worker=False)


def test_the_default_limits_refuse_a_9_m_character_business_state_and_100_000_messages(default_client: Client) -> None:
    client = default_client

    with pytest.raises(InputTooLargeError, match="business_state has 9,000,002 characters of JSON"):
        client.enqueue("jobs", "hi", business_state="x" * 9_000_000, require_worker=False)
    with pytest.raises(InputTooLargeError, match="input has 100,000 messages"):
        client.enqueue("jobs", ["hi"] * 100_000, require_worker=False)
    assert everything(client) == {b"queue length": b"0"}


def test_the_message_and_business_state_limits_come_from_the_environment(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": redis_prefix, "LOUSHO_QUEUE": f"{redis_prefix}q",
                        "LOUSHO_MAX_INPUT_MESSAGES": "2", "LOUSHO_MAX_BUSINESS_STATE_CHARS": "10"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    client = LoushoSettings().client()

    with pytest.raises(InputTooLargeError, match="over the limit of 2 "):
        client.enqueue("jobs", ["a", "b", "c"], require_worker=False)
    with pytest.raises(InputTooLargeError, match="over the limit of 10 "):
        client.enqueue("jobs", "hi", business_state={"k": "0123456789"}, require_worker=False)
    assert everything(client) == {b"queue length": b"0"}


async def test_the_web_app_answers_413_without_echoing_and_refuses_a_huge_body_before_reading_it(
    limited: Client,
) -> None:
    from examples.webapp.app import create_app

    before = everything(limited)
    app = create_app(limited, max_body_bytes=64 * 1024)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://webapp.test") as http:
        big_input = await http.post("/jobs", json={"agent": "jobs", "input": SECRET_PART * 200})
        big_agent = await http.post("/jobs", json={"agent": SECRET_PART * 100, "input": "hi"})
        big_body = await http.post("/jobs", json={"agent": "jobs", "input": SECRET_PART * 100_000})
        wrong_type = await http.post("/jobs", json={"agent": "jobs", "input": [SECRET_PART] * 100})

    assert [a.status_code for a in (big_input, big_agent, big_body)] == [413, 413, 413]
    assert {a.json()["error"] for a in (big_input, big_agent, big_body)} == {"LOUSHO_INPUT_TOO_LARGE"}
    assert wrong_type.status_code == 422  # FastAPI's own check, without the `input` it quotes by default
    assert all(SECRET_PART not in a.text for a in (big_input, big_agent, big_body, wrong_type))
    assert everything(limited) == before


async def test_the_web_apps_limits_come_from_the_environment(
    redis_url: str, redis_prefix: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.webapp.app import create_app

    for name, value in {"LOUSHO_REDIS_URL": redis_url, "LOUSHO_PREFIX": redis_prefix, "LOUSHO_QUEUE": f"{redis_prefix}q",
                        "LOUSHO_MAX_INPUT_CHARS": "100", "LOUSHO_MAX_AGENT_NAME_CHARS": "10"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app()), base_url="http://webapp.test"
    ) as http:
        long_input = await http.post("/jobs", json={"agent": "jobs", "input": "x" * 101})
        long_agent = await http.post("/jobs", json={"agent": "j" * 11, "input": "hi"})

    assert long_input.status_code == 413 and "over the limit of 100 " in long_input.json()["detail"]
    assert long_agent.status_code == 413 and "over the limit of 10 " in long_agent.json()["detail"]
