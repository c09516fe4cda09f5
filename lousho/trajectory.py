"""Fork a run from a step of its history, and compare two runs (reference: 'Fork and replay').

`fork()` only reads the source session's history and writes one new checkpoint: the
source's latest checkpoint and history are never touched. The fork is an ordinary
'in-progress' run, so resuming it follows the usual rules (pending calls first, then
queued input, then the model).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from lousho.checkpoint import (
    Checkpoint,
    CheckpointStore,
    get_checkpoint_history,
    maybe_await,
    validate_session_id,
)
from lousho.errors import CheckpointConflictError, CheckpointNotFoundError, ConfigurationError, SessionExistsError
from lousho.messages import Message, ToolCall, as_messages

if TYPE_CHECKING:
    from lousho.run import RunResult

__all__ = [
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
    "compare_trajectories",
    "fork",
]

PATCH_KEYS = ("messages", "business_state", "tool_result", "append_input")
"""The patch keys, in the order they are applied."""
_FORK_SUFFIX = ".fork-"
_MAX_DEFAULT_FORKS = 10_000


class ToolResultPatch(TypedDict):
    tool_call_id: str
    result: Any


class ForkPatch(TypedDict, total=False):
    """What to change in the forked checkpoint; keys are applied in this order."""

    messages: Callable[[list[Message]], list[Message]]
    """Rewrites the transcript (it must stay valid: results right after their call, in call order)."""
    business_state: Any
    """Replaces the business state."""
    tool_result: ToolResultPatch | Sequence[ToolResultPatch]
    """Replaces a call's result in place, or records it when the call has none yet (several: in call order)."""
    append_input: str | Message | Sequence[str | Message]
    """User input queued in `pending_input`: sent after the tool calls still pending."""


class ForkResult(BaseModel):
    """What `fork()` returns: the new session, the step it was forked from, and its saved checkpoint."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    step: int
    checkpoint: Checkpoint


# -- fork ------------------------------------------------------------------------------


async def fork(
    *,
    session_id: str,
    from_step: int,
    checkpoint_store: CheckpointStore,
    patch: ForkPatch | dict[str, Any] | None = None,
    new_session_id: str | None = None,
) -> ForkResult:
    """Start a new session from the newest history entry of `session_id`'s step `from_step`.

    The patch is applied (`messages`, `business_state`, `tool_result`, `append_input`, in
    that order) and the result is saved as the new session's 'in-progress' checkpoint
    (version 1, no approval id; step count, usage and fingerprint kept). Resume it like
    any unfinished run.

    Raises `CheckpointNotFoundError` (LOUSHO_CHECKPOINT_NOT_FOUND) for a step the history
    does not hold, `ConfigurationError` for a store without `history()` or a bad patch, and
    `SessionExistsError` (a `ConfigurationError`) for a `new_session_id` that has a checkpoint.
    """
    validate_session_id(session_id)
    if new_session_id is not None:
        validate_session_id(new_session_id)
    patch = dict(patch or {})
    unknown = sorted(set(patch) - set(PATCH_KEYS))
    if unknown:
        raise ConfigurationError(
            f"unknown fork patch keys: {', '.join(unknown)}; use messages, business_state, tool_result, append_input"
        )
    history = await get_checkpoint_history(checkpoint_store, session_id)
    if history is None:
        raise ConfigurationError(
            f"{type(checkpoint_store).__name__} keeps no checkpoint history, so it cannot fork; use a store "
            "with history() (memory_store(), SqliteStore, RedisStore, FileStore)"
        )
    entry = next((e for e in history if e.step == from_step), None)  # history is newest first
    if entry is None:
        kept = sorted({e.step for e in history})
        held = f"the steps kept are {', '.join(map(str, kept))}" if kept else "its history holds no entries"
        raise CheckpointNotFoundError(
            f"session {session_id!r} has no history entry for step {from_step}; {held} "
            "(the session may be unknown, the step may never have run, or it was dropped past history_limit)"
        )
    checkpoint = apply_patch(entry.checkpoint, patch)
    if new_session_id is not None:
        saved = await _save_new(checkpoint_store, new_session_id, checkpoint)
        if saved is None:
            raise SessionExistsError(
                f"session {new_session_id!r} already has a checkpoint; a fork never overwrites a session: "
                "pick another new_session_id (or leave it out for <session>.fork-<n>)"
            )
        return ForkResult(session_id=new_session_id, step=from_step, checkpoint=saved)
    for n in range(1, _MAX_DEFAULT_FORKS + 1):
        candidate = validate_session_id(f"{session_id}{_FORK_SUFFIX}{n}")
        saved = await _save_new(checkpoint_store, candidate, checkpoint)
        if saved is not None:
            return ForkResult(session_id=candidate, step=from_step, checkpoint=saved)
    raise ConfigurationError(f"session {session_id!r} has {_MAX_DEFAULT_FORKS} forks already; pass new_session_id=")


async def _save_new(store: CheckpointStore, session_id: str, checkpoint: Checkpoint) -> Checkpoint | None:
    """Save as a new session's first version; None when the session exists (checked, then refused by CAS)."""
    if await maybe_await(store.load(session_id)) is not None:
        return None
    new = checkpoint.model_copy(
        update={
            "session_id": session_id,
            "version": 1,
            "status": "in-progress",
            "approval_id": None,
            "finish_reason": None,
        }
    )
    try:
        await maybe_await(store.save(session_id, new))
    except CheckpointConflictError:  # created between load and save: a CAS store refuses version 1
        return None
    return new


def apply_patch(checkpoint: Checkpoint, patch: dict[str, Any]) -> Checkpoint:
    """The checkpoint with `patch` applied, in the reference's order. Nothing is saved."""
    if "messages" in patch:
        rewrite = patch["messages"]
        if not callable(rewrite):
            raise ConfigurationError("patch['messages'] must be a function: list[Message] -> list[Message]")
        messages = as_messages(rewrite(list(checkpoint.messages)))
        _check_transcript(messages)
        checkpoint = checkpoint.model_copy(
            update={
                "messages": messages,
                "run_start": min(checkpoint.run_start, len(messages)),
                "run_input_count": min(checkpoint.run_input_count, max(len(messages) - checkpoint.run_start, 0)),
            }
        )
    if "business_state" in patch:
        checkpoint = checkpoint.model_copy(update={"business_state": patch["business_state"]})
    if "tool_result" in patch:
        patches = patch["tool_result"]
        for item in [patches] if isinstance(patches, dict) else list(patches):
            checkpoint = _patch_tool_result(checkpoint, item)
    if "append_input" in patch:
        new = [m for m in as_messages(patch["append_input"]) if m.role != "system"]
        if not new:
            raise ConfigurationError("patch['append_input'] holds no message to send")
        checkpoint = checkpoint.model_copy(update={"pending_input": [*checkpoint.pending_input, *new]})
    return checkpoint


def _patch_tool_result(checkpoint: Checkpoint, item: Any) -> Checkpoint:
    if not isinstance(item, dict) or set(item) != {"tool_call_id", "result"}:
        raise ConfigurationError(f"patch['tool_result'] must be {{'tool_call_id': str, 'result': ...}}; got {item!r}")
    call_id, result = item["tool_call_id"], item["result"]
    if hasattr(result, "model_dump"):
        result = result.model_dump(mode="json")
    messages = list(checkpoint.messages)
    located = _find_call(messages, call_id)
    if located is None:
        raise ConfigurationError(f"no tool call {call_id!r} in the forked checkpoint; check the id at that step")
    turn_index, call = located
    for index in range(turn_index + 1, len(messages)):
        message = messages[index]
        if message.role != "tool":
            break
        if message.tool_call_id == call_id:  # same position, call id and tool name
            messages[index] = Message.tool_result(call, result)
            return checkpoint.model_copy(update={"messages": messages})
    pending = checkpoint.pending_tool_calls()
    if call_id not in [c.id for c in pending]:
        raise ConfigurationError(
            f"tool call {call_id!r} has no result and is not pending at this step, so it cannot be recorded"
        )
    if pending[0].id != call_id:
        before = ", ".join(repr(c.id) for c in pending[: [c.id for c in pending].index(call_id)])
        raise ConfigurationError(
            f"tool call {call_id!r} comes after pending calls {before}, and results are recorded in call order: "
            "give those results first (tool_result=[{...}, {...}]) or fork from a step where they are recorded"
        )
    return checkpoint.model_copy(update={"messages": [*messages, Message.tool_result(call, result)]})


def _find_call(messages: list[Message], call_id: str) -> tuple[int, ToolCall] | None:
    """The newest assistant turn with a call of that id (ids are unique within a turn only)."""
    for index in range(len(messages) - 1, -1, -1):
        for call in messages[index].tool_calls if messages[index].role == "assistant" else ():
            if call.id == call_id:
                return index, call
    return None


def _check_transcript(messages: list[Message]) -> None:
    """Every result directly follows its call's turn, once, in call order; only the last turn may lack results."""
    expected: list[str] = []  # calls of the current turn still waiting for a result, in order
    for index, message in enumerate(messages):
        if message.role == "tool":
            if not expected or message.tool_call_id != expected[0]:
                want = repr(expected[0]) if expected else "no result"
                raise ConfigurationError(
                    f"patch['messages'] made an invalid transcript: message {index} is a result for "
                    f"{message.tool_call_id!r} where {want} belongs"
                )
            expected.pop(0)
            continue
        if expected:
            raise ConfigurationError(
                f"patch['messages'] made an invalid transcript: calls {', '.join(expected)} have no result "
                f"before message {index}"
            )
        if message.role == "assistant":
            expected = [c.id for c in message.tool_calls]


# -- compare ---------------------------------------------------------------------------


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
