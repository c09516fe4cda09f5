"""Tools: `define_tool`, the context a tool runs with, and argument validation."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from lousho.abort import AbortSignal
from lousho.errors import ConfigurationError

__all__ = ["InterruptPolicy", "Tool", "ToolContext", "define_tool", "interrupted_result", "tool_error"]

InterruptPolicy = Literal["rerun", "ask", "fail"]
"""What happens to a call that may have run when its run was interrupted (issue #17):
'rerun' runs it again with the same `tool_call_id`; 'ask' pauses the session on an interrupted-call
approval; 'fail' records `interrupted_result` and lets the model decide (docs/interrupted-calls.md)."""

ArgsT = TypeVar("ArgsT", bound=BaseModel)
ToolFn = Callable[[Any, "ToolContext"], Any]
ApprovalFn = Callable[[Any, "ToolContext"], "bool | Awaitable[bool]"]


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a running tool knows about its call."""

    tool_call_id: str
    """The model's id for this call, unchanged on a re-run: use it as an idempotency key."""
    session_id: str | None
    """The session the run is checkpointed under (None for an unsaved run)."""
    signal: AbortSignal = field(default_factory=AbortSignal)
    """Fires when the run is aborted; a long tool should check `signal.aborted` or await `signal.wait()`."""
    tool_name: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The run's context (a dynamic agent's `ctx`), as the caller passed it."""


@dataclass(frozen=True, kw_only=True)
class Tool(Generic[ArgsT]):
    """A tool the model can call. Build one with `define_tool`."""

    name: str
    description: str
    input: type[ArgsT]
    execute: ToolFn
    needs_approval: bool | ApprovalFn = False
    sub_agent: Any = None
    """Set by `agent_tool()`: the `Agent` this tool runs (its pauses pause the caller's run)."""
    on_interrupted: InterruptPolicy = "rerun"
    """What a call that may have run before its run was interrupted does next (issue #17)."""

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments, as sent to the model."""
        return self.input.model_json_schema()

    def parse_arguments(self, arguments: dict[str, Any]) -> ArgsT:
        """Validate the model's arguments; raises pydantic's ValidationError."""
        return self.input.model_validate(arguments)

    async def requires_approval(self, args: ArgsT, ctx: ToolContext) -> bool:
        if isinstance(self.needs_approval, bool):
            return self.needs_approval
        verdict = self.needs_approval(args, ctx)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return bool(verdict)

    async def run(self, args: ArgsT, ctx: ToolContext) -> Any:
        """Run `execute`; a sync function runs in a thread so it cannot block the loop."""
        if inspect.iscoroutinefunction(self.execute):
            return await self.execute(args, ctx)
        result = await asyncio.to_thread(self.execute, args, ctx)
        if inspect.isawaitable(result):
            result = await result
        return result


def define_tool(
    *,
    name: str,
    description: str,
    input: type[ArgsT],
    execute: ToolFn,
    needs_approval: bool | ApprovalFn = False,
    on_interrupted: InterruptPolicy = "rerun",
) -> Tool[ArgsT]:
    """Define a tool: `input` is a pydantic model of its arguments; `execute(args, ctx)` may be sync or async.

    `on_interrupted` says what a call that was running when its worker died (or its run was aborted)
    does next: 'rerun' (run it again, same `tool_call_id`), 'ask' (a human decides) or 'fail' (an
    error result the model reads); docs/interrupted-calls.md (issue #17)."""
    if not isinstance(input, type) or not issubclass(input, BaseModel):
        raise ConfigurationError(f"tool {name!r}: `input` must be a pydantic BaseModel subclass, got {input!r}")
    if on_interrupted not in get_args(InterruptPolicy):
        raise ConfigurationError(
            f"tool {name!r}: on_interrupted must be one of 'rerun', 'ask', 'fail'; got {on_interrupted!r}"
        )
    return Tool(
        name=name,
        description=description,
        input=input,
        execute=execute,
        needs_approval=needs_approval,
        on_interrupted=on_interrupted,
    )


def tool_error(error: str, note: str | None = None) -> dict[str, Any]:
    """The structured error result a model reads: `{"error": ..., "note": ...}`."""
    result: dict[str, Any] = {"error": error}
    if note is not None:
        result["note"] = note
    return result


def interrupted_result(tool_name: str, note: str | None = None) -> dict[str, Any]:
    """The result of a call that may have run when its run was interrupted and is not run again
    (`on_interrupted='fail'`, or a human's 'fail' on an interrupted-call approval; issue #17)."""
    return tool_error(
        "interrupted",
        note
        or f"The call to {tool_name} was running when its run was interrupted (its worker died, or the run was "
        "aborted): it may have run, and it was not run again. Check its effect before calling it again.",
    )


def describe_validation_error(exc: ValidationError) -> str:
    """A short, model-readable summary of what was wrong with the arguments."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
