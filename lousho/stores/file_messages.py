"""FileStore's per-session messages file: `messages/<session>.jsonl`, one message JSON per line.

Lines are only appended, under the session's lock, and fsynced before the head that counts
them replaces the old one. A head records the extent in use: `n` lines, `b` bytes. Whatever
lies past the newest extent (a save that crashed between its append and its head) is counted
by no head, is never read, and is cut off by the next save.

A re-seal (issue #31, `lousho.stores.file_reseal`) writes the file again, the same lines at other
lengths, then the head and the history with their byte counts made again. It marks the file first
(`resealing_mark`) and clears the mark once all three are in place: while the mark is there, an
extent whose `b` bytes are not its `n` lines (a re-seal stopped between the files) is read as the
first `n` lines, so a crash at any point leaves the session readable; running the re-seal again
finishes it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from lousho.errors import CorruptCheckpointError
from lousho.stores.file_folder import fsync_dir
from lousho.stores.segments import Head

__all__ = ["Extent", "append_lines", "extent_of", "read_lines", "resealing_mark", "valid_extent"]

Extent = tuple[int, int]
"""(lines, bytes) of a messages file that a head counts."""


def extent_of(head: Head) -> Extent:
    return head.extra.get("n", 0), head.extra.get("b", 0)


def valid_extent(head: Head) -> bool:
    return "n" in head.extra and "b" in head.extra and head.end <= head.extra["n"]


def resealing_mark(path: Path) -> Path:
    """The file that says a re-seal rewrote the messages file `path` and may not have counted its bytes again
    in every head (`.<session>.jsonl.resealing`, beside it)."""
    return path.with_name(f".{path.name}.resealing")


def _line_end(data: bytes, lines: int) -> int | None:
    """Where the first `lines` lines of `data` end (None: it has fewer)."""
    end = 0
    for _ in range(lines):
        end = data.find(b"\n", end) + 1
        if end == 0:
            return None
    return end


def append_lines(session_id: str, path: Path, extent: Extent, texts: Sequence[str]) -> Extent:
    """Cut the file to `extent`, append `texts` as lines, fsync; the new extent.

    A file shorter than `extent` (damaged or removed by hand) raises `CorruptCheckpointError`
    and is left as it is."""
    lines, size = extent
    data = "".join(text + "\n" for text in texts).encode()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        found = os.fstat(fd).st_size
        if found != size and resealing_mark(path).exists():  # `b` may predate a re-seal: count the lines
            end = _line_end(os.pread(fd, found, 0), lines)
            size = found + 1 if end is None else end  # fewer lines than the head counts: refused below
        if found < size:
            raise CorruptCheckpointError(
                session_id, f"its messages file {path.name} is shorter than its head says; the save was refused"
            )
        if found > size:  # lines of a save that did not finish
            os.ftruncate(fd, size)
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], size + written)
        if data or found > size:
            os.fsync(fd)
    finally:
        os.close(fd)
    if found == 0 and data:  # a new file: make its name durable too
        fsync_dir(path.parent)
    return lines + len(texts), size + len(data)


def read_lines(session_id: str, path: Path, extent: Extent, *, strict: bool = True) -> list[bytes]:
    """The first `extent` lines of the file.

    `strict`: a file missing, shorter than the extent, or with another number of lines in it raises
    `CorruptCheckpointError`; otherwise the complete lines found within the extent are returned."""
    lines, size = extent
    if size == 0:
        return []
    try:
        with path.open("rb") as handle:
            data = handle.read(size)
    except FileNotFoundError:
        if strict:
            raise CorruptCheckpointError(session_id, f"its messages file {path.name} is missing") from None
        return []
    found = data.split(b"\n")[:-1]  # the part after the last newline is not a complete line
    if len(data) == size and len(found) == lines:
        return found
    if resealing_mark(path).exists():  # `b` may predate a re-seal that stopped part way: count the lines
        counted = path.read_bytes().split(b"\n")[:-1][:lines]
        if len(counted) == lines or not strict:
            return counted
    if strict:
        raise CorruptCheckpointError(session_id, f"its messages file {path.name} is shorter than its head says")
    return found
