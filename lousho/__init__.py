"""lousho: durable LLM agent runs, in process or on a Celery fleet.

The run loop's names (`create_agent`, `AgentExecutor`, `RunResult`, `agent_tool`, ...) load on first
use, so a web app that imports `lousho.scheduler` for its `Client` loads neither the run loop nor the
worker (issue #14).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lousho._version import __version__ as __version__
from lousho.abort import AbortSignal
from lousho.approvals import ApprovalDecision, ApprovalSnapshot, ApprovalStore
from lousho.checkpoint import Checkpoint, CheckpointStore, HistoryEntry, get_checkpoint_history
from lousho.definition import Agent
from lousho.errors import (
    AgentDriftError,
    ApprovalAlreadyResolvedError,
    ApprovalCallChangedError,
    ApprovalNotFoundError,
    CheckpointConflictError,
    CheckpointNotFoundError,
    ConfigurationError,
    CorruptApprovalError,
    CorruptCheckpointError,
    InvalidDecisionError,
    InvalidInputError,
    InvalidSessionIdError,
    LeaseLostError,
    NewerFormatError,
    NewerLayoutError,
    PropagatingToolError,
    ProviderError,
    ResumeToolMissingError,
    SDKError,
    SessionAwaitingApprovalError,
    SessionExistsError,
    SessionLiveError,
    SessionNotFoundError,
    StoreAuthenticationError,
    StoreUnavailableError,
)
from lousho.events import Event
from lousho.fingerprint import AgentFingerprint, Drift
from lousho.fork import ForkPatch, ForkResult
from lousho.messages import Message, ToolCall, Usage
from lousho.providers.base import LLMProvider, ModelRequest, ModelResponse
from lousho.store_bundle import StoreBundle
from lousho.stores.mapping import mapping_store
from lousho.stores.memory import memory_store
from lousho.tools import Tool, ToolContext, define_tool
from lousho.trajectory import (
    TrajectoryComparison,
    TrajectoryDrift,
    TrajectoryStep,
    compare_trajectories,
)

if TYPE_CHECKING:
    from lousho.agent import AgentSession, DurableAgent, EventStream, create_agent
    from lousho.executor import AgentExecutor, ResumeOptions, resume_after_approval
    from lousho.run import AgentDriftWarning, RunResult
    from lousho.subagents import agent_tool

_RUN_LOOP = {
    "AgentSession": "lousho.agent",
    "DurableAgent": "lousho.agent",
    "EventStream": "lousho.agent",
    "create_agent": "lousho.agent",
    "AgentExecutor": "lousho.executor",
    "ResumeOptions": "lousho.executor",
    "resume_after_approval": "lousho.executor",
    "AgentDriftWarning": "lousho.run",
    "RunResult": "lousho.run",
    "agent_tool": "lousho.subagents",
}


def __getattr__(name: str) -> Any:
    if name not in _RUN_LOOP:
        raise AttributeError(f"module 'lousho' has no attribute {name!r}")
    return getattr(importlib.import_module(_RUN_LOOP[name]), name)


__all__ = [
    "AbortSignal",
    "Agent",
    "AgentSession",
    "DurableAgent",
    "EventStream",
    "ForkPatch",
    "ForkResult",
    "SessionExistsError",
    "TrajectoryComparison",
    "TrajectoryDrift",
    "TrajectoryStep",
    "agent_tool",
    "compare_trajectories",
    "create_agent",
    "AgentDriftError",
    "AgentDriftWarning",
    "AgentExecutor",
    "AgentFingerprint",
    "ApprovalAlreadyResolvedError",
    "ApprovalCallChangedError",
    "ApprovalDecision",
    "ApprovalNotFoundError",
    "ApprovalSnapshot",
    "ApprovalStore",
    "Checkpoint",
    "CheckpointConflictError",
    "CheckpointNotFoundError",
    "CheckpointStore",
    "ConfigurationError",
    "CorruptApprovalError",
    "CorruptCheckpointError",
    "Drift",
    "Event",
    "HistoryEntry",
    "InvalidDecisionError",
    "InvalidInputError",
    "InvalidSessionIdError",
    "LeaseLostError",
    "LLMProvider",
    "NewerFormatError",
    "NewerLayoutError",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "PropagatingToolError",
    "ProviderError",
    "ResumeOptions",
    "ResumeToolMissingError",
    "RunResult",
    "SDKError",
    "SessionAwaitingApprovalError",
    "SessionLiveError",
    "SessionNotFoundError",
    "StoreAuthenticationError",
    "StoreBundle",
    "StoreUnavailableError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "Usage",
    "define_tool",
    "get_checkpoint_history",
    "mapping_store",
    "memory_store",
    "resume_after_approval",
]
