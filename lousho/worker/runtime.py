"""What a worker process knows: its agents, the store, the settings, and its event loops.

Celery runs tasks synchronously; the engine is async. On lousho's pool (`pool.py`, the default) a
task's coroutine runs on the process's one loop beside every other task's. On Celery's pools each
thread keeps one long-lived event loop (made after the fork) and runs its tasks' coroutines on it:
one loop per thread, so `-P threads` works (issue #29: a loop shared by threads raised "This event
loop is already running").
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import threading
import weakref
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lousho.backoff import Clock, MonotonicClock
from lousho.definition import Agent, ResolvedAgent
from lousho.errors import ConfigurationError
from lousho.fleet.inflight import InflightIndex
from lousho.fleet.keys import FleetKeys
from lousho.fleet.limits import FleetLimits
from lousho.fleet.settings import FleetSettings
from lousho.providers.base import LLMProvider
from lousho.stores.redis import RedisStore
from lousho.worker.outbox import Outbox
from lousho.worker.pool import await_on_loop, on_pool_loop
from lousho.worker.running import name_connections
from lousho.worker.scripts import FleetScripts

__all__ = ["FleetKeys", "FleetRuntime", "UnknownAgentError"]

T = TypeVar("T")


class UnknownAgentError(ConfigurationError):
    """A job names an agent this fleet does not serve."""

    code = "LOUSHO_UNKNOWN_AGENT"


def _provider_of(entry: Any, default: LLMProvider | None) -> tuple[Agent, LLMProvider]:
    agent = getattr(entry, "definition", entry)
    provider = getattr(entry, "provider", None) or default
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"create_app(agents=...) takes Agent or create_agent() objects, not {entry!r}")
    if provider is None:
        raise ConfigurationError(
            f"agent {agent.name!r} has no provider: pass provider= to create_app or use create_agent"
        )
    return agent, provider


@dataclass
class FleetRuntime:
    store: RedisStore
    settings: FleetSettings
    agents: dict[str, tuple[Agent, LLMProvider]] = field(default_factory=dict)
    app: Any = None
    on_event: Any = None
    """Called with every event of every run on this worker (logging, metrics)."""
    queue_named: bool = True
    """Whether `settings.queue` was given, not named after the agents by `create_app` (issue #15)."""
    limits: FleetLimits = field(default_factory=FleetLimits)
    """Fleet-wide limits: rate limits per model, sessions in flight per agent (issue #29)."""
    clock: Clock = field(default_factory=MonotonicClock)
    """The time the fleet's waits in a worker read and sleep on (a vendor's 429s, a full rate window)."""
    _loops: threading.local = field(default_factory=threading.local)
    """This thread's event loop, on Celery's pools (`run`)."""
    _made: list[asyncio.AbstractEventLoop] = field(default_factory=list)
    """Every loop made, to close (`close`)."""
    hearts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = field(default_factory=weakref.WeakKeyDictionary)
    """Each event loop's heart, which beats the work in flight on it (worker/heartbeat.py, issue #29)."""
    _named_pid: int = 0
    _resolved: dict[str, ResolvedAgent] = field(default_factory=dict)

    @classmethod
    def build(
        cls, agents: Sequence[Any], store: RedisStore, settings: FleetSettings, provider: LLMProvider | None
    ) -> FleetRuntime:
        runtime = cls(store=store, settings=settings)
        for entry in agents:
            runtime.serve(*_provider_of(entry, provider))
        return runtime

    def serve(self, agent: Agent, provider: LLMProvider) -> None:
        """Serve `agent`, and its sub-agents (`agent_tool`) with the same provider: on the fleet a
        sub-agent runs as a session of its own, which any worker picks up by the agent's name (issue #14).
        A dynamic agent's tools are known per run: its sub-agents are passed to `create_app` too."""
        if agent.name in self.agents:
            if self.agents[agent.name][0] is agent:
                return  # the same sub-agent under two parents, or served on its own too
            raise ConfigurationError(f"two agents are named {agent.name!r}; names pick the agent of a job")
        self.agents[agent.name] = (agent, provider)
        for tool in [] if callable(agent.tools) else agent.tools:
            if tool.sub_agent is not None:
                self.serve(tool.sub_agent, provider)

    @property
    def keys(self) -> FleetKeys:
        return FleetKeys(self.store)

    @functools.cached_property
    def inflight(self) -> InflightIndex:
        return InflightIndex.of(self.store, self.settings.lease_ttl_ms)

    @functools.cached_property
    def scripts(self) -> FleetScripts:
        return FleetScripts(self.store)

    @functools.cached_property
    def outbox(self) -> Outbox:
        return Outbox(self.app, self.store, self.settings)

    def agent(self, name: str | None) -> tuple[Agent, LLMProvider]:
        if name is None or name not in self.agents:
            served = ", ".join(sorted(self.agents)) or "none"
            raise UnknownAgentError(f"no agent named {name!r} on this fleet (it serves: {served})")
        return self.agents[name]

    async def resolve(self, agent: Agent, run_config: dict[str, Any] | None) -> ResolvedAgent:
        """The agent for one task; a static agent is resolved once per process (its fingerprint
        and tool schemas are then computed once, not on every task)."""
        if agent.is_dynamic:
            return await agent.resolve(run_config)
        if agent.name not in self._resolved:
            self._resolved[agent.name] = await agent.resolve(None)
        resolved = self._resolved[agent.name]
        ctx = (run_config or {}).get("ctx")
        # The run's saved context: its tools' `ctx.metadata`, saved again by every save (issue #16).
        return dataclasses.replace(resolved, run_config={"ctx": ctx}) if ctx else resolved

    def close(self) -> None:
        """Close the event loops and the outbox's broker connection (an app made and dropped in a process
        that goes on: a test's, `lousho.testing.fleet`'s workers; issue #14)."""
        for loop in self._made:
            if not loop.is_closed() and not loop.is_running():
                loop.close()
        self._made.clear()
        if "outbox" in self.__dict__:  # made on first use
            self.outbox.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a task's coroutine: on lousho's pool, on the process's loop beside the other tasks; else on
        this thread's own loop (made anew after a fork)."""
        self.name_process()
        if on_pool_loop():
            return await_on_loop(coro)
        return self._thread_loop().run_until_complete(coro)

    def name_process(self) -> None:
        """Name this process's Redis connections, once per process, before its first task writes."""
        if self._named_pid != os.getpid():
            # A process Celery never started (a `FleetDriver`, eager mode) is named before its first task writes
            # the running index, or the death sweep would take its running calls for a dead process's (issue #20)
            name_connections(self.store.client)
            self._named_pid = os.getpid()

    def _thread_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._loops, "loop", None)
        if loop is None or getattr(self._loops, "pid", 0) != os.getpid() or loop.is_closed():
            loop = self._loops.loop = asyncio.new_event_loop()
            self._loops.pid = os.getpid()
            self._made.append(loop)
        return loop
