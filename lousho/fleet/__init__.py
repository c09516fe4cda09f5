"""The fleet's protocol: what the workers, the reaper and the web app's `Client` share (issue #14).

Settings, Celery's configuration, task names and ids, turn numbers, and each session's Redis keys.
Nothing here imports the worker or the run loop: a web app that enqueues jobs loads this, the
stores and the engine's data types, never the agents' code.
"""

from lousho.fleet.dispatch import (
    StepTask,
    advance_task,
    model_turn_task,
    send,
    send_advance,
    send_model_turn,
    send_tool_call,
    tool_call_task,
    tool_turn,
    turn_number,
)
from lousho.fleet.keys import FleetKeys, new_epoch, result_field
from lousho.fleet.limits import FleetLimits, RateLimit
from lousho.fleet.settings import (
    TASK_ADVANCE,
    TASK_MODEL_TURN,
    TASK_REAP,
    TASK_TOOL_CALL,
    FleetSettings,
    broker_url,
    celery_config,
)

__all__ = [
    "TASK_ADVANCE",
    "TASK_MODEL_TURN",
    "TASK_REAP",
    "TASK_TOOL_CALL",
    "FleetKeys",
    "FleetLimits",
    "FleetSettings",
    "RateLimit",
    "StepTask",
    "advance_task",
    "broker_url",
    "celery_config",
    "model_turn_task",
    "new_epoch",
    "result_field",
    "send",
    "send_advance",
    "send_model_turn",
    "send_tool_call",
    "tool_call_task",
    "tool_turn",
    "turn_number",
]
