"""What a worker process keeps of sessions it served (issue #29): a fleet process serves thousands of sessions,
so what it holds must follow the sessions in flight, not every session it ever saw. On the driver
(`lousho.testing.fleet`): the real task bodies, Lua scripts and Redis."""

from __future__ import annotations

from pydantic import BaseModel

from lousho import Agent, ToolContext, define_tool
from lousho.fleet import FleetSettings
from lousho.providers import ScriptedProvider, tool_calls
from lousho.stores.redis import RedisStore
from lousho.testing.fleet import FleetDriver


class Echo(BaseModel):
    text: str


async def echo(args: Echo, ctx: ToolContext) -> str:
    return args.text


AGENT = Agent(
    name="echoer",
    model="scripted",
    tools=[define_tool(name="echo", description="Echoes", input=Echo, execute=echo)],
)


def test_a_worker_forgets_a_sessions_transcript_once_its_step_ends(redis_url: str, redis_store: RedisStore) -> None:
    """The session's next step runs on any process of the fleet: a transcript kept for it would sit in this one
    meanwhile, several sessions' for each step in flight."""
    provider = ScriptedProvider([tool_calls(("c1", "echo", {"text": "hi"})), "done"], by_turn=True)
    with FleetDriver(agents=[AGENT], redis_url=redis_url, store=redis_store, provider=provider,
                     settings=FleetSettings(lease_ttl_s=60.0)) as driver:  # fmt: skip
        cache = driver.worker("w1").lousho_runtime.store.checkpoints.reader.cache
        driver.client.enqueue("echoer", "go", session_id="s")
        [first] = driver.pending()
        driver.deliver(first)
        assert driver.client.status("s").status == "in-progress"
        assert cache.get("s") is None, "between two steps, the process keeps no transcript of the session"

        driver.run_until_idle()

        assert driver.client.status("s").status == "finished"
        assert cache.get("s") is None


def test_a_scripted_provider_without_recording_keeps_no_request(redis_url: str, redis_store: RedisStore) -> None:
    """Each request holds its transcript: a worker on a recording `ScriptedProvider` holds every one it was asked
    (the benchmarks' workers pass `record_calls=False`)."""
    provider = ScriptedProvider([tool_calls(("c1", "echo", {"text": "hi"})), "done"], by_turn=True, record_calls=False)
    with FleetDriver(agents=[AGENT], redis_url=redis_url, store=redis_store, provider=provider,
                     settings=FleetSettings(lease_ttl_s=60.0)) as driver:  # fmt: skip
        driver.client.enqueue("echoer", "go", session_id="s")
        driver.run_until_idle()

        assert driver.client.status("s").status == "finished"
    assert provider.answered == 2
    assert provider.calls == []
