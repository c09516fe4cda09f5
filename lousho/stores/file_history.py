"""FileStore's history file, `checkpoint-history/<session>.json`: its format, one entry per line.

    {"entries": [
    {"saved_at": "<time>", "checkpoint": <head>},
    ...
    ]}

Newest first; a save writes its entry's line and the lines it keeps as they are, without parsing them.
A file of the older layout (the same JSON on any number of lines) is read whole.
"""

from __future__ import annotations

import json
from contextlib import suppress
from typing import Any

__all__ = ["entry_line", "history_file", "history_lines", "parse_entries"]

_OPEN, _CLOSE = b'{"entries": [\n', b"\n]}"
"""A history file is this, its entries (one JSON object per line) joined by ",\n", and this."""


def history_lines(raw: bytes | None) -> list[bytes]:
    """A history file's entries as JSON lines; a damaged file counts as no history (the next save rewrites
    it), a file of the older layout is read whole."""
    if raw is None:
        return []
    if raw.startswith(_OPEN) and raw.endswith(_CLOSE):
        body = raw[len(_OPEN) : -len(_CLOSE)]
        return [line.removesuffix(b",") for line in body.split(b"\n")] if body else []
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    return [json.dumps(e).encode() for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def history_file(lines: list[bytes]) -> bytes:
    """The file holding `lines`, newest first."""
    return _OPEN + b",\n".join(lines) + _CLOSE


def entry_line(saved_at: str, record: str) -> bytes:
    """The line of a save at `saved_at` whose head is `record`."""
    return ('{"saved_at": ' + json.dumps(saved_at) + ', "checkpoint": ' + record + "}").encode()


def parse_entries(lines: list[bytes]) -> list[dict[str, Any]]:
    """The entries of the lines that are JSON objects (the others are skipped)."""
    entries = []
    for line in lines:
        with suppress(ValueError, UnicodeDecodeError):
            entry = json.loads(line)
            if isinstance(entry, dict):
                entries.append(entry)
    return entries
