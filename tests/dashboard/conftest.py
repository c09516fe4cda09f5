"""Stores with sessions in them, for the dashboard's page tests: a finished trip, a paused charge (issue #19)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from lousho import Agent, AgentExecutor
from lousho.providers.scripted import ScriptedProvider, tool_calls
from lousho.scheduler.client import Client
from lousho.settings import store_from_url
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url
from tests.fixtures.core import ToolLog, charge_tool, weather_tool
from tests.fleet.conftest import fleet  # noqa: F401  (the real fleet, for the browser test)

WEATHER = ("call_weather", "weather", {"city": "Oslo"})
CHARGE = ("call_charge", "charge_card", {"amount": 40})


def trip_agent() -> Agent:
    log = ToolLog()
    return Agent(
        name="planner",
        model="test-model",
        instructions="You plan trips.",
        tools=[weather_tool(log), charge_tool(log)],
    )


async def fill(store: Any) -> None:
    """`trip`: weather then an answer (finished); `pay`: a charge that waits on approval."""
    agent = trip_agent()
    for session_id, answers in (
        ("trip", [tool_calls(WEATHER), "Pack sunscreen."]),
        ("pay", [tool_calls(CHARGE), "Charged."]),
    ):
        await AgentExecutor.execute(
            agent=agent,
            input="Plan my trip",
            provider=ScriptedProvider(answers),
            session_id=session_id,
            checkpoint_store=store.checkpoints,
            approval_store=store.approvals,
        )


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    store = store_from_url(f"sqlite:///{tmp_path / 'dash.db'}")
    asyncio.run(fill(store))
    return store


@pytest.fixture
def fleet_store(redis_url: str, redis_prefix: str, redis_client: redis.Redis) -> Iterator[tuple[RedisStore, Client]]:
    """A fleet's RedisStore and its `Client`, with no worker: decisions land on a private queue."""
    store = RedisStore(redis_client, prefix=redis_prefix)
    asyncio.run(fill(store))
    queue = f"lousho-dash-{uuid.uuid4().hex[:12]}"
    client = Client(broker=broker_url(redis_url), store=store, settings=FleetSettings(queue=queue))
    yield store, client
    redis_client.delete(queue)
