"""What the fleet's processes say to each other, versioned (issue #35): the protocol header every step
message carries, what a worker does with a message of a newer protocol, and what a worker publishes of
the formats it speaks.

The numbers themselves live in `lousho.formats`, with when to bump each. Here:

- every step message (`dispatch.send`, the outbox's push) carries the header `lousho_protocol` with
  `MESSAGE_PROTOCOL`; a message without it is protocol 1 (lousho 0.1.0 sent none);
- a worker runs a message of its own protocol or an older one; one of a newer protocol (sent by a worker
  of a later release during a rolling upgrade) it does not run: it waits `HAND_BACK_DELAY_S` (so a lone
  old worker does not spin on it) and rejects it with requeue, which puts the very message back on its
  queue for a worker that speaks it; it logs why and counts it (`lousho_messages_handed_back_total`);
- so does a worker that finds a session's checkpoint of a newer schema (`NewerFormatError`): the
  checkpoint is left as it is, the message handed back, the session never parked;
- each worker's entry in the registry (`lousho.worker.registry`) says which lousho it runs and the
  formats it speaks (`speaks()`), shown by `lousho workers` and the dashboard's fleet page.
"""

from __future__ import annotations

from typing import Any

from lousho._version import __version__
from lousho.formats import MESSAGE_PROTOCOL, written_formats

__all__ = [
    "HAND_BACK_DELAY_S",
    "PROTOCOL_HEADER",
    "message_headers",
    "message_protocol",
    "speaks",
    "too_new",
]

PROTOCOL_HEADER = "lousho_protocol"
"""The Celery message header that carries a step message's protocol (`lousho.formats.MESSAGE_PROTOCOL`)."""

HAND_BACK_DELAY_S = 1.0
"""How long a worker holds a message it cannot run before it hands it back: a worker of the previous
release alone on a queue would otherwise take the same message back at once, again and again."""

_OLDEST_PROTOCOL = 1
"""The oldest message protocol in use: lousho 0.1.0's, whose messages carry no header."""


def message_headers() -> dict[str, Any]:
    """The headers every step message of this release carries."""
    return {PROTOCOL_HEADER: MESSAGE_PROTOCOL}


def message_protocol(request: Any) -> int:
    """The protocol of the message a Celery task `request` was delivered (1 when it carries none, as
    0.1.0's; a header that is no whole number counts as newer: it is not ours to run)."""
    value = getattr(request, PROTOCOL_HEADER, None)
    if value is None:
        headers = getattr(request, "headers", None) or {}
        value = headers.get(PROTOCOL_HEADER) if isinstance(headers, dict) else None
    if value is None:
        return _OLDEST_PROTOCOL
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return MESSAGE_PROTOCOL + 1


def too_new(protocol: int) -> bool:
    """Whether a message of `protocol` is newer than this worker runs."""
    return protocol > MESSAGE_PROTOCOL


def speaks() -> dict[str, Any]:
    """What a worker publishes of itself in the registry: its lousho version, the message protocols it
    runs (oldest to newest) and the version of each format it writes."""
    return {
        "version": __version__,
        "message_protocols": [_OLDEST_PROTOCOL, MESSAGE_PROTOCOL],
        "formats": written_formats(),
    }
