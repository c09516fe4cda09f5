"""A worker's side of the fleet-wide limits (issue #29, `lousho.fleet.limits`).

- `FleetProvider` wraps the provider a fleet's model turn asks (`SessionSteps.make_run`): before each
  request it takes one request and the turn's estimated tokens from the model's `RateLimit` (one Lua script,
  fleet/lua/rate_take.lua), waiting with `asyncio.sleep` while the window is full (the event loop goes on with
  the other turns; the step's heartbeat keeps the session's lease); after the answer it corrects the count
  with the real usage. A vendor's 429 is waited out here too, for `FleetLimits.rate_limited_wait_s` of the
  runtime's clock from the first 429, each wait at least the vendor's `Retry-After` and an exponential step,
  with jitter (`lousho.backoff`), and the same call is made again: the wait uses up no `RetryPolicy` attempt
  and no poison attempt (the turn's start was counted once, as its task took the lease), and the turn is
  generated once, by the answer saved.
- `take_slot` / `wait_for_slot` / `settle_slot`: a session's slot among its agent's sessions in flight.
  A model turn that finds none free gives its lease back, takes back the start it counted, and is sent
  again after `slot_retry_s` and up to half that again, drawn at random (a Celery countdown), its in-flight
  deadline pushed past that: a worker process is not held by a session that cannot go on, and no turn
  starves the tool calls that would free a slot. The slot comes back when its session finishes, pauses, parks, is aborted or fails, or
  when nothing refreshed it for `slot_ttl_s` (its worker died).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from redis.commands.core import Script

from lousho.backoff import exponential_s, jittered_s
from lousho.errors import ProviderError, StoreUnavailableError
from lousho.fleet.dispatch import model_turn_task, send
from lousho.fleet.limits import (
    RateLimit,
    rate_limit_key,
    rate_waiting_key,
    session_slots_key,
    slot_queue_key,
    slot_waiting_key,
)
from lousho.providers.base import LLMProvider, ModelRequest, ModelResponse, StreamingProvider, can_stream
from lousho.stores.redis_common import load_script, redis_errors, run_script_many

if TYPE_CHECKING:
    from lousho.worker.runtime import FleetRuntime
    from lousho.worker.steps import SessionSteps

__all__ = [
    "FleetProvider",
    "estimate_tokens",
    "fleet_provider",
    "note_session",
    "settle_slot",
    "take_slot",
    "touch_slots",
    "wait_for_slot",
]

log = logging.getLogger("lousho.worker")

RATE_LIMITED_STEP_S = 1.0
"""The first exponential step of a turn's waits on a vendor's 429s (`lousho.backoff`), doubled at each 429..."""
RATE_LIMITED_CAP_S = 30.0
"""...up to this. A `Retry-After` the vendor sends is a floor the wait keeps."""
WAITING_MARGIN_MS = 5000
"""A waiter still counts as waiting this long past the end of its wait (it is about to try again)."""
SLOT_DONE = frozenset({"finished", "awaiting-approval", "parked", "aborted", "unknown-session"})
"""The outcomes of a step after which its session is not being worked on: its slot comes back."""

_held: OrderedDict[str, str] = OrderedDict()
"""Session -> its agent's slots key, for the sessions this process works on (`note_session`) or took a slot for:
the heartbeats of their work refresh the slot. Bounded: an entry of a session gone elsewhere costs a no-op."""
_HELD_MAX = 10_000
_held_lock = threading.Lock()
"""A worker process may run tasks on several threads (`-P threads`, the lead's pool of issue #29)."""


@functools.lru_cache(maxsize=32)
def _script(client: Any, name: str) -> Script:
    return load_script(client, f"lousho.fleet:{name}")


def estimate_tokens(request: ModelRequest) -> int:
    """A turn's tokens before it is asked: about 4 characters a token over what is sent (the answer's
    real usage corrects the count after)."""
    chars = sum(
        len(m.content or "") + sum(len(json.dumps(c.arguments)) for c in m.tool_calls) for m in request.messages
    )
    chars += sum(len(t.name) + len(t.description) + len(json.dumps(t.parameters)) for t in request.tools)
    return max(1, math.ceil(chars / 4))


class FleetProvider:
    """The provider of a fleet's model turn: the agent's own, behind the fleet's rate limit and 429 waits."""

    def __init__(self, inner: LLMProvider, runtime: FleetRuntime, session_id: str) -> None:
        self.inner = inner
        self.runtime = runtime
        self.session_id = session_id
        self.client = runtime.store.client
        self.keys = runtime.store.keys

    async def generate(
        self, request: ModelRequest, whole: Callable[[], Awaitable[ModelResponse]] | None = None
    ) -> ModelResponse:
        """The inner provider's answer, behind the fleet's rate limit and 429 waits. `whole`: how to ask instead
        (`stream`'s: the inner stream, gathered). No coroutine between the turn and the inner provider's: a step
        in flight holds each frame of its await chain (issue #29)."""
        limits, clock = self.runtime.limits, self.runtime.clock
        limit = limits.rate_limits.get(request.model)
        first_429_at: float | None = None
        attempt = 0
        while True:
            taken = await self._take(request.model, limit, estimate_tokens(request)) if limit else None
            try:
                response = await (whole() if whole is not None else self.inner.generate(request))
            except ProviderError as exc:
                if exc.status != 429:
                    raise
                now = clock.monotonic()
                first_429_at = now if first_429_at is None else first_429_at
                left_s = limits.rate_limited_wait_s - (now - first_429_at)
                if left_s <= 0:
                    raise
                attempt += 1
                step_s = exponential_s(attempt, base_s=RATE_LIMITED_STEP_S, cap_s=RATE_LIMITED_CAP_S)
                delay_s = min(jittered_s(floor_s=exc.retry_after_s or 0.0, step_s=step_s), left_s)
                log.info("session %s: %s; waiting %.1f s, then the same call again", self.session_id, exc, delay_s)
                if limit is not None and taken is not None:  # the vendor used no tokens; the others wait too
                    self._correct(request.model, taken, -taken[1])
                    self._block(request.model, limit, delay_s)
                await clock.sleep(delay_s)
                continue
            if limit is not None and taken is not None and response.usage is not None:
                used = response.usage.input_tokens + response.usage.output_tokens
                if used:
                    self._correct(request.model, taken, used - taken[1])
            return response

    async def _take(self, model: str, limit: RateLimit, tokens: int) -> tuple[str, int]:
        """Take one request and `tokens` from `model`'s limit, waiting while it is full: (window start, tokens)."""
        script = _script(self.client, "rate_take")
        keys = [rate_limit_key(self.keys, model), rate_waiting_key(self.keys, model)]
        args = [limit.requests_per_minute or 0, limit.tokens_per_minute or 0, limit.window_ms, tokens]
        try:
            while True:
                with redis_errors(self.client, f"take from the rate limit of model {model!r}"):
                    wait_ms, start = cast(
                        list[int], script(keys=keys, args=[*args, self.session_id, WAITING_MARGIN_MS])
                    )
                if int(wait_ms) <= 0:
                    return str(start), tokens
                # The turns a full window (or a vendor's 429) holds do not all come back at one instant.
                await self.runtime.clock.sleep(jittered_s(floor_s=int(wait_ms) / 1000 + 0.005))
        except BaseException:  # aborted while waiting (or Redis failed): no longer waiting
            with redis_errors(self.client, f"stop waiting on the rate limit of model {model!r}"):
                self.client.zrem(keys[1], self.session_id)
            raise

    def _correct(self, model: str, taken: tuple[str, int], delta: int) -> None:
        if delta:
            with redis_errors(self.client, f"correct the token count of model {model!r}"):
                _script(self.client, "rate_correct")(keys=[rate_limit_key(self.keys, model)], args=[taken[0], delta])

    def _block(self, model: str, limit: RateLimit, delay_s: float) -> None:
        with redis_errors(self.client, f"hold the rate limit of model {model!r}"):
            args = [max(1, round(delay_s * 1000)), limit.window_ms]
            _script(self.client, "rate_block")(keys=[rate_limit_key(self.keys, model)], args=args)


class FleetStreamingProvider(FleetProvider):
    """`FleetProvider` of a provider that streams: the stream is asked behind the same limit and 429 waits."""

    inner: StreamingProvider

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        deltas: asyncio.Queue[str | None] = asyncio.Queue()

        async def whole() -> ModelResponse:
            response: ModelResponse | None = None
            async for chunk in self.inner.stream(request):
                if isinstance(chunk, ModelResponse):
                    response = chunk
                elif chunk:
                    deltas.put_nowait(chunk)
            if response is None:
                raise ProviderError("the provider's stream ended without a complete response", retryable=True)
            return response

        asked = asyncio.ensure_future(self.generate(request, whole))
        asked.add_done_callback(lambda _: deltas.put_nowait(None))
        try:
            while (chunk := await deltas.get()) is not None:
                yield chunk
            yield await asked
        finally:
            asked.cancel()


def fleet_provider(runtime: FleetRuntime, provider: LLMProvider, session_id: str) -> FleetProvider:
    """The provider a model turn of `session_id` asks on the fleet (issue #29)."""
    if can_stream(provider):
        return FleetStreamingProvider(provider, runtime, session_id)
    return FleetProvider(provider, runtime, session_id)


# -- sessions in flight ----------------------------------------------------------------------


def _slots_of(steps: SessionSteps) -> tuple[int, str] | None:
    """The agent's maximum and slots key, when the session counts against one (a sub-agent's session
    does not: its parent holds a slot, and counting both could leave parents waiting on their children)."""
    limit = steps.runtime.limits.max_sessions_in_flight.get(steps.agent_name or "")
    if limit is None or steps.parent_session_id is not None or steps.agent_name is None:
        return None
    return limit, session_slots_key(steps.runtime.store.keys, steps.agent_name)


def take_slot(steps: SessionSteps) -> bool:
    """Take (or refresh) the session's slot before a model turn; False when none is free."""
    slots = _slots_of(steps)
    if slots is None:
        return True
    limit, key = slots
    runtime, client = steps.runtime, steps.runtime.store.client
    waiting_ms = round(runtime.limits.slot_retry_s * 1000) + runtime.settings.lease_ttl_ms + WAITING_MARGIN_MS
    agent = steps.agent_name or ""
    keys = [key, slot_waiting_key(runtime.store.keys, agent), slot_queue_key(runtime.store.keys, agent)]
    with redis_errors(client, f"take a slot of agent {agent!r} for session {steps.session_id!r}"):
        args: list[str | int] = [limit, steps.session_id, runtime.limits.slot_ttl_ms, waiting_ms]
        taken = bool(_script(client, "slot_take")(keys=keys, args=args))
    if taken:
        _remember(steps.session_id, key)
    return taken


def _remember(session_id: str, key: str) -> None:
    with _held_lock:
        _held[session_id] = key
        _held.move_to_end(session_id)
        while len(_held) > _HELD_MAX:
            _held.popitem(last=False)


def note_session(steps: SessionSteps) -> None:
    """This process works on the session now (a model turn, a tool call): its heartbeats refresh the session's
    slot, if it holds one (`touch_slots` never takes one)."""
    slots = _slots_of(steps)
    if slots is not None:
        _remember(steps.session_id, slots[1])


def wait_for_slot(steps: SessionSteps, turn: int, counted: bool) -> str:
    """No slot is free for model turn `turn`: take back its counted start (waiting is no attempt), push the
    session's in-flight deadline past the wait (the reaper leaves it alone), and send the turn again after
    `slot_retry_s` with jitter (the turns that found no slot at one instant do not all come back at the next).
    The caller returns, and its step gives the lease back."""
    runtime = steps.runtime
    if counted:
        steps.count_attempt(f"turn:{turn}", -1)
    delay_ms = round(jittered_s(floor_s=runtime.limits.slot_retry_s) * 1000)
    runtime.inflight.touch(
        steps.session_id, runtime.inflight.server_time_ms() + delay_ms + runtime.settings.lease_ttl_ms
    )
    send(runtime.app, model_turn_task(steps.session_id, turn), runtime.settings.queue, countdown_s=delay_ms / 1000)
    return "waiting-for-slot"


def settle_slot(steps: SessionSteps, outcome: str | None) -> None:
    """After a step: give the session's slot back when it is no longer worked on (`SLOT_DONE`, or None: the
    step failed; the reaper sends it again, and its next model turn takes a slot again)."""
    if outcome is not None and outcome not in SLOT_DONE:
        return
    slots = _slots_of(steps)
    with _held_lock:
        _held.pop(steps.session_id, None)
    if slots is None:
        return
    client, keys, agent = steps.runtime.store.client, steps.runtime.store.keys, steps.agent_name or ""
    try:
        with redis_errors(client, f"give back the slot of session {steps.session_id!r}"):
            pipe = client.pipeline(transaction=False)  # one hash tag: one slot on a Cluster too
            for key in (slots[1], slot_waiting_key(keys, agent), slot_queue_key(keys, agent)):
                pipe.zrem(key, steps.session_id)  # a waiter aborted or parked leaves the queue too
            pipe.execute()
    except StoreUnavailableError as exc:  # it expires by itself, `slot_ttl_s` after its last refresh
        log.warning("%s", exc)


def touch_slots(runtime: FleetRuntime, session_ids: list[str]) -> None:
    """A heartbeat of the sessions' work: push the expiry of each slot this process took for one, in one round
    trip (worker/heartbeat.py)."""
    held = [(session_id, key) for session_id in session_ids if (key := _held.get(session_id)) is not None]
    if not held:
        return
    client = runtime.store.client
    calls = [((key,), (session_id, runtime.limits.slot_ttl_ms)) for session_id, key in held]
    with redis_errors(client, f"refresh the slots of {len(held)} sessions"):
        replies = run_script_many(client, _script(client, "slot_touch"), calls)
    for (session_id, _), reply in zip(held, replies, strict=True):
        if isinstance(reply, Exception):
            log.warning("refreshing the slot of session %r failed: %s", session_id, reply)
