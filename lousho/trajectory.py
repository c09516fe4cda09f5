"""Compare two runs step by step: where they diverge and how they drift (reference: 'Fork and replay').

`compare_trajectories()` takes checkpoints, `RunResult`s or transcripts. Forking lives in
`lousho.fork`; its names are re-exported here, where they lived before (`lousho.trajectory.fork`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from lousho.checkpoint import Checkpoint
from lousho.errors import ConfigurationError
from lousho.fork import PATCH_KEYS, ForkPatch, ForkResult, SessionExistsError, ToolResultPatch, apply_patch, fork
from lousho.messages import Message, as_messages

if TYPE_CHECKING:
    from lousho.run import RunResult

__all__ = [
    "PATCH_KEYS",
    "ArgumentDiff",
    "ForkPatch",
    "ForkResult",
    "SessionExistsError",
    "ToolOrderDiff",
    "ToolResultPatch",
    "TrajectoryComparison",
    "TrajectoryDrift",
    "TrajectoryStep",
    "TrajectoryToolCall",
    "apply_patch",
    "compare_trajectories",
    "fork",
]


class TrajectoryToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    has_result: bool = False


class TrajectoryStep(BaseModel):
    """One assistant turn: its text and its tool calls with their results."""

    model_config = ConfigDict(frozen=True)

    step: int
    """1-based position among the transcript's assistant turns (a single run's step number)."""
    text: str | None = None
    tool_calls: list[TrajectoryToolCall] = Field(default_factory=list)

    def key(self) -> str:
        """What is compared: everything but the call ids."""
        calls = [(c.name, c.arguments, c.result, c.has_result) for c in self.tool_calls]
        return json.dumps([self.text, calls], sort_keys=True, default=str)


class ToolOrderDiff(BaseModel):
    step: int
    a: list[str]
    b: list[str]


class ArgumentDiff(BaseModel):
    step: int
    position: int
    """Index of the call within its step."""
    tool: str
    a: dict[str, Any]
    b: dict[str, Any]


class TrajectoryDrift(BaseModel):
    """How two runs differ beyond their first divergence."""

    tool_order: list[ToolOrderDiff] = Field(default_factory=list)
    """Steps (present in both runs) whose tool names differ in order or number."""
    arguments: list[ArgumentDiff] = Field(default_factory=list)
    """Same tool at the same place, different arguments."""
    step_count: tuple[int, int] | None = None
    """(steps of a, steps of b) when they differ."""
    finish_reason: tuple[str | None, str | None] | None = None
    """(a's, b's) when they differ; an unfinished checkpoint reports its status."""

    def __bool__(self) -> bool:
        return bool(self.tool_order or self.arguments or self.step_count or self.finish_reason)


class TrajectoryComparison(BaseModel):
    """`compare_trajectories()`'s answer; also unpacks as `diverged_at, a, b, drift = ...`."""

    diverged_at: int | None
    """Step number (1-based, like `from_step`) of the first step that differs, call ids aside;
    None when the runs are identical step for step. `a[diverged_at - 1]` is that step of a."""
    a: list[TrajectoryStep]
    b: list[TrajectoryStep]
    drift: TrajectoryDrift

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        yield from (self.diverged_at, self.a, self.b, self.drift)

    def describe(self) -> str:
        """A readable summary, for logs and the CLI."""
        lines = [
            "identical trajectories" if self.diverged_at is None else f"diverged at step {self.diverged_at}",
        ]
        for step in range(1, max(len(self.a), len(self.b)) + 1):
            marker = "*" if self.diverged_at is not None and step >= self.diverged_at else " "
            lines.append(f"{marker} step {step}")
            for label, steps in (("a", self.a), ("b", self.b)):
                lines.append(f"    {label}: {_describe_step(steps[step - 1]) if step <= len(steps) else '-'}")
        drift = self.drift
        if drift.step_count:
            lines.append(f"step count: a {drift.step_count[0]}, b {drift.step_count[1]}")
        if drift.finish_reason:
            lines.append(f"finish reason: a {drift.finish_reason[0]}, b {drift.finish_reason[1]}")
        for order in drift.tool_order:
            lines.append(f"tool order at step {order.step}: a {order.a}, b {order.b}")
        for arg in drift.arguments:
            lines.append(f"arguments of {arg.tool} at step {arg.step}: a {_short(arg.a)}, b {_short(arg.b)}")
        return "\n".join(lines)


def _describe_step(step: TrajectoryStep) -> str:
    parts = [repr(step.text)] if step.text else []
    for c in step.tool_calls:
        parts.append(f"{c.name}({_short(c.arguments)}) -> {_short(c.result) if c.has_result else '(no result)'}")
    return "; ".join(parts) or "(empty turn)"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 100 else text[:97] + "..."


Trajectory: TypeAlias = "Checkpoint | RunResult | Sequence[Message]"


def compare_trajectories(a: Trajectory, b: Trajectory) -> TrajectoryComparison:
    """Compare two runs given as checkpoints, `RunResult`s or transcripts (lists of `Message`)."""
    messages_a, finish_a = _read(a, "a")
    messages_b, finish_b = _read(b, "b")
    steps_a, steps_b = trajectory_steps(messages_a), trajectory_steps(messages_b)
    diverged_at = next(
        (i + 1 for i, (x, y) in enumerate(zip(steps_a, steps_b, strict=False)) if x.key() != y.key()), None
    )
    if diverged_at is None and len(steps_a) != len(steps_b):
        diverged_at = min(len(steps_a), len(steps_b)) + 1
    drift = TrajectoryDrift(
        step_count=(len(steps_a), len(steps_b)) if len(steps_a) != len(steps_b) else None,
        finish_reason=(finish_a, finish_b) if finish_a != finish_b else None,
    )
    for x, y in zip(steps_a, steps_b, strict=False):
        names_x, names_y = [c.name for c in x.tool_calls], [c.name for c in y.tool_calls]
        if names_x != names_y:
            drift.tool_order.append(ToolOrderDiff(step=x.step, a=names_x, b=names_y))
        for position, (cx, cy) in enumerate(zip(x.tool_calls, y.tool_calls, strict=False)):
            if cx.name == cy.name and cx.arguments != cy.arguments:
                drift.arguments.append(
                    ArgumentDiff(step=x.step, position=position, tool=cx.name, a=cx.arguments, b=cy.arguments)
                )
    return TrajectoryComparison(diverged_at=diverged_at, a=steps_a, b=steps_b, drift=drift)


def trajectory_steps(messages: Sequence[Message]) -> list[TrajectoryStep]:
    """One step per assistant turn, each call with the result that follows its turn."""
    steps: list[TrajectoryStep] = []
    for index, message in enumerate(messages):
        if message.role != "assistant":
            continue
        results: dict[str, Any] = {}
        for later in messages[index + 1 :]:
            if later.role != "tool":
                break
            if later.tool_call_id is not None:
                results[later.tool_call_id] = _decode(later)
        calls = [
            TrajectoryToolCall(
                id=c.id, name=c.name, arguments=c.arguments, result=results.get(c.id), has_result=c.id in results
            )
            for c in message.tool_calls
        ]
        steps.append(TrajectoryStep(step=len(steps) + 1, text=message.content or None, tool_calls=calls))
    return steps


def _decode(message: Message) -> Any:
    try:
        return message.result()
    except ValueError:
        return message.content


def _read(value: Any, label: str) -> tuple[list[Message], str | None]:
    """The transcript and finish reason of a checkpoint, a RunResult or a list of messages."""
    if isinstance(value, Checkpoint):
        return list(value.messages), value.finish_reason if value.status == "finished" else value.status
    finish_reason = getattr(value, "finish_reason", None)
    if isinstance(getattr(value, "checkpoint", None), Checkpoint) and isinstance(finish_reason, str):
        return list(value.checkpoint.messages), finish_reason
    if isinstance(value, Sequence) and not isinstance(value, str):
        messages = as_messages(list(value))
        last = messages[-1] if messages else None
        done = last is not None and last.role == "assistant" and not last.tool_calls
        return messages, "stop" if done else None
    raise ConfigurationError(
        f"compare_trajectories({label}=...) takes a Checkpoint, a RunResult or a list of Message; got {type(value).__name__}"
    )
