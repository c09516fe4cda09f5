"""Which process runs which tool call, and how often each call started: the demo's own ledger in Redis.

The demo's workers record it through the agent's `before_tool`/`after_tool` hooks; the demo reads it
to find a worker in the middle of a tool call (to kill it) and to show that a killed call ran again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import redis

from lousho.messages import ToolCall
from lousho.tools import ToolContext

__all__ = ["running_key", "runs_key", "tracking_hooks"]


def running_key(prefix: str) -> str:
    """Hash call id -> JSON {pid, session, tool, started}: the tool calls running right now."""
    return f"{prefix}demo:running"


def runs_key(prefix: str) -> str:
    """Hash call id -> how many times the call started."""
    return f"{prefix}demo:runs"


def tracking_hooks(client: redis.Redis, prefix: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """`(before_tool, after_tool)` hooks that keep the ledger."""

    def before_tool(call: ToolCall, ctx: ToolContext) -> None:
        entry = {"pid": os.getpid(), "session": ctx.session_id, "tool": call.name, "started": time.time()}
        client.hset(running_key(prefix), call.id, json.dumps(entry))
        client.hincrby(runs_key(prefix), call.id, 1)

    def after_tool(call: ToolCall, result: Any) -> None:
        client.hdel(running_key(prefix), call.id)

    return before_tool, after_tool
