"""Sample records using every field, and `race()` for the concurrency tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from lousho.approvals import ApprovalSnapshot
from lousho.checkpoint import Checkpoint, maybe_await
from lousho.fingerprint import AgentFingerprint
from lousho.messages import Message, ToolCall, Usage

__all__ = ["WRITERS", "race", "sample_checkpoint", "sample_snapshot"]

WRITERS = 8
"""Threads racing in the concurrency tests."""


def sample_checkpoint(session_id: str, version: int = 1, step: int = 0, **update: Any) -> Checkpoint:
    """A checkpoint using every field: tool calls and results, usage, non-ASCII business_state, fingerprint."""
    fields: dict[str, Any] = {
        "session_id": session_id,
        "version": version,
        "step_index": step,
        "status": "awaiting-approval",
        "agent_name": "booker",
        "messages": [
            Message.system("You book tables."),
            Message.user('Table for 2, ce soir \U0001f377 "by the window"'),
            Message.assistant("Checking", [ToolCall(id="call_1", name="find", arguments={"party": 2, "tags": [None]})]),
            Message(role="tool", content='{"table": 7}', tool_call_id="call_1", name="find"),
            Message.assistant(tool_calls=[ToolCall(id="call_2", name="book", arguments={"table": 7})]),
        ],
        "usage": Usage(input_tokens=120, output_tokens=33),
        "run_start": 1,
        "run_input_count": 1,
        "pending_input": [Message.user("and a highchair")],
        "business_state": {
            "cart": [1, 2.5, "x", None],
            "nested": {"ok": True},
            "text": "\u00fcn\u00efc\u00f8d\u00e9\n",
        },
        "approval_id": "appr_1",
        "fingerprint": AgentFingerprint(
            model="gpt-4o-mini", tools={"find": "a" * 64, "book": "b" * 64}, instructions="c" * 64, digest="0" * 12
        ),
        "run_config": {"ctx": {"tenant": "acme"}, "model": "gpt-4o-mini"},
    }
    fields.update(update)
    return Checkpoint(**fields)


def sample_snapshot(
    approval_id: str, session_id: str = "s-approvals", created_at: str | None = None
) -> ApprovalSnapshot:
    """A pending approval snapshot with remaining calls, a checkpoint and metadata."""
    call = ToolCall(id="call_2", name="book", arguments={"table": 7})
    extra = {"created_at": created_at} if created_at else {}
    return ApprovalSnapshot(
        id=approval_id,
        session_id=session_id,
        agent_name="booker",
        tool_call=call,
        remaining_tool_calls=[ToolCall(id="call_3", name="notify", arguments={"to": "guest"})],
        checkpoint=sample_checkpoint(session_id, approval_id=approval_id),
        max_steps=10,
        metadata={"tenant": "acme"},
        **extra,
    )


def race(count: int, action: Callable[[int], Any]) -> list[Any]:
    """Run `action(i)` in `count` threads released together; each result or the exception it raised.

    An awaitable result runs on the thread's own event loop (a store bound to one loop
    cannot be raced this way)."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def worker(index: int) -> None:
        barrier.wait()
        try:
            value = action(index)
            results[index] = asyncio.run(maybe_await(value)) if hasattr(value, "__await__") else value
        except BaseException as error:  # the test inspects what each writer got
            results[index] = error

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results
