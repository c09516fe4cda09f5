"""The step machine: from a checkpoint alone, what runs next; and each step's one effect.

Nothing here saves, loops, imports Celery or Redis: the in-process executor and
the fleet's tasks both drive these functions, so both give the same transcript
for the same provider answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from lousho.abort import AbortSignal, RunAborted
from lousho.checkpoint import Checkpoint
from lousho.definition import ResolvedAgent, call_hook
from lousho.errors import PropagatingToolError
from lousho.messages import INVALID_JSON_KEY, Message, ToolCall, Usage
from lousho.providers.base import LLMProvider, ModelRequest, ModelResponse
from lousho.providers.calling import OnDelta, OnRetry, ask_model, check_storable
from lousho.tools import ToolContext, describe_validation_error, tool_error

__all__ = [
    "AwaitApproval",
    "CANCELLED_RESULT",
    "Finish",
    "ModelTurn",
    "PlannedCall",
    "RunTools",
    "SendPendingInput",
    "Step",
    "abortable",
    "append_pending_input",
    "finish",
    "next_step",
    "plan_tool_call",
    "record_tool_result",
    "run_planned_call",
    "take_model_turn",
]

CANCELLED_RESULT = tool_error("cancelled", "The run was aborted before this call finished; it was not completed.")


@dataclass(frozen=True)
class ModelTurn:
    turn: int
    """The number of the turn to ask, over the whole transcript (`Checkpoint.turns` + 1)."""


@dataclass(frozen=True)
class RunTools:
    calls: list[ToolCall]
    """The newest turn's calls without a result, in call order."""


@dataclass(frozen=True)
class SendPendingInput:
    pass


@dataclass(frozen=True)
class AwaitApproval:
    approval_id: str


@dataclass(frozen=True)
class Finish:
    reason: str
    """'stop' or 'max-steps'."""
    already_saved: bool


Step = ModelTurn | RunTools | SendPendingInput | AwaitApproval | Finish


def next_step(checkpoint: Checkpoint, max_steps: int) -> Step:
    """Decide what runs next from the checkpoint alone (DESIGN: 'The engine is a step machine')."""
    if checkpoint.status == "finished":
        return Finish(checkpoint.finish_reason or "stop", already_saved=True)
    if checkpoint.status == "awaiting-approval" and checkpoint.approval_id:
        return AwaitApproval(checkpoint.approval_id)
    pending = checkpoint.pending_tool_calls()
    if pending:
        return RunTools(pending)
    if checkpoint.pending_input:
        return SendPendingInput()
    last = checkpoint.messages[-1] if checkpoint.messages else None
    if last is not None and last.role == "assistant" and not last.tool_calls:
        return Finish("stop", already_saved=False)
    if checkpoint.step_index >= max_steps:
        return Finish("max-steps", already_saved=False)
    return ModelTurn(checkpoint.turns + 1)


def finish(checkpoint: Checkpoint, reason: str) -> Checkpoint:
    return checkpoint.model_copy(update={"status": "finished", "finish_reason": reason, "approval_id": None})


def append_pending_input(checkpoint: Checkpoint) -> Checkpoint:
    """Queued input goes after the tool results, never between a tool-call turn and its results."""
    return checkpoint.model_copy(
        update={"messages": [*checkpoint.messages, *checkpoint.pending_input], "pending_input": []}
    )


def record_tool_result(
    checkpoint: Checkpoint, call: ToolCall, result: Any, *, message: Message | None = None
) -> Checkpoint:
    """Append `call`'s result; results are recorded strictly in call order. `message`: the result's
    `Message.tool_result`, when the caller made it already (its JSON is what it commits: issue #30, one
    encode of a result)."""
    pending = checkpoint.pending_tool_calls()
    if not pending or pending[0].id != call.id:
        expected = pending[0].id if pending else None
        raise ValueError(f"result for {call.id!r} recorded out of order (next pending call is {expected!r})")
    recorded = message if message is not None else Message.tool_result(call, result)
    update: dict[str, Any] = {"messages": [*checkpoint.messages, recorded]}
    if call.id in checkpoint.started_calls:  # its start mark goes with its result (issue #17)
        update["started_calls"] = [c for c in checkpoint.started_calls if c != call.id]
    return checkpoint.model_copy(update=update)


def _unique_call_ids(message: Message, step: int) -> Message:
    """Give every call of a turn a distinct, non-empty id: each must get exactly one result."""
    seen: set[str] = set()
    calls = []
    for index, call in enumerate(message.tool_calls):
        call_id = call.id or f"call_{step}_{index}"
        while call_id in seen:
            call_id = f"{call_id}_{index}"
        seen.add(call_id)
        calls.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
    return message.model_copy(update={"role": "assistant", "tool_calls": calls})


async def abortable(awaitable: Any, signal: AbortSignal | None) -> Any:
    """Await `awaitable` unless the signal fires first: then cancel it and raise `RunAborted`."""
    with CancelOnAbort(signal):
        return await awaitable


class CancelOnAbort:
    """`with CancelOnAbort(signal): await ...`: the signal cancels this very task where it awaits (from its callback,
    on the loop), as `asyncio.timeout` does, and the block raises `RunAborted`; a signal that fired before raises it
    at once. No task of its own beside the work, nor a coroutine around it (issue #29: a fleet worker holds this for
    every step in flight, hundreds a process). `None`: no signal, nothing to do."""

    __slots__ = ("active", "fired", "loop", "signal", "task", "undo")

    def __init__(self, signal: AbortSignal | None) -> None:
        self.signal = signal

    def __enter__(self) -> None:
        if self.signal is None:
            return
        self.signal.raise_if_aborted()
        self.task, self.loop = asyncio.current_task(), asyncio.get_running_loop()
        self.active, self.fired = True, False
        self.undo: Callable[[], None] | None = self.signal.on_abort(self._cancel_soon)

    def _cancel_soon(self) -> None:  # the signal's callback: from any thread
        self.loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:  # on the task's loop
        if self.active and self.task is not None:
            self.fired = True
            self.task.cancel()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> None:
        if self.signal is None:
            return
        self.active = False  # a cancel the signal scheduled and the loop has not run yet must not land after this
        # Dropped, not only called: the undo holds our callback, bound to this object, a cycle that would keep the
        # task (and what its coroutine returned) alive until a full collection, for every step run (issue #29).
        undo, task, self.undo, self.task = self.undo, self.task, None, None
        if undo is not None:
            undo()
        cancelled = kind is not None and issubclass(kind, asyncio.CancelledError)
        if cancelled and self.fired and task is not None and not task.uncancel():  # ours, not the caller's own
            raise RunAborted(self.signal.reason) from None


async def take_model_turn(
    checkpoint: Checkpoint,
    agent: ResolvedAgent,
    provider: LLMProvider,
    signal: AbortSignal | None = None,
    on_delta: OnDelta | None = None,
    on_retry: OnRetry | None = None,
) -> tuple[Checkpoint, ModelResponse]:
    """Ask the model for one turn and return the checkpoint with its answer recorded (not yet saved).

    A turn that asks for tools stays 'in-progress'; one that does not finishes the run.
    """
    step = checkpoint.step_index + 1
    request = ModelRequest(
        model=agent.model,
        messages=checkpoint.messages,
        tools=agent.tool_specs(),
        session_id=checkpoint.session_id,
        step=step,
    )
    request = await call_hook(agent.hook("before_model"), request) or request
    with CancelOnAbort(signal):
        response = await ask_model(
            provider, request, retry=agent.definition.retry, on_delta=on_delta, on_retry=on_retry
        )
    response = await call_hook(agent.hook("after_model"), response) or response
    check_storable(response)  # what the hook made of it, too (issue #31)
    message = _unique_call_ids(response.message, step)
    update: dict[str, Any] = {
        "messages": [*checkpoint.messages, message],
        "step_index": step,
        "usage": checkpoint.usage + (response.usage or Usage()),
    }
    if not message.tool_calls:
        update.update(status="finished", finish_reason="stop")
    return checkpoint.model_copy(update=update), response


@dataclass(frozen=True)
class PlannedCall:
    """What a pending call will do: run with validated `args`, record `result` without running
    (a validation error, a rejection, a sub-agent's answer), or wait for approval."""

    call: ToolCall
    args: Any = None
    result: Any = None
    preset: bool = False
    needs_approval: bool = False


def tool_context(
    call: ToolCall, agent: ResolvedAgent, session_id: str | None, signal: AbortSignal, metadata: dict[str, Any]
) -> ToolContext:
    return ToolContext(
        tool_call_id=call.id, session_id=session_id, signal=signal, tool_name=call.name, metadata=metadata
    )


async def plan_tool_call(
    call: ToolCall, agent: ResolvedAgent, ctx: ToolContext, *, skip_approval: bool = False
) -> PlannedCall:
    """Validate a call before anything runs: unknown tools and bad arguments become error results."""
    tool = agent.tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(agent.tools)) or "none"
        return PlannedCall(
            call, result=tool_error(f"unknown tool {call.name!r}", f"Available tools: {known}."), preset=True
        )
    raw = call.arguments.get(INVALID_JSON_KEY)
    if isinstance(raw, str):
        return PlannedCall(
            call,
            preset=True,
            result=tool_error(
                f"invalid arguments for {call.name}: not a JSON object: {raw[:500]}",
                "Send the arguments as one JSON object that matches the tool's schema.",
            ),
        )
    try:
        args = tool.parse_arguments(call.arguments)
    except ValidationError as exc:
        return PlannedCall(
            call,
            preset=True,
            result=tool_error(
                f"invalid arguments for {call.name}: {describe_validation_error(exc)}",
                "Fix the arguments and call the tool again.",
            ),
        )
    if not skip_approval and await tool.requires_approval(args, ctx):
        return PlannedCall(call, args=args, needs_approval=True)
    return PlannedCall(call, args=args)


async def run_planned_call(planned: PlannedCall, agent: ResolvedAgent, ctx: ToolContext) -> Any:
    """Run one validated call and return its result. A tool's exception becomes an error result,
    except `PropagatingToolError`, which rejects the run; a hook's exception rejects it too.

    A call whose run is aborted before it starts, or while it runs, gets `CANCELLED_RESULT`
    whatever the tool then does: raises (a cooperative tool stops so), returns, or raises
    `PropagatingToolError` (reference: 'An aborted call gets a cancelled result'; issue #16).
    A call whose tool returned before the signal fired keeps its result: its work is done."""
    if planned.preset:
        return planned.result
    if ctx.signal.aborted:  # never start a call of a run that was aborted meanwhile
        return CANCELLED_RESULT
    tool = agent.tools[planned.call.name]
    await call_hook(agent.hook("before_tool"), planned.call, ctx)
    try:
        result = await tool.run(planned.args, ctx)
    except PropagatingToolError:
        if ctx.signal.aborted:
            return CANCELLED_RESULT
        raise
    except Exception as exc:  # a tool's failure is the model's to read, not a crash (issue #2)
        result = tool_error(f"{type(exc).__name__}: {exc}", f"The tool {planned.call.name} failed.")
    if ctx.signal.aborted:  # it noticed the abort (or ran on past it): 'cancelled', not its answer
        return CANCELLED_RESULT
    if hasattr(result, "model_dump"):
        result = result.model_dump(mode="json")
    replaced = await call_hook(agent.hook("after_tool"), planned.call, result)
    return result if replaced is None else replaced
