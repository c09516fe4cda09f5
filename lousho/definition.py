"""`Agent`: what an agent is (model, instructions, tools, limits, hooks), and how a run resolves it.

A dynamic agent gives callables for `model`, `instructions` or `tools`; they are
resolved from the run's `ctx` once per run, and the checkpoint saves the `ctx`
and the chosen model as `run_config`, so a crash resume resolves the same agent.
Any agent's run saves a non-empty `ctx` there too: on every resume, its tools see
the saved context as `ctx.metadata` (issue #16).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lousho.errors import ConfigurationError
from lousho.fingerprint import AgentFingerprint, compute_fingerprint
from lousho.providers.base import RetryPolicy, ToolSpec
from lousho.tools import Tool

__all__ = ["Agent", "Hook", "ResolvedAgent", "call_hook"]

Hook = Callable[..., Any]
Dynamic = Callable[[dict[str, Any]], Any]


async def call_hook(hook: Hook | None, *args: Any) -> Any:
    """Run a sync or async hook; whatever it raises rejects the run."""
    if hook is None:
        return None
    result = hook(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


@dataclass(kw_only=True)
class Agent:
    """An agent definition. Hooks may be sync or async; one that raises rejects the run."""

    name: str
    model: str | Dynamic
    instructions: str | Dynamic = ""
    tools: Sequence[Tool[Any]] | Dynamic = ()
    max_steps: int = 20
    tool_concurrency: int = 1
    before_model: Hook | None = None
    """`(request) -> ModelRequest | None`: return a request to send instead."""
    after_model: Hook | None = None
    """`(response) -> ModelResponse | None`: return a response to record instead."""
    before_tool: Hook | None = None
    """`(call, ctx) -> None`."""
    after_tool: Hook | None = None
    """`(call, result) -> result | None`: return a result to record instead."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Retries of provider errors that may succeed (rate limit, timeout, server error)."""
    stream_events: bool = True
    """On the fleet, write this agent's runs' events (text deltas, tool calls, saves) to each session's event
    stream, for `Client.events()` (issue #34). False: none written, and its model turns are not streamed."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ConfigurationError(f"agent {self.name!r}: max_steps must be at least 1, got {self.max_steps}")
        if self.tool_concurrency < 1:
            raise ConfigurationError(
                f"agent {self.name!r}: tool_concurrency must be at least 1, got {self.tool_concurrency}"
            )
        if not callable(self.tools):
            _check_unique(self.name, self.tools)

    @property
    def is_dynamic(self) -> bool:
        return callable(self.model) or callable(self.instructions) or callable(self.tools)

    async def resolve(
        self, run_config: dict[str, Any] | None = None, ctx: dict[str, Any] | None = None
    ) -> ResolvedAgent:
        """The concrete agent for one run: a saved `run_config` wins over a new `ctx`."""
        if run_config is not None:
            ctx = run_config.get("ctx") or {}
        ctx = ctx or {}
        model = run_config["model"] if run_config and "model" in run_config else await _value(self.model, ctx)
        instructions = await _value(self.instructions, ctx)
        tools = list(await _value(self.tools, ctx))
        _check_unique(self.name, tools)
        # A static agent keeps its run's context too, for its tools' `ctx.metadata` on a resume (issue #16).
        config = {"ctx": ctx, "model": model} if self.is_dynamic else {"ctx": ctx} if ctx else None
        return ResolvedAgent(
            definition=self,
            model=str(model),
            instructions=str(instructions),
            tools={t.name: t for t in tools},
            run_config=config,
        )


async def _value(value: Any, ctx: dict[str, Any]) -> Any:
    if callable(value):
        value = value(ctx)
        if inspect.isawaitable(value):
            value = await value
    return value


def _check_unique(agent_name: str, tools: Sequence[Tool[Any]]) -> None:
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigurationError(
            f"agent {agent_name!r} has several tools named {', '.join(duplicates)}; tool names must be unique"
        )


@dataclass(kw_only=True)
class ResolvedAgent:
    """An agent with its model, instructions and tools fixed for one run."""

    definition: Agent
    model: str
    instructions: str
    tools: dict[str, Tool[Any]]
    run_config: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.definition.name

    _fingerprints: dict[str, AgentFingerprint] = field(default_factory=dict, repr=False)
    _tool_specs: list[ToolSpec] | None = field(default=None, repr=False)

    def fingerprint(self, instructions: str | None = None) -> AgentFingerprint:
        """Computed once per instructions text: every save stamps it, so it is on the hot path."""
        text = self.instructions if instructions is None else instructions
        if text not in self._fingerprints:
            self._fingerprints[text] = compute_fingerprint(self.model, text, self.tools.values())
        return self._fingerprints[text]

    def tool_specs(self) -> list[ToolSpec]:
        """The tools as the model sees them (JSON schemas built once per run, not per turn)."""
        if self._tool_specs is None:
            self._tool_specs = [
                ToolSpec(name=t.name, description=t.description, parameters=t.json_schema())
                for t in self.tools.values()
            ]
        return self._tool_specs

    def hook(self, name: str) -> Hook | None:
        hook: Hook | None = getattr(self.definition, name)
        return hook
