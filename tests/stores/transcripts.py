"""Transcripts for the growth tests: one run, save by save, each checkpoint one ~1 KB message longer."""

from __future__ import annotations

from collections.abc import Iterator

from lousho.checkpoint import Checkpoint
from lousho.messages import Message, ToolCall


def message(step: int, size: int = 1000) -> Message:
    """A ~1 KB assistant turn asking for a tool, or its result, alternating like a tool loop."""
    text = f"step {step}: " + ("lorem ipsum " * (size // 12 + 1))[:size]
    if step % 2:
        return Message.assistant(text, [ToolCall(id=f"call_{step}", name="search", arguments={"q": step})])
    return Message(role="tool", content=text, tool_call_id=f"call_{step - 1}", name="search")


def run(session_id: str, steps: int) -> Iterator[Checkpoint]:
    """Checkpoints of one run, save by save, each one message longer and sharing the earlier message objects."""
    messages = [Message.system("You research."), Message.user("Find it.")]
    for step in range(1, steps + 1):
        messages = [*messages, message(step)]
        yield Checkpoint(session_id=session_id, version=step, step_index=step, messages=messages)
