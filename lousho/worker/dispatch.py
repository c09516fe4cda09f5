"""Sending lousho's tasks: the one place that names them, their ids and what Flower shows.

Used by workers (to enqueue the next step), the reaper and the web-app `Client`, so none
of them needs the agents' code. Arguments are ids only: prompts and secrets never enter a
broker message or Flower.
"""

from __future__ import annotations

import uuid
from typing import Any

from lousho.worker.config import TASK_ADVANCE, TASK_MODEL_TURN, TASK_TOOL_CALL

__all__ = ["send_advance", "send_model_turn", "send_tool_call"]


def send_model_turn(app: Any, session_id: str, turn: int) -> None:
    """Ask the fleet for model turn `turn` (counted over the whole transcript) of `session_id`."""
    app.send_task(
        TASK_MODEL_TURN,
        args=[session_id, turn],
        task_id=f"{session_id}/turn/{turn}",
        queue=app.conf.task_default_queue,
        argsrepr=f"session={session_id} turn={turn}",
    )


def send_tool_call(app: Any, session_id: str, tool_call_id: str, tool_name: str, turn: int) -> None:
    """Run one tool call of model turn `turn`; Flower shows it as `tool:<name>`."""
    app.send_task(
        TASK_TOOL_CALL,
        args=[session_id, tool_call_id, tool_name, turn],
        task_id=f"{session_id}/turn/{turn}/tool/{tool_call_id}",
        queue=app.conf.task_default_queue,
        shadow=f"tool:{tool_name}",
        argsrepr=f"session={session_id} turn={turn} call={tool_call_id} tool={tool_name}",
    )


def send_advance(app: Any, session_id: str, reason: str) -> None:
    """Look at the session's checkpoint and do what is next (after an approval, an abort, a requeue)."""
    app.send_task(
        TASK_ADVANCE,
        args=[session_id, reason],
        task_id=f"{session_id}/advance/{uuid.uuid4().hex[:12]}",
        queue=app.conf.task_default_queue,
        argsrepr=f"session={session_id} reason={reason}",
    )
