"""The text of a record's store header, written and read without going through `json` for the common case
(issue #30: a save wrote its header with `json.dumps` twice and parsed the whole stored head to read its
header back, some 10% of SqliteStore's Python per save). The text is the same as `json.dumps` makes:
what is stored does not change (`lousho.stores.segments` describes the layout)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["HEADER", "RECORD_START", "header_text", "read_header"]

HEADER = "$store"
RECORD_START = '{"' + HEADER + '":'
"""How every record with a header begins (`behind_header` writes it first)."""
_DECODER = json.JSONDecoder()


def header_text(header_format: int, writer: str, segments: Sequence[tuple[int, int]], extra: Mapping[str, int]) -> str:
    """`json.dumps({"f": header_format, "w": writer, "s": segments, **extra}, separators=(",", ":"))`, built by
    hand when that is plainly the same text: a writer id of ASCII letters and digits (ours are hex), whole
    numbers, no store fields; anything else goes through `json.dumps`."""
    plain = not extra and writer.isascii() and writer.isalnum()
    if plain and all(type(a) is int and type(b) is int for a, b in segments):
        spans = ",".join(f"[{start},{count}]" for start, count in segments)
        return f'{{"f":{header_format},"w":"{writer}","s":[{spans}]}}'
    return json.dumps({"f": header_format, "w": writer, "s": segments, **extra}, separators=(",", ":"))


def read_header(raw: object) -> Any:
    """The JSON value of the header that begins `raw` (what `RECORD_START` opens), parsed alone, without the
    rest of the record; None when `raw` is not text that begins so, or the header is not JSON."""
    if not isinstance(raw, str) or not raw.startswith(RECORD_START):
        return None
    try:
        return _DECODER.raw_decode(raw, len(RECORD_START))[0]
    except ValueError:
        return None
