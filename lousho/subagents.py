"""Sub-agents: an agent given to another agent as a tool.

The sub-agent runs durably under its own session (`<parent>.sub-<call id>`), in the
same stores. When it pauses for an approval, the parent pauses on the same
approval id, with the sub-agent's snapshot nested in its own; resolving it resumes
the sub-agent first and then the parent (reference: checkpoint table, approvals row).
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from lousho.checkpoint import maybe_await
from lousho.messages import ToolCall
from lousho.tools import Tool, ToolContext

if TYPE_CHECKING:
    from lousho.definition import Agent
    from lousho.run import Run, RunResult

__all__ = ["SubAgentInput", "agent_tool", "child_session_id", "resume_sub_agent", "run_sub_agent"]


class SubAgentInput(BaseModel):
    """What the calling model sends a sub-agent."""

    input: str


def _not_called_directly(args: SubAgentInput, ctx: ToolContext) -> None:
    raise RuntimeError("a sub-agent tool is run by the engine, not called directly")


def agent_tool(agent: Agent, *, name: str | None = None, description: str | None = None) -> Tool[SubAgentInput]:
    """Give `agent` to another agent as a tool named `name` (default: the agent's name)."""
    return Tool(
        name=name or agent.name,
        description=description or f"Ask the {agent.name} agent to do a task; send it the task as `input`.",
        input=SubAgentInput,
        execute=_not_called_directly,
        sub_agent=agent,
    )


def child_session_id(parent_session_id: str, call: ToolCall) -> str:
    """A stable, valid session id for the sub-agent run of one call."""
    safe = (
        call.id
        if re.fullmatch(r"[A-Za-z0-9_.:@=+-]{1,80}", call.id)
        else hashlib.sha256(call.id.encode()).hexdigest()[:20]
    )
    return f"{parent_session_id}.sub-{safe}"


async def run_sub_agent(parent: Run, call: ToolCall, args: SubAgentInput, agent: Agent) -> RunResult:
    """Run (or resume, or read the finished result of) the sub-agent for `call`."""
    from lousho.executor import AgentExecutor
    from lousho.run import RunResult

    session_id = child_session_id(parent.session_id or "run", call)
    if parent.checkpoint_store is not None:
        stored = await maybe_await(parent.checkpoint_store.load(session_id))
        if stored is not None and stored.status == "finished":
            return RunResult.of(stored, "stop")  # it finished before the parent recorded the result
    return await AgentExecutor.execute(
        agent=agent,
        input=args.input,
        provider=parent.provider,
        session_id=session_id,
        checkpoint_store=parent.checkpoint_store,
        approval_store=parent.approval_store,
        signal=parent.signal,
        on_agent_drift="ignore",
    )


async def resume_sub_agent(parent: Run, call: ToolCall, agent: Agent, snapshot: Any) -> RunResult:
    """Apply the parent's decision to the nested sub-agent snapshot, then let the sub-agent go on."""
    session_id = child_session_id(parent.session_id or "run", call)
    child = snapshot.child.model_copy(
        update={"status": snapshot.status, "note": snapshot.note, "decided_at": snapshot.decided_at}
    )
    stored = None
    if parent.checkpoint_store is not None:
        stored = await maybe_await(parent.checkpoint_store.load(session_id))
    checkpoint = stored if stored is not None else child.checkpoint
    if checkpoint.status != "awaiting-approval" or checkpoint.approval_id != child.id:
        return await run_sub_agent(parent, call, SubAgentInput.model_validate(call.arguments), agent)
    from lousho.run import Run

    run = Run(
        agent=await agent.resolve(checkpoint.run_config),
        provider=parent.provider,
        session_id=session_id,
        checkpoint_store=parent.checkpoint_store if stored is not None else None,
        approval_store=parent.approval_store,
        max_steps=agent.max_steps,
        signal=parent.signal,
        on_agent_drift="ignore",  # a resume compares only the top-level agent (reference)
    )
    result: RunResult = await run.apply_decision(child, checkpoint, None)
    return result
