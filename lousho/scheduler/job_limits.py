"""What `Client.enqueue` takes: each part of a job over its `FleetSettings` limit is an `InputTooLargeError`,
refused before anything is written, that tells the size and the limit and quotes no part of the job.

| part | limit | measured in |
| - | - | - |
| agent name | `max_agent_name_chars` | characters |
| session id | `max_session_id_chars` | characters (`SessionIdTooLongError`) |
| input | `max_input_messages` | messages |
| input | `max_input_chars` | characters of text and tool-call arguments |
| business state | `max_business_state_chars` | characters of its JSON |
"""

from __future__ import annotations

from typing import Any

from lousho.errors import InputTooLargeError, SessionIdTooLongError
from lousho.fleet.settings import FleetSettings
from lousho.inputs import validate_business_state
from lousho.messages import Message, text_chars

__all__ = ["check_input_chars", "check_job_size", "check_name_lengths"]


def check_name_lengths(settings: FleetSettings, agent_name: object, session_id: object) -> None:
    """Names over their limits refused before they are used, or shown in an error."""
    if isinstance(agent_name, str) and len(agent_name) > settings.max_agent_name_chars:
        raise InputTooLargeError("agent name", len(agent_name), settings.max_agent_name_chars, "max_agent_name_chars")
    if isinstance(session_id, str) and len(session_id) > settings.max_session_id_chars:
        raise SessionIdTooLongError(
            "session id", len(session_id), settings.max_session_id_chars, "max_session_id_chars"
        )


def check_job_size(settings: FleetSettings, input: Any, business_state: Any) -> None:
    """How many messages the input holds and how large the business state is, refused over their limits before
    the session is read; a business state no store can save is an `InvalidInputError`."""
    count = 0 if input is None else len(input) if isinstance(input, list | tuple) else 1
    if count > settings.max_input_messages:
        raise InputTooLargeError("input", count, settings.max_input_messages, "max_input_messages", unit="messages")
    size = validate_business_state(business_state)
    if size > settings.max_business_state_chars:
        raise InputTooLargeError(
            "business_state", size, settings.max_business_state_chars, "max_business_state_chars",
            unit="characters of JSON",
        )  # fmt: skip


def check_input_chars(settings: FleetSettings, messages: list[Message]) -> None:
    """The input's text (contents and tool-call arguments) over `max_input_chars` refused."""
    size = text_chars(messages)
    if size > settings.max_input_chars:
        raise InputTooLargeError("input", size, settings.max_input_chars, "max_input_chars")
