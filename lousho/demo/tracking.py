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
from lousho.providers.base import LLMProvider, ModelRequest, ModelResponse
from lousho.tools import ToolContext

__all__ = ["CountingProvider", "asked_key", "running_key", "runs_key", "tracking_hooks"]


def running_key(prefix: str) -> str:
    """Hash call id -> JSON {pid, session, tool, started}: the tool calls running right now."""
    return f"{prefix}demo:running"


def runs_key(prefix: str) -> str:
    """Hash call id -> how many times the call started."""
    return f"{prefix}demo:runs"


def asked_key(prefix: str) -> str:
    """Hash '<session>:<turn>' -> how many times the model was asked for that turn."""
    return f"{prefix}demo:asked"


class CountingProvider:
    """A provider that counts, per session and turn, how often the model was asked (then asks `inner`)."""

    def __init__(self, inner: LLMProvider, client: redis.Redis, prefix: str) -> None:
        self.inner = inner
        self.client = client
        self.prefix = prefix

    async def generate(self, request: ModelRequest) -> ModelResponse:
        turn = sum(m.role == "assistant" for m in request.messages) + 1
        self.client.hincrby(asked_key(self.prefix), f"{request.session_id}:{turn}", 1)
        return await self.inner.generate(request)


def tracking_hooks(client: redis.Redis, prefix: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """`(before_tool, after_tool)` hooks that keep the ledger."""

    def before_tool(call: ToolCall, ctx: ToolContext) -> None:
        entry = {"pid": os.getpid(), "session": ctx.session_id, "tool": call.name, "started": time.time()}
        # One MULTI: the demo kills a worker once it sees the call running, and a kill between two commands left a
        # run uncounted ("ran 1 times in all" after a kill, seen in CI; issue #33).
        pipe = client.pipeline(transaction=True)
        pipe.hset(running_key(prefix), call.id, json.dumps(entry))
        pipe.hincrby(runs_key(prefix), call.id, 1)
        pipe.execute()

    def after_tool(call: ToolCall, result: Any) -> None:
        client.hdel(running_key(prefix), call.id)

    return before_tool, after_tool
