"""What the dashboard's forms do: the same decision and fork paths as `lousho approve` and `lousho fork` (issue #19).

A decision on a fleet goes through `Client.resolve_approval`, which puts the session back in the in-flight
index and wakes a worker, as `lousho approve` does; off a fleet it is recorded in the store after the same
check that the call shown is the call that would run (issue #17), and the next resume applies it. A fork is
`lousho.trajectory.fork` from a save; "run" on a fleet is `Client.resume`, as `lousho fork --run`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lousho.approvals import ApprovalSnapshot, decide
from lousho.cli_jobs import interrupted_decision
from lousho.cli_render import sync
from lousho.dashboard.views import DashboardContext
from lousho.errors import ConfigurationError
from lousho.messages import Message
from lousho.pausing import check_stored_calls_unchanged
from lousho.trajectory import fork as fork_session

__all__ = ["ForkForm", "Forked", "decide_approval", "fork_from_save", "patch_of"]


def decide_approval(
    ctx: DashboardContext,
    approval_id: str,
    *,
    approved: bool,
    note: str | None,
    action: str | None = None,
    result: str | None = None,
) -> ApprovalSnapshot:
    """Approve or reject a paused call, or answer an interrupted one (`action` rerun / record with `result`
    as JSON / fail); on a fleet the run goes on at once. The decision is checked as `lousho approve` checks it."""
    decision = interrupted_decision(approval_id, approved and action != "fail", note or None, action or None, result)
    if ctx.client is not None:
        return ctx.client.resolve_approval(
            approval_id, approved=decision.approved, note=decision.note, action=decision.action, result=decision.result
        )
    sync(check_stored_calls_unchanged(ctx.bundle.approvals, ctx.bundle.checkpoints, approval_id))
    snapshot: ApprovalSnapshot = sync(decide(ctx.bundle.approvals, decision))
    return snapshot


@dataclass(frozen=True)
class ForkForm:
    """The history page's fork form: a save, and optionally a call's new result (JSON) and/or a user message."""

    save: int
    tool_call_id: str = ""
    tool_result: str = ""
    append_input: str = ""
    message_index: str = ""
    """With `message_content`: the transcript index (as the session page numbers it) of a message to rewrite."""
    message_content: str = ""
    new_session_id: str = ""
    run: bool = False


@dataclass(frozen=True)
class Forked:
    session_id: str
    step: int
    save: int | None
    then: str
    """What runs it next, as `lousho fork` says."""


def patch_of(form: ForkForm) -> dict[str, Any]:
    """The fork patch the form asks for (`lousho fork --tool-result CALL_ID=JSON --append-input TEXT`)."""
    patch: dict[str, Any] = {}
    call_id, raw = form.tool_call_id.strip(), form.tool_result.strip()
    if bool(call_id) != bool(raw):
        raise ConfigurationError("a patched tool result needs both the call id and the result (JSON)")
    if call_id:
        try:
            result = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"the result of {call_id} is not JSON ({exc.msg}): {raw[:200]!r}") from None
        patch["tool_result"] = [{"tool_call_id": call_id, "result": result}]
    if form.message_index.strip():
        patch["messages"] = _rewrite_message(form.message_index.strip(), form.message_content)
    if form.append_input.strip():
        patch["append_input"] = [form.append_input]
    return patch


def _rewrite_message(index_text: str, content: str) -> Callable[[list[Message]], list[Message]]:
    """A `messages` patch that replaces the text of one user or assistant message of the save."""
    if not index_text.isdigit():
        raise ConfigurationError(f"the message to rewrite is a number from the transcript, not {index_text!r}")
    index = int(index_text)

    def rewrite(messages: list[Message]) -> list[Message]:
        if index >= len(messages) or messages[index].role not in ("user", "assistant"):
            raise ConfigurationError(
                f"message #{index} of this save is not a user or assistant message "
                f"(it has {len(messages)} messages; a tool result is patched with the tool call's result)"
            )
        return [*messages[:index], messages[index].model_copy(update={"content": content}), *messages[index + 1 :]]

    return rewrite


def fork_from_save(ctx: DashboardContext, session_id: str, form: ForkForm) -> Forked:
    """Fork `session_id` from a save with the form's patch; on a fleet, run it now (`run`) or leave it idle."""
    forked = sync(
        fork_session(
            session_id=session_id,
            from_save=form.save,
            checkpoint_store=ctx.bundle.checkpoints,
            patch=patch_of(form),
            new_session_id=form.new_session_id.strip() or None,
        )
    )
    return Forked(forked.session_id, forked.step, forked.save, _start(ctx, forked.session_id, form.run))


def _start(ctx: DashboardContext, session_id: str, run: bool) -> str:
    """As `lousho fork` (`cli_sessions._start_fork`): on a fleet run it now, or keep the reaper off it."""
    if ctx.client is None:
        return f"resume it with agent.resume({session_id!r}) where the agent lives"
    if run:
        ctx.client.resume(session_id)
        return "the fleet runs it now"
    ctx.client.inflight.drop(session_id)  # not running: the reaper leaves it alone until it is resumed
    return "not started: run it from its page"


def resume_session(ctx: DashboardContext, session_id: str) -> str:
    """Wake the fleet on a forked, parked or aborted session (`lousho resume`)."""
    if ctx.client is None:
        raise ConfigurationError("only a fleet's dashboard runs sessions: resume it with agent.resume() instead")
    ctx.client.resume(session_id)
    return "the fleet runs it now"
