"""Small helpers the engine tests share: reading what was saved, and checking a transcript."""

from __future__ import annotations

from lousho import Checkpoint, Message
from lousho.stores.memory import MemoryStore


def saves(store: MemoryStore, session_id: str) -> list[Checkpoint]:
    """Every checkpoint saved for the session, oldest first (from the history ring)."""
    return [entry.checkpoint for entry in reversed(store.checkpoints.history(session_id))]


def tool_results(messages: list[Message]) -> list[str]:
    """The call ids of the tool messages, in transcript order."""
    return [m.tool_call_id or "" for m in messages if m.role == "tool"]


def assert_valid_transcript(messages: list[Message]) -> None:
    """Tool results directly follow their tool-call turn, exactly one per call, in call order."""
    index = 0
    while index < len(messages):
        message = messages[index]
        if message.role == "tool":
            raise AssertionError(f"tool message {message.tool_call_id} at {index} does not follow its tool-call turn")
        if message.role == "assistant" and message.tool_calls:
            expected = [c.id for c in message.tool_calls]
            following = messages[index + 1 : index + 1 + len(expected)]
            got = [m.tool_call_id for m in following if m.role == "tool"]
            is_last_turn = index + 1 + len(got) == len(messages)
            if got != expected[: len(got)] or (len(got) < len(expected) and not is_last_turn):
                raise AssertionError(f"turn at {index} expects results {expected}, found {got}")
            index += 1 + len(got)
            continue
        index += 1


def assert_finished_with_every_result(checkpoint: Checkpoint | None, session: str) -> None:
    """Finished, a valid transcript, and one result per call in call order."""
    assert checkpoint is not None and checkpoint.status == "finished", session
    assert_valid_transcript(checkpoint.messages)
    calls = [c.id for m in checkpoint.messages if m.role == "assistant" for c in m.tool_calls]
    assert [m.tool_call_id for m in checkpoint.messages if m.role == "tool"] == calls, session
