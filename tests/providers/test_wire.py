"""The transcript mappings and the shared helpers, without a server."""

from __future__ import annotations

import json

import pytest

from lousho.messages import Message, ToolCall
from lousho.providers._wire import decode_arguments, encode_arguments, retry_after_seconds
from lousho.providers.anthropic import to_anthropic_messages
from lousho.providers.openai import to_openai_messages
from lousho.tools import tool_error

CALL = ToolCall(id="c1", name="weather", arguments={"city": "Lisbon"})
BROKEN = ToolCall(id="c2", name="weather", arguments={"__invalid_json__": '{"city": '})


def test_anthropic_merges_results_and_the_input_queued_after_them_into_one_user_message() -> None:
    system, messages = to_anthropic_messages(
        [
            Message.system("Rule one."),
            Message.system("Rule two."),
            Message.user("Go"),
            Message.assistant(tool_calls=[CALL, BROKEN]),
            Message.tool_result(CALL, {"forecast": "sun"}),
            Message.tool_result(BROKEN, tool_error("invalid arguments for weather", "Fix them.")),
            Message.user("Actually, Porto"),
            Message.assistant(""),  # an empty turn: the API refuses it, so it is left out
            Message.assistant("Porto it is."),
        ]
    )
    assert system == "Rule one.\n\nRule two."
    assert messages == [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Lisbon"}},
            {"type": "tool_use", "id": "c2", "name": "weather", "input": {"__invalid_json__": '{"city": '}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": '{"forecast": "sun"}'},
            {"type": "tool_result", "tool_use_id": "c2", "is_error": True,
             "content": json.dumps(tool_error("invalid arguments for weather", "Fix them."))},
            {"type": "text", "text": "Actually, Porto"},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "Porto it is."}]},
    ]  # fmt: skip


def test_openai_sends_results_as_tool_messages_and_broken_arguments_as_the_model_wrote_them() -> None:
    messages = to_openai_messages(
        [Message.user("Go"), Message.assistant(tool_calls=[CALL, BROKEN]), Message.tool_result(CALL, {"ok": 1})]
    )
    assert messages[1]["tool_calls"][1]["function"]["arguments"] == '{"city": '
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Lisbon"}'
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": '{"ok": 1}'}


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        ('{"a": 1}', {"a": 1}),
        ("", {}),
        (None, {}),
        ('{"a": ', {"__invalid_json__": '{"a": '}),
        ("[1, 2]", {"__invalid_json__": "[1, 2]"}),
        ('"text"', {"__invalid_json__": '"text"'}),
    ],
)
def test_arguments_are_decoded_or_kept_raw(raw: str | None, decoded: dict[str, object]) -> None:
    assert decode_arguments(raw) == decoded
    if raw:
        assert encode_arguments(decoded) in (raw, json.dumps(decoded))


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [({}, None), ({"retry-after": "3"}, 3.0), ({"retry-after": "0.5"}, 0.5), ({"retry-after-ms": "250"}, 0.25),
     ({"retry-after": "soon"}, None), ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None)],
)  # fmt: skip
def test_retry_after_headers(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after_seconds(headers) == seconds
