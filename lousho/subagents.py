"""Sub-agents: an agent given to another agent as a tool.

The sub-agent runs durably under its own session (`<parent>.sub-<call id>`), in the
same stores. When it pauses for an approval, the parent pauses on the same
approval id, with the sub-agent's snapshot nested in its own; resolving it resumes
the sub-agent first and then the parent (reference: checkpoint table, approvals row).
The runs themselves are started by the parent's loop (`Run.run_sub_agent`): this module
defines the tool and names the child's session, and imports no run loop (issue #14).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from lousho.tools import Tool, ToolContext

if TYPE_CHECKING:
    from lousho.definition import Agent

__all__ = ["SubAgentInput", "agent_tool"]


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
