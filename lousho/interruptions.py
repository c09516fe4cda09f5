"""Calls that may have run when their run was interrupted: each tool's `on_interrupted` policy (issue #17).

A call "may have run" when it started and its result was never recorded: its worker died in the middle
(SIGKILL, a lost node), or its run was aborted while it ran. A 'rerun' tool (the default) simply runs
again with the same `tool_call_id`. For the others lousho must know a call began:

- in process, the run saves the call's id in `Checkpoint.started_calls` before it runs it (one more
  save, only for tools that are not 'rerun'); the id goes as its result is recorded;
- on the fleet, each start of a call is counted in Redis (lua/call_begin.lua): a second start of a call
  whose first one never committed a result is the interrupted case.

Then 'fail' records `interrupted_result` and the model goes on; 'ask' pauses the session on an approval
of kind 'interrupted', whose decision says what the call did: run it again, record a result the human
typed, or record a failure (`decided_interrupted_result`). Both drivers use the functions below.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

from lousho.approvals import ApprovalSnapshot
from lousho.checkpoint import Checkpoint
from lousho.definition import ResolvedAgent
from lousho.messages import ToolCall
from lousho.tools import interrupted_result

__all__ = ["decided_interrupted_result", "interruption_of", "mark_started", "needs_start_mark"]


def interruption_of(agent: ResolvedAgent, call: ToolCall, started: Collection[str]) -> Literal["ask", "fail"] | None:
    """What a pending call whose id is in `started` (it began and never recorded a result) does instead
    of running again: its tool's policy, or None when it simply runs (a 'rerun' tool, a tool now gone)."""
    tool = agent.tools.get(call.name)
    if tool is None or call.id not in started or tool.sub_agent is not None or tool.on_interrupted == "rerun":
        return None
    return tool.on_interrupted


def needs_start_mark(agent: ResolvedAgent, call: ToolCall, checkpoint: Checkpoint) -> bool:
    """True when `call` is about to run and a crash must leave a trace of its start: its tool is not
    'rerun' and the checkpoint does not say so already. A 'rerun' tool costs no extra save."""
    tool = agent.tools.get(call.name)
    return (
        tool is not None
        and tool.sub_agent is None
        and tool.on_interrupted != "rerun"
        and call.id not in checkpoint.started_calls
    )


def mark_started(checkpoint: Checkpoint, call_id: str) -> Checkpoint:
    """The checkpoint saying that `call_id` began (not saved)."""
    return checkpoint.model_copy(update={"started_calls": [*checkpoint.started_calls, call_id]})


def decided_interrupted_result(snapshot: ApprovalSnapshot) -> tuple[bool, Any]:
    """A decided interrupted-call approval: (True, None) to run the call again, else (False, the result
    to record): the human's typed result, or the failure the model reads (with the human's note)."""
    action = snapshot.interrupted_action
    if action == "rerun":
        return True, None
    if action == "record":
        return False, snapshot.result
    failed = interrupted_result(snapshot.tool_call.name)
    if snapshot.note:
        failed["note"] = f"{failed['note']} A human's note: {snapshot.note}"
    return False, failed
