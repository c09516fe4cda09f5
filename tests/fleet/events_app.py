"""The app of the live-event tests' workers (issue #34): a model that streams, slowly enough to watch.

`writer` answers each user message with a text made from it, streamed in `LOUSHO_TEST_DELTAS` pieces (default 20),
one every `LOUSHO_TEST_DELTA_DELAY_S` (default 0.05 s). A test makes the worker die mid-stream by adding
`die:<session>` to the Redis set `<prefix>test:kill`: the worker that streams that session's answer takes the
trigger (once) and SIGKILLs itself after `LOUSHO_TEST_DIE_AFTER` pieces (default 5). `quiet` is the same agent with
`stream_events=False`. With `fail:<session>` in that set, the stream fails once after `LOUSHO_TEST_DIE_AFTER` pieces
with a retryable provider error (a vendor's 529 mid-answer): the engine asks the model again within the same attempt.
While a session is in the set `<prefix>test:gate`, its model waits before it streams (a test's browser loads first). Environment as `tests/fleet/fleet_app.py`'s (`LOUSHO_TEST_FLEET_REDIS`, `..._PREFIX`,
`..._QUEUE`, `..._BROKER`).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

from lousho import Agent, Message, ModelRequest, ModelResponse
from lousho.errors import ProviderError
from lousho.providers.scripted import split_text
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings, broker_url, create_app

URL = os.environ["LOUSHO_TEST_FLEET_REDIS"]
PREFIX = os.environ["LOUSHO_TEST_FLEET_PREFIX"]
DELTAS = int(os.environ.get("LOUSHO_TEST_DELTAS", "20"))
DELTA_DELAY_S = float(os.environ.get("LOUSHO_TEST_DELTA_DELAY_S", "0.05"))
DIE_AFTER = int(os.environ.get("LOUSHO_TEST_DIE_AFTER", "5"))
store = RedisStore(URL, prefix=PREFIX)


def answer_to(request: ModelRequest) -> str:
    asked = next(m.content for m in reversed(request.messages) if m.role == "user")
    return f"Answer to {asked!r}: " + " ".join(f"word{i}" for i in range(60)) + "."


class SlowStreamingModel:
    async def generate(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(message=Message.assistant(answer_to(request)))

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        session = request.session_id or ""
        die = bool(store.client.srem(f"{PREFIX}test:kill", f"die:{session}"))
        fail = bool(store.client.srem(f"{PREFIX}test:kill", f"fail:{session}"))
        for _ in range(1200):  # at most 60 s while the session is in the gate set: the test opens its reader first
            if not store.client.sismember(f"{PREFIX}test:gate", session):
                break
            await asyncio.sleep(0.05)
        for n, piece in enumerate(split_text(answer_to(request), DELTAS), start=1):
            await asyncio.sleep(DELTA_DELAY_S)
            yield piece
            if fail and n == DIE_AFTER:
                raise ProviderError("overloaded mid-answer", retryable=True, status=529)
            if die and n == DIE_AFTER:
                await asyncio.sleep(0.2)  # the pieces so far are written (a flush interval is 0.05 s)
                os.kill(os.getpid(), signal.SIGKILL)
        yield await self.generate(request)


SETTINGS = FleetSettings(lease_ttl_s=2.0, reaper_interval_s=0.5, requeue_backoff_s=3.0, queue=os.environ["LOUSHO_TEST_FLEET_QUEUE"])
writer = Agent(name="writer", model="slow", instructions="Answer.")
quiet = Agent(name="quiet", model="slow", instructions="Answer.", stream_events=False)
app = create_app(agents=[writer, quiet], store=store, broker=os.environ.get("LOUSHO_TEST_FLEET_BROKER") or broker_url(URL),
                 provider=SlowStreamingModel(), settings=SETTINGS)
