"""The transcript: what is sent to a model and what is stored in a checkpoint.

Models are frozen: a checkpoint shares message objects with the one before it,
so nothing may change a message after it was recorded.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from lousho.compact import CompactModel
from lousho.errors import InvalidInputError

__all__ = [
    "ACCEPTED_INPUT",
    "INVALID_JSON_KEY",
    "Message",
    "Role",
    "ToolCall",
    "Usage",
    "as_messages",
    "text_chars",
    "unencodable_text",
]

Role = Literal["system", "user", "assistant", "tool"]

INVALID_JSON_KEY = "__invalid_json__"
"""A provider that receives tool-call arguments that are not a JSON object stores them as
`{INVALID_JSON_KEY: <raw text>}`; the engine turns that into an error result the model reads."""


class ToolCall(CompactModel):
    """One call the model asked for."""

    model_config = ConfigDict(frozen=True)

    id: str
    """The model's id for the call; unchanged when the call is re-run on resume."""
    name: str
    """The tool's name, as the model wrote it (it may name no tool we have)."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """The arguments as JSON, before validation against the tool's input model."""


class Message(CompactModel):
    """One message of the transcript."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str | None = None
    """Text; for a tool message, the JSON of the result."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """On an assistant message: the calls it asks for, in call order."""
    tool_call_id: str | None = None
    """On a tool message: the call it answers."""
    name: str | None = None
    """On a tool message: the tool's name."""

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls(role="user", content=content)

    @classmethod
    def assistant(cls, content: str | None = None, tool_calls: list[ToolCall] | None = None) -> Message:
        return cls(role="assistant", content=content, tool_calls=tool_calls or [])

    @classmethod
    def tool_result(cls, call: ToolCall, result: Any) -> Message:
        content = json.dumps(result, default=str, ensure_ascii=False)
        if _first_unencodable(content) is not None:  # a lone surrogate: its JSON escape stores (issue #31)
            content = json.dumps(result, default=str)
        # built from a validated call and a str: nothing to validate (issue #30). Every field given: pydantic works
        # out a missing field's default_factory signature on each construct (2.6% of a busy worker's CPU, issue #29)
        return cls.model_construct(role="tool", content=content, tool_calls=[], tool_call_id=call.id, name=call.name)

    def result(self) -> Any:
        """A tool message's result, decoded from its JSON content."""
        return json.loads(self.content) if self.content else None

    def same_turn(self, other: Message) -> bool:
        """Same role and text: how re-sent input is recognised (ids and calls aside)."""
        return self.role == other.role and self.content == other.content


class Usage(CompactModel):
    """Token counts, summed over the model turns of a run."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


def _first_unencodable(text: str) -> int | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _unencodable_in(value: Any, where: str) -> str | None:
    """Where in `value` (a JSON value: text, or lists and dicts of them) text cannot be encoded."""
    if isinstance(value, str):
        at = _first_unencodable(value)
        return None if at is None else f"character {at} of its {where}"
    if isinstance(value, dict):
        found = (_unencodable_in(k, f"{where} key") or _unencodable_in(v, f"{where}.{k}") for k, v in value.items())
        return next((f for f in found if f is not None), None)
    if isinstance(value, list | tuple):
        return next((f for i, v in enumerate(value) if (f := _unencodable_in(v, f"{where}[{i}]")) is not None), None)
    return None


def unencodable_text(message: Message) -> str | None:
    """Where `message` holds text that no store can encode (UTF-8): a lone surrogate such as U+D800, what the
    JSON escape "\\ud800" decodes to. Say "character 4 of its content"; None when all of it can (issue #31).
    Never the text itself: it may be large, or secret."""
    parts: dict[str, Any] = {"content": message.content, "name": message.name, "tool_call_id": message.tool_call_id}
    for i, call in enumerate(message.tool_calls):
        parts.update({f"tool call {i + 1}'s id": call.id, f"tool call {i + 1}'s name": call.name})
        parts[f"tool call {i + 1}'s arguments"] = call.arguments
    return next((f for where, v in parts.items() if (f := _unencodable_in(v, where)) is not None), None)


def text_chars(messages: list[Message]) -> int:
    """How much text `messages` hold, in characters: their contents and their tool calls' arguments (as JSON)."""
    calls = sum(len(json.dumps(call.arguments, default=str)) for m in messages for call in m.tool_calls)
    return calls + sum(len(m.content or "") for m in messages)


ACCEPTED_INPUT = (
    "input is text, a Message, a message dict such as {'role': 'user', 'content': 'Hi'}, or a list of those; "
    "each message carries text; tool calls and their results are recorded by lousho, not passed as input "
    "(only a re-sent copy of a session's own history holds them)"
)
"""What every `InvalidInputError` says is accepted (issue #21)."""


def _one_message(item: object) -> Message:
    if isinstance(item, Message):
        return item
    if isinstance(item, str):
        return Message.user(item)
    if isinstance(item, dict):
        try:
            return Message.model_validate(item)
        except ValidationError as exc:
            problem = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'message'}: {e['msg']}" for e in exc.errors())
            raise InvalidInputError(f"{item!r:.200} is not a message ({problem}); {ACCEPTED_INPUT}") from exc
    raise InvalidInputError(f"{item!r:.200} ({type(item).__name__}) is not a message; {ACCEPTED_INPUT}")


def as_messages(value: object) -> list[Message]:
    """Normalise what a caller passes as `input` into a list of messages.

    Any other shape (a number, nested lists, a dict that is not a message) raises `InvalidInputError`,
    never a `TypeError` or pydantic's `ValidationError` (issue #21)."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [_one_message(item) for item in value]
    return [_one_message(value)]
