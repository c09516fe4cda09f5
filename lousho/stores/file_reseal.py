"""FileStore's re-seal (issue #31, `lousho reseal`): every value of a session written again under the codec's
first key, each bound to its place (`lousho.stores.reseal.reseal_records`, as SqlStore and the mapping store).

The messages file is written again whole, the same lines in the same order, each named one re-sealed (so at
another length); the head and each history entry keep their writer id, segments, line count `n` and save time,
and get the byte count `b` of their first `n` lines in the new file. Lines past the largest extent (a save that
crashed) are left out: no head counts them and the next save would cut them off. Lines no record names are
kept as they are, as the other stores keep such rows. Everything is read and the three new files made before
anything is written: a value that does not open raises, and nothing changes.

Then, each file replaced whole (temporary file, fsync, rename, fsync of its folder), in this order:

1. the mark `messages/.<session>.jsonl.resealing` (`lousho.stores.file_messages.resealing_mark`);
2. the messages file;
3. the head;
4. the history file;
5. the mark removed.

Three files cannot be replaced at once: after a crash between 2 and 4, the head or the history entries still
count the old file's bytes. Under the mark they are read by their line count, which a re-seal never changes,
and a save appends after the counted lines; every value, re-sealed or not, opens with the codec that ran the
re-seal. So the session stays readable at every point, and the re-seal run again finishes it and clears the
mark. The mark goes first so that the new file is never in place without it.
"""

from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

from lousho.errors import CorruptCheckpointError
from lousho.stores.codec import PayloadCodec
from lousho.stores.file_folder import atomic_write, file_name, fsync_dir, read_file
from lousho.stores.file_history import entry_line, history_file, history_lines
from lousho.stores.file_messages import Extent, extent_of, read_lines, resealing_mark, valid_extent
from lousho.stores.reseal import reseal_records
from lousho.stores.segments import split_record

__all__ = ["SessionFiles", "reseal_files"]


@dataclass(frozen=True)
class SessionFiles:
    """A session's files (`lousho.stores.file_checkpoints`)."""

    head: Path
    history: Path
    messages: Path


@dataclass(frozen=True)
class _Rewrite:
    """The new content of each file (None: not written) and how many values were re-sealed."""

    messages: bytes | None
    head: bytes | None
    history: bytes | None
    count: int


def reseal_files(session_id: str, codec: PayloadCodec, files: SessionFiles) -> int:
    """Re-seal the session's files (the caller holds its exclusive lock); how many values were written again."""
    rewrite = _rewrite(session_id, codec, files)
    mark = resealing_mark(files.messages)
    if rewrite.messages is not None:
        atomic_write(mark, b"")
        atomic_write(files.messages, rewrite.messages)
    if rewrite.head is not None:
        atomic_write(files.head, rewrite.head)
    if rewrite.history is not None:
        atomic_write(files.history, rewrite.history)
    with suppress(FileNotFoundError):  # also a mark left by a re-seal that stopped: every count is right again
        mark.unlink()
        fsync_dir(mark.parent)
    return rewrite.count


def _rewrite(session_id: str, codec: PayloadCodec, files: SessionFiles) -> _Rewrite:
    head = read_file(files.head)
    entries = [_entry(session_id, line) for line in history_lines(read_file(files.history))]
    records: list[tuple[Any, bool]] = [(head, False)] if head is not None else []
    records += [(entry["checkpoint"], True) for entry in entries]
    if not records:
        return _Rewrite(None, None, None, 0)
    session_id = _stored_id(session_id, records[0][0])
    old = read_lines(session_id, files.messages, max(_extent(session_id, raw) for raw, _ in records))
    resealed = reseal_records(session_id, codec, records, dict(enumerate(old)))
    lines = [_as_bytes(resealed.messages.get(position, line)) for position, line in enumerate(old)]
    ends = list(accumulate((len(line) + 1 for line in lines), initial=0))
    new = resealed.with_extra(lambda header: {**header.extra, "b": ends[header.extra["n"]]})
    new_head = new.pop(0).encode() if head is not None else None
    saves = [entry_line(entry["saved_at"], record) for entry, record in zip(entries, new, strict=True)]
    return _Rewrite(
        messages=b"".join(line + b"\n" for line in lines) if lines else None,
        head=new_head,
        history=history_file(saves) if saves else None,
        count=len(resealed.records) + len(resealed.messages),
    )


def _entry(session_id: str, line: bytes) -> dict[str, Any]:
    """A history entry to re-seal; a damaged one raises (the history read skips it, a re-seal cannot)."""
    try:
        entry = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        entry = None
    if isinstance(entry, dict) and isinstance(entry.get("saved_at"), str) and isinstance(entry.get("checkpoint"), dict):
        return entry
    raise CorruptCheckpointError(session_id, "an entry of its history file is damaged; nothing was re-sealed")


def _stored_id(session_id: str, raw: Any) -> str:
    """The session id the first record names, when `session_id` is only its file's name: an id that is not a
    safe file name is stored under a hash of it, which is what FileStore lists. Values are bound to the id."""
    with suppress(ValueError, UnicodeDecodeError):
        data = json.loads(raw) if isinstance(raw, bytes) else raw
        stored = data.get("session_id") if isinstance(data, dict) else None
        if isinstance(stored, str) and file_name(stored) == file_name(session_id):
            return stored
    return session_id


def _extent(session_id: str, raw: Any) -> Extent:
    """The lines and bytes a record counts ((0, 0) for one of the older whole-checkpoint layout, which
    `reseal_records` refuses); a damaged header raises."""
    head = split_record(session_id, raw)[1]
    if head is None:
        return 0, 0
    if not valid_extent(head):
        raise CorruptCheckpointError(session_id, "its store header is damaged")
    return extent_of(head)


def _as_bytes(line: str | bytes) -> bytes:
    return line.encode() if isinstance(line, str) else line
