"""Forking a session from a save, patched, and starting the fork (issue #32): `lousho fork` and the
dashboard's fork form, one way. The source is always loaded first, so an unknown source is
`SessionNotFoundError` (not a missing step), and every fork stores where it came from (`forked_from`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lousho.checkpoint import get_checkpoint_history, validate_session_id
from lousho.errors import ConfigurationError
from lousho.messages import Message
from lousho.operations.target import Target, load_session, sync
from lousho.trajectory import fork as fork_session

__all__ = ["ForkRequest", "Forked", "fork", "parse_tool_result", "rewrite_message", "start_session"]


@dataclass(frozen=True)
class ForkRequest:
    """A fork: from a save (or the newest save of a step), with an optional patch, under an optional id."""

    session_id: str
    from_save: int | None = None
    from_step: int | None = None
    tool_results: Sequence[dict[str, Any]] = ()
    """`{"tool_call_id": ..., "result": ...}` each (`parse_tool_result` reads 'CALL_ID=JSON')."""
    append_input: Sequence[str] = ()
    rewrite: Callable[[list[Message]], list[Message]] | None = None
    """A `messages` patch (`rewrite_message`)."""
    new_session_id: str | None = None
    run: bool = False
    """On a fleet: start it now (else it stays idle, and the reaper leaves it alone until it is resumed)."""


@dataclass(frozen=True)
class Forked:
    session_id: str
    source: str
    step: int
    save: int | None
    then: str
    """What runs it next."""
    other_saves: list[int] = field(default_factory=list)
    """With `from_step`: the step's saves, when it has several (the newest was taken; said, not silent)."""


def parse_tool_result(value: str) -> dict[str, Any]:
    """'CALL_ID=JSON' as a tool_result patch entry; `ConfigurationError` naming what is wrong."""
    call_id, sep, raw = value.partition("=")
    if not sep or not call_id.strip():
        raise ConfigurationError(f"a patched tool result is CALL_ID=JSON, not {value!r}")
    try:
        result = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"the result of {call_id.strip()} is not JSON ({exc.msg}): {raw[:200]!r}") from None
    return {"tool_call_id": call_id.strip(), "result": result}


def rewrite_message(index: int, content: str) -> Callable[[list[Message]], list[Message]]:
    """A `messages` patch that replaces the text of one user or assistant message of the save."""

    def rewrite(messages: list[Message]) -> list[Message]:
        if index >= len(messages) or messages[index].role not in ("user", "assistant"):
            raise ConfigurationError(
                f"message #{index} of this save is not a user or assistant message "
                f"(it has {len(messages)} messages; a tool result is patched with the tool call's result)"
            )
        return [*messages[:index], messages[index].model_copy(update={"content": content}), *messages[index + 1 :]]

    return rewrite


def fork(target: Target, request: ForkRequest) -> Forked:
    """Fork `request.session_id` as asked; the source is untouched. On a fleet, run the fork now or leave it idle."""
    if (request.from_step is None) == (request.from_save is None):
        raise ConfigurationError("a fork starts from a step or from a save (one of them; see the history)")
    load_session(target, request.session_id)  # an unknown source is SESSION_NOT_FOUND, not a missing step
    saves = [] if request.from_save is not None else _saves_of_step(target, request.session_id, request.from_step)
    patch: dict[str, Any] = {}
    if request.rewrite is not None:
        patch["messages"] = request.rewrite
    if request.tool_results:
        patch["tool_result"] = list(request.tool_results)
    if request.append_input:
        patch["append_input"] = list(request.append_input)
    forked = sync(
        fork_session(
            session_id=request.session_id,
            from_step=None if saves else request.from_step,
            from_save=saves[-1] if saves else request.from_save,
            checkpoint_store=target.bundle.checkpoints,
            patch=patch,
            new_session_id=request.new_session_id or None,
        )
    )
    then = start_session(target, forked.session_id, run=request.run)
    others = saves if len(saves) > 1 else []
    return Forked(forked.session_id, request.session_id, forked.step, forked.save, then, others)


def _saves_of_step(target: Target, session_id: str, step: int | None) -> list[int]:
    """The saves of a step, oldest first: a step may have several (the model's turn, then each tool result)."""
    entries = sync(get_checkpoint_history(target.bundle.checkpoints, validate_session_id(session_id))) or []
    return sorted(entry.checkpoint.version for entry in entries if entry.step == step)


def start_session(target: Target, session_id: str, *, run: bool) -> str:
    """On a fleet: start the session now (`run`), or keep the reaper off it until it is resumed. Says what runs
    it next."""
    if target.client is None:
        return f"resume it with agent.resume({session_id!r}) where the agent lives"
    if run:
        target.client.resume(session_id)
        return "the fleet runs it now"
    target.client.inflight.drop(session_id)  # not running: the reaper leaves it alone until it is resumed
    return f"start it with `lousho resume {session_id}`"
