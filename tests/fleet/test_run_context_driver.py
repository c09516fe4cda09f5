"""The run context on resume, on the fleet (issue #16): a session started in a process with a context
(`context=`), then resumed by the fleet after a crash or after an approval decided over the `Client`,
gives its tools the saved context (`ctx.metadata`), for a static agent and a dynamic one. On the driver
(`lousho.testing.fleet`): the real task bodies, Lua scripts and Redis."""

from __future__ import annotations

import asyncio

import pytest

from lousho import AgentExecutor
from lousho.fleet import FleetSettings
from lousho.stores.redis import RedisStore
from lousho.testing.fleet import FleetDriver
from tests.engine.test_run_context_on_resume import ACME, Remember, crashed_run, one_call

SETTINGS = FleetSettings(lease_ttl_s=60.0)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_crash_resume_on_the_fleet_gives_tools_the_saved_run_context(
    redis_url: str, redis_store: RedisStore, dynamic: bool
) -> None:
    tool, provider = Remember(dynamic=dynamic, crash_once=("c1",)), one_call()
    with FleetDriver(agents=[tool.agent], redis_url=redis_url, store=redis_store, provider=provider,
                     settings=SETTINGS) as driver:  # fmt: skip
        asyncio.run(crashed_run(redis_store, tool, provider))
        driver.client.resume("s")  # the fleet takes the crashed run over
        driver.run_until_idle()

        assert driver.client.status("s").status == "finished"
    assert tool.seen == [("c1", ACME), ("c1", ACME)]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_an_approval_decided_on_the_fleet_gives_tools_the_saved_run_context(
    redis_url: str, redis_store: RedisStore, dynamic: bool
) -> None:
    tool, provider = Remember(dynamic=dynamic, gated=True), one_call()
    with FleetDriver(agents=[tool.agent], redis_url=redis_url, store=redis_store, provider=provider,
                     settings=SETTINGS) as driver:  # fmt: skip
        paused = asyncio.run(
            AgentExecutor.execute(
                agent=tool.agent, input="go", provider=provider, session_id="s",
                checkpoint_store=redis_store.checkpoints, approval_store=redis_store.approvals, context=ACME,
            )
        )  # fmt: skip
        assert paused.approval_id is not None
        driver.client.resolve_approval(paused.approval_id, approved=True)
        driver.run_until_idle()

        assert driver.client.status("s").status == "finished"
    assert tool.seen == [("c1", ACME)]
