"""The dashboard's forms read as operations (issue #32): a fork form becomes a `ForkRequest`, as `lousho fork`'s
flags do; deciding, forking and resuming are then `lousho.operations`' own, the same as the CLI's."""

from __future__ import annotations

from dataclasses import dataclass

from lousho.errors import ConfigurationError
from lousho.operations.forking import ForkRequest, parse_tool_result, rewrite_message

__all__ = ["ForkForm", "fork_request"]


@dataclass(frozen=True)
class ForkForm:
    """The history page's fork form: a save, and optionally a call's new result (JSON) and/or a user message."""

    save: int
    tool_call_id: str = ""
    tool_result: str = ""
    append_input: str = ""
    message_index: str = ""
    """With `message_content`: the transcript index (as the session page numbers it) of a message to rewrite."""
    message_content: str = ""
    new_session_id: str = ""
    run: bool = False


def fork_request(session_id: str, form: ForkForm) -> ForkRequest:
    """The fork the form asks for (`lousho fork --from-save SAVE --tool-result CALL_ID=JSON --append-input TEXT`)."""
    call_id, raw = form.tool_call_id.strip(), form.tool_result.strip()
    if bool(call_id) != bool(raw):
        raise ConfigurationError("a patched tool result needs both the call id and the result (JSON)")
    index = form.message_index.strip()
    if index and not index.isdigit():
        raise ConfigurationError(f"the message to rewrite is a number from the transcript, not {index!r}")
    return ForkRequest(
        session_id=session_id,
        from_save=form.save,
        tool_results=[parse_tool_result(f"{call_id}={raw}")] if call_id else [],
        append_input=[form.append_input] if form.append_input.strip() else [],
        rewrite=rewrite_message(int(index), form.message_content) if index else None,
        new_session_id=form.new_session_id.strip() or None,
        run=form.run,
    )
