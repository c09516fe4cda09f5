"""lousho's tasks: the one place that names them, their ids, their turn numbers and what Flower shows.

Used by workers (to enqueue the next step), the reaper and the web-app `Client`, so none
of them needs the agents' code. Arguments are ids only: prompts and secrets never enter a
broker message or Flower. A worker ending a step usually does not send its next task with
`send`: the script that ends the step pushes it (`outbox.py`); `send` is the way when it can't.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from kombu.exceptions import ChannelError

from lousho.checkpoint import Checkpoint
from lousho.fleet.protocol import message_headers
from lousho.fleet.settings import TASK_ADVANCE, TASK_MODEL_TURN, TASK_TOOL_CALL

__all__ = [
    "StepTask",
    "advance_task",
    "model_turn_task",
    "send",
    "send_advance",
    "send_model_turn",
    "send_tool_call",
    "queue_is_empty",
    "tool_call_task",
    "tool_turn",
    "turn_number",
]


@dataclass(frozen=True)
class StepTask:
    """One task message of lousho's, before it is sent."""

    name: str
    args: list[Any]
    task_id: str
    argsrepr: str
    """What Flower shows for the arguments."""
    shadow: str | None = None
    """The name Flower shows instead of `name`."""


def model_turn_task(session_id: str, turn: int) -> StepTask:
    """Model turn `turn` (counted over the whole transcript) of `session_id`."""
    return StepTask(
        TASK_MODEL_TURN, [session_id, turn], f"{session_id}/turn/{turn}", f"session={session_id} turn={turn}"
    )


def tool_call_task(session_id: str, tool_call_id: str, tool_name: str, turn: int) -> StepTask:
    """One tool call of model turn `turn`; Flower shows it as `tool:<name>`."""
    return StepTask(
        TASK_TOOL_CALL,
        [session_id, tool_call_id, tool_name, turn],
        f"{session_id}/turn/{turn}/tool/{tool_call_id}",
        f"session={session_id} turn={turn} call={tool_call_id} tool={tool_name}",
        shadow=f"tool:{tool_name}",
    )


def advance_task(session_id: str, reason: str) -> StepTask:
    """Look at the session's checkpoint and do what is next (after an approval, an abort, a requeue)."""
    return StepTask(
        TASK_ADVANCE,
        [session_id, reason],
        f"{session_id}/advance/{uuid.uuid4().hex[:12]}",
        f"session={session_id} reason={reason}",
    )


def send(app: Any, task: StepTask, queue: str | None = None, *, countdown_s: float | None = None) -> None:
    """Send `task` through Celery to `queue` (default: the app's; a `Client` routes by agent, issue #15);
    `countdown_s`: not to run before then (a model turn waiting for a slot of its agent, issue #29)."""
    app.send_task(
        task.name,
        args=task.args,
        task_id=task.task_id,
        queue=queue or app.conf.task_default_queue,
        shadow=task.shadow,
        argsrepr=task.argsrepr,
        headers=message_headers(),  # the message's protocol (issue #35)
        **({"countdown": countdown_s} if countdown_s else {}),
    )


def send_model_turn(app: Any, session_id: str, turn: int, queue: str | None = None) -> None:
    send(app, model_turn_task(session_id, turn), queue)


def send_tool_call(app: Any, session_id: str, tool_call_id: str, tool_name: str, turn: int) -> None:
    send(app, tool_call_task(session_id, tool_call_id, tool_name, turn))


def send_advance(app: Any, session_id: str, reason: str, queue: str | None = None) -> None:
    send(app, advance_task(session_id, reason), queue)


def queue_is_empty(app: Any, queue: str | None = None) -> bool:
    """Whether no message waits on `queue` (default: the app's): a passive declare, which both kombu's Redis
    transport (every priority list) and RabbitMQ answer with the count of ready messages; a queue the broker
    does not know holds none. How the reaper tells a re-send that was lost from one still queued (issue #31)."""
    with app.connection_for_read() as connection:
        try:
            declared = connection.default_channel.queue_declare(
                queue=queue or app.conf.task_default_queue, passive=True
            )
        except ChannelError:
            return True
        return int(declared.message_count) == 0


def turn_number(checkpoint: Checkpoint) -> int:
    """The next model turn's number over the whole transcript (task ids stay unique across runs)."""
    return checkpoint.turns + 1


def tool_turn(checkpoint: Checkpoint) -> int:
    """The newest model turn's number: the turn whose tool calls are pending, if any."""
    return turn_number(checkpoint) - 1
