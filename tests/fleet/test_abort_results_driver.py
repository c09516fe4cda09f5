"""Reference: 'An aborted call gets a cancelled result' on the fleet (issue #16): a web app's
`Client.abort` while the call runs reaches the tool's `ctx.signal` through the worker's heartbeat;
whatever the tool then does (raises, returns, raises `PropagatingToolError`), the call's one result is
`cancelled`. On the driver (`lousho.testing.fleet`): the real task bodies, Lua scripts and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lousho import Agent, ToolContext, define_tool
from lousho.engine import CANCELLED_RESULT
from lousho.fleet import FleetSettings
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.redis import RedisStore
from lousho.testing.fleet import FleetDriver
from tests.engine.test_abort_results import _stop_how
from tests.fixtures.core import CityArgs

# The heartbeat is what brings a `Client.abort` to a running tool: beat often, so the test is quick.
SETTINGS = FleetSettings(lease_ttl_s=60.0, heartbeat_interval_s=0.05)


class Aborting:
    """A `slow` tool that has the session aborted (as a web app would) while it runs, then stops `how`."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.driver: FleetDriver | None = None
        self.ran: list[str] = []
        tools = [define_tool(name="slow", description="", input=CityArgs, execute=self.slow)]
        self.agent = Agent(name="jobs", model="scripted", tools=tools)

    async def slow(self, args: CityArgs, ctx: ToolContext) -> Any:
        assert self.driver is not None and ctx.session_id is not None
        self.ran.append(ctx.tool_call_id)
        assert self.driver.client.abort(ctx.session_id)
        await ctx.signal.wait()  # the driver gives up on a task after 30 s, should the abort never come
        return await _stop_how(self.how)


@pytest.fixture(params=["raises", "returns", "raises-propagating"])
def aborting(request: pytest.FixtureRequest, redis_url: str, redis_store: RedisStore) -> Iterator[Aborting]:
    tool = Aborting(request.param)
    provider = ScriptedProvider([tool_calls(("c1", "slow", {"city": "x"}), ("c2", "slow", {"city": "y"}))])
    with FleetDriver(agents=[tool.agent], redis_url=redis_url, store=redis_store, provider=provider,
                     settings=SETTINGS) as driver:  # fmt: skip
        tool.driver = driver
        yield tool


def test_a_call_aborted_on_the_fleet_gets_the_cancelled_result_whatever_the_tool_then_does(aborting: Aborting) -> None:
    assert aborting.driver is not None
    client = aborting.driver.client
    client.enqueue("jobs", "go", session_id="s")
    aborting.driver.run_until_idle()

    checkpoint = client.checkpoint("s")
    assert checkpoint is not None and checkpoint.status == "in-progress"
    results = {m.tool_call_id: m.result() for m in checkpoint.messages if m.role == "tool"}
    assert results == {"c1": CANCELLED_RESULT, "c2": CANCELLED_RESULT}
    assert aborting.ran == ["c1"]
    status = client.status("s")
    assert status.aborted and status.status == "in-progress"  # not parked: the abort won
