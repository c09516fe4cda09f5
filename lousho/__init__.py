"""lousho: durable LLM agent runs, in process or on a Celery fleet."""

from lousho.abort import AbortSignal
from lousho.agent import AgentSession, DurableAgent, EventStream, create_agent
from lousho.approvals import ApprovalDecision, ApprovalSnapshot, ApprovalStore
from lousho.checkpoint import Checkpoint, CheckpointStore, HistoryEntry, get_checkpoint_history
from lousho.definition import Agent
from lousho.errors import (
    AgentDriftError,
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    CheckpointConflictError,
    CheckpointNotFoundError,
    ConfigurationError,
    CorruptApprovalError,
    CorruptCheckpointError,
    InvalidInputError,
    InvalidSessionIdError,
    LeaseLostError,
    PropagatingToolError,
    ProviderError,
    ResumeToolMissingError,
    SDKError,
    SessionAwaitingApprovalError,
    SessionExistsError,
    StoreUnavailableError,
)
from lousho.events import Event
from lousho.executor import AgentExecutor, InvalidDecisionError, ResumeOptions, resume_after_approval
from lousho.fingerprint import AgentFingerprint, Drift
from lousho.fork import ForkPatch, ForkResult
from lousho.messages import Message, ToolCall, Usage
from lousho.providers.base import LLMProvider, ModelRequest, ModelResponse
from lousho.run import AgentDriftWarning, RunResult
from lousho.stores.memory import memory_store
from lousho.subagents import agent_tool
from lousho.tools import Tool, ToolContext, define_tool
from lousho.trajectory import (
    TrajectoryComparison,
    TrajectoryDrift,
    TrajectoryStep,
    compare_trajectories,
)

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
    "StoreUnavailableError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "Usage",
    "define_tool",
    "get_checkpoint_history",
    "memory_store",
    "resume_after_approval",
]
