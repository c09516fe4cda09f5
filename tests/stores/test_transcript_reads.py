"""A cold read parses a plain transcript in one validation (issue #30), and reads exactly what reading each message
by itself would: the same messages, the same refusal of a damaged one, and no way for raws joined into one array to
read as other messages than they are (lousho/stores/redis_records.py `parse_messages`)."""

from __future__ import annotations

import pytest

from lousho.compact import EveryField
from lousho.errors import CorruptCheckpointError
from lousho.messages import Message, ToolCall
from lousho.stores.codec import PayloadCodec
from lousho.stores.redis_records import parse_messages


def one_by_one(raws: list[bytes]) -> list[Message]:
    return [Message.model_validate_json(raw) for raw in raws]


def transcript() -> list[bytes]:
    calls = [ToolCall(id="a", name="search", arguments={"q": "x"}), ToolCall(id="b", name="search", arguments={})]
    messages = [
        Message.system("be brief"),
        Message.user("find it"),
        Message.assistant(tool_calls=[calls[0]]),
        Message(role="tool", content='[{"hit": 1},{"hit": 2}]', tool_call_id="a", name="search"),  # holds "},{"
        Message.assistant(tool_calls=calls),  # two calls: "},{" between them
        Message.assistant("found"),
    ]
    return [message.model_dump_json().encode() for message in messages]


def test_a_transcript_read_at_once_is_what_reading_each_message_gives() -> None:
    raws = transcript()
    parsed = parse_messages("s", raws)
    assert parsed == one_by_one(raws)
    assert all(isinstance(message.model_fields_set, EveryField) for message in parsed)  # compact models still


def test_a_damaged_message_among_others_is_refused_as_when_read_alone() -> None:
    raws = transcript()
    raws[1] = b'{"role":"robot","content":"hi"}'
    with pytest.raises(CorruptCheckpointError, match="a stored message is damaged"):
        parse_messages("s", raws)


def test_raws_that_would_merge_and_split_when_joined_are_read_one_by_one() -> None:
    """Three damaged raws that, joined into one array, would read as three valid messages: one merging into the next,
    one holding two objects. Each is read alone instead, and refused."""
    merging = [b'{"role":"user","content":"a","x":"}', b'{","role":"user","content":"b"}']
    splitting = b'{"role":"user","content":"c"} , {"role":"user","content":"d"}'
    with pytest.raises(CorruptCheckpointError, match="a stored message is damaged"):
        parse_messages("s", [*merging, splitting])


def test_a_store_that_refuses_plain_values_reads_each_message_through_its_codec() -> None:
    keyed = PayloadCodec(keys={"k1": b"0" * 32})
    with pytest.raises(Exception, match="plain"):
        parse_messages("s", transcript(), keyed)
