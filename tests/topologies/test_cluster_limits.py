"""The fleet-wide limits on a Redis Cluster (issue #29): a private 6-node cluster (`lousho.testing.redis_cluster`).

Each limit is one hash tag: its keys share a slot, and every script of the limits (take, correct, hold after a
429, take and refresh a slot) runs on the cluster, which refuses a script touching two slots (CROSSSLOT).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from lousho import Message
from lousho.errors import ProviderError
from lousho.fleet.limits import (
    FleetLimits,
    RateLimit,
    limits_usage,
    rate_limit_key,
    rate_waiting_key,
    session_slots_key,
    slot_queue_key,
    slot_waiting_key,
)
from lousho.providers.base import ModelRequest, ModelResponse
from lousho.stores.redis import RedisStore
from lousho.stores.redis_slots import key_slot
from lousho.testing.redis_cluster import RedisClusterNodes
from lousho.worker import FleetSettings
from lousho.worker.limits import fleet_provider, settle_slot, take_slot, touch_slots
from lousho.worker.runtime import FleetRuntime
from lousho.worker.steps import SessionSteps
from tests.topologies.cluster_fleet import require_cluster_binaries

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterNodes]:
    require_cluster_binaries()
    with RedisClusterNodes() as nodes:
        yield nodes


class BusyOnce:
    """A vendor that answers 429 with Retry-After once, then answers."""

    def __init__(self) -> None:
        self.asked = 0

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.asked += 1
        if self.asked == 1:
            raise ProviderError("HTTP 429: rate limited", retryable=True, status=429, retry_after_s=0.05)
        return ModelResponse(message=Message.assistant("hi"))


def test_each_limit_lives_in_one_slot_and_its_scripts_run_on_a_cluster(cluster: RedisClusterNodes) -> None:
    store = RedisStore(cluster.url, prefix=f"lousho-test-{uuid.uuid4().hex[:8]}:")
    keys = store.keys
    for model in ("gpt-4o-mini", "claude-sonnet-4-5", "meta/llama {3}"):
        assert key_slot(rate_limit_key(keys, model)) == key_slot(rate_waiting_key(keys, model))
    assert key_slot(session_slots_key(keys, "booker")) == key_slot(slot_waiting_key(keys, "booker"))
    assert key_slot(session_slots_key(keys, "booker")) == key_slot(slot_queue_key(keys, "booker"))
    assert len({key_slot(rate_limit_key(keys, m)) for m in ("a", "b", "c", "d", "e", "f")}) > 1  # spread out

    limits = FleetLimits(
        rate_limits={"gpt-test": RateLimit(requests_per_minute=5, tokens_per_minute=10_000)},
        max_sessions_in_flight={"booker": 1},
    )
    runtime = FleetRuntime(store=store, settings=FleetSettings(), limits=limits)
    vendor = BusyOnce()
    request = ModelRequest(model="gpt-test", messages=[Message.user("hello")])
    answer = asyncio.run(fleet_provider(runtime, vendor, "s1").generate(request))
    assert answer.message.content == "hi" and vendor.asked == 2  # the 429 waited out (rate_block.lua)

    steps, other = SessionSteps(runtime, "s1"), SessionSteps(runtime, "s2")
    steps.agent_name = other.agent_name = "booker"
    assert take_slot(steps) and not take_slot(other)
    touch_slots(runtime, ["s1"])
    entries = {"w": {"limits": limits.describe()}}
    [rate], [slots] = limits_usage(store.client, keys, entries, runtime.inflight.server_time_ms())
    assert (rate.requests, slots.in_flight, slots.waiting) == (2, 1, 1)  # the 429's request counts too
    settle_slot(steps, "finished")
    assert take_slot(other)  # s2, first in the queue
    settle_slot(other, "aborted")
