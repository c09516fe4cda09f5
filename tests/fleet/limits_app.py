"""The app of the fleet-wide limits tests' worker processes (issue #29), configured by environment variables.

Its agent `greeter` asks a real `OpenAIProvider` (the official SDK) pointed at the test's local fake OpenAI
server (`LOUSHO_TEST_LLM_URL`), so every model request a worker makes is seen and counted by the test.
`LOUSHO_TEST_LIMITS` is a JSON object: `rpm`, `tpm`, `window_s` (a `RateLimit` on the agent's model) and
`max_sessions` (the agent's `max_sessions_in_flight`).
"""

from __future__ import annotations

import json
import os

from pydantic import BaseModel

from lousho import Agent, define_tool
from lousho.fleet.limits import FleetLimits, RateLimit
from lousho.providers.openai import OpenAIProvider
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url, create_app

URL = os.environ["LOUSHO_TEST_FLEET_REDIS"]
MODEL = "gpt-limits-test"
CONFIG = json.loads(os.environ.get("LOUSHO_TEST_LIMITS") or "{}")


class Note(BaseModel):
    text: str


class Charge(BaseModel):
    amount: int


greeter = Agent(
    name="greeter",
    model=MODEL,
    instructions="You greet.",
    tools=[
        define_tool(name="note", description="Take a note", input=Note, execute=lambda args, ctx: {"noted": args.text}),
        define_tool(
            name="charge",
            description="Charge money",
            input=Charge,
            needs_approval=True,
            execute=lambda args, ctx: {"charged": args.amount},
        ),
    ],
)
rate = RateLimit(
    requests_per_minute=CONFIG.get("rpm"), tokens_per_minute=CONFIG.get("tpm"), window_s=CONFIG.get("window_s", 60.0)
)
limits = FleetLimits(
    rate_limits={MODEL: rate} if CONFIG.get("rpm") or CONFIG.get("tpm") else {},
    max_sessions_in_flight={"greeter": CONFIG["max_sessions"]} if CONFIG.get("max_sessions") else {},
    slot_retry_s=0.2,
)
store = RedisStore(URL, prefix=os.environ["LOUSHO_TEST_FLEET_PREFIX"])
app = create_app(
    agents=[greeter],
    store=store,
    broker=broker_url(URL),
    provider=OpenAIProvider(MODEL, base_url=os.environ["LOUSHO_TEST_LLM_URL"], api_key="test"),
    # A long lease: these tests are about limits, and run no reaper. With a 2 s lease a worker starved of the CPU
    # (four pytest processes on two cores, issue #33) lost its turn's lease mid-request, its save was refused, and
    # with no reaper to send the turn again the session waited for ever.
    settings=FleetSettings(lease_ttl_s=30.0, reaper_interval_s=0.5, queue=os.environ["LOUSHO_TEST_FLEET_QUEUE"]),
    limits=limits,
)
