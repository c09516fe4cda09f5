"""`FileCheckpointStore`: the latest checkpoint per session and its history, as files.

Per session (`<name>`: the session id, or a hash of it when it is not a safe file name):

    messages/<name>.jsonl           every message of the session, once, one JSON per line, appended
    checkpoints/<name>.json         the head of the latest checkpoint
    checkpoint-history/<name>.json  {"entries": [{"saved_at", "checkpoint": <head>}, ...]}, newest first,
                                    one entry per line (a save adds a line without parsing the others)

A head is the checkpoint without its messages, behind a header naming the lines it uses and the
extent of the messages file in use (`lousho.stores.segments`; FileStore adds `n` lines and
`b` bytes). A save appends only the new messages (fsync), then replaces the head and the history
file atomically, so neither the bytes written nor a history entry grow with the transcript. A
crash between the append and the head leaves lines that no head counts; they are never read
and the next save cuts them off. Files written by an older lousho (whole checkpoints) are read
as they are.

A save is a compare-and-set under an exclusive flock on the session's lock file; reads take it
shared. A history file damaged anyway reads as no history and is rebuilt by the next save.
`reseal` writes all three again under the codec's current key (issue #31, `lousho.stores.file_reseal`).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from lousho.approvals import utc_now
from lousho.checkpoint import Checkpoint, HistoryEntry, check_version, decode_checkpoint
from lousho.errors import CorruptCheckpointError, PayloadKeyError, SDKError
from lousho.store_bundle import Pruned
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.file_folder import Folder, atomic_write, file_name, fsync_dir, read_file
from lousho.stores.file_history import entry_line, history_file, history_lines, parse_entries
from lousho.stores.file_messages import append_lines, extent_of, read_lines, resealing_mark, valid_extent
from lousho.stores.file_reseal import SessionFiles, reseal_files
from lousho.stores.head_fields import HeadFields, head_fields
from lousho.stores.listing import Listing, read_each
from lousho.stores.segments import (
    Head,
    Known,
    SessionCache,
    Transcript,
    encode_records,
    extend_segments,
    plan_save,
    split_record,
)

__all__ = ["FileCheckpointStore", "FilePruned"]


FilePruned = Pruned
"""What `prune()` removed (the name FileStore used before every store shared `Pruned`, issue #16)."""


class FileCheckpointStore:
    """Latest checkpoint per session as a head file, its messages in a file of their own, plus a history file."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | Folder,
        *,
        history_limit: int = 50,
        cache_size: int = 1024,
        codec: PayloadCodec = PLAIN,
    ) -> None:
        """`codec`: seals heads' secret fields and encodes message lines (issue #17)."""
        self._folder = directory if isinstance(directory, Folder) else Folder(directory)
        self.history_limit = history_limit
        self._codec = codec
        self._cache = SessionCache(cache_size)

    def _path(self, name: str) -> Path:
        return self._folder.checkpoints / f"{name}.json"

    def _history_path(self, name: str) -> Path:
        return self._folder.history / f"{name}.json"

    def _messages_path(self, name: str) -> Path:
        return self._folder.messages / f"{name}.jsonl"

    # -- save ------------------------------------------------------------------------------

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        """Store `checkpoint` if it follows the stored version; else `CheckpointConflictError`, nothing written.

        A stored head that cannot be read raises `CorruptCheckpointError` and is not overwritten."""
        name, writer = file_name(session_id), uuid.uuid4().hex
        with self._folder.locked(f"cp-{name}"), self._folder.translate():
            self._save_locked(session_id, name, checkpoint, writer)
        self._cache.put(session_id, Known(checkpoint.version, writer, tuple(checkpoint.messages)))

    def _save_locked(self, session_id: str, name: str, checkpoint: Checkpoint, writer: str) -> None:
        head = self._check_stored(session_id, read_file(self._path(name)), checkpoint)
        entries = self._history_lines(name)
        if head is not None:  # a head's extent covers every earlier save's
            extent = extent_of(head)
        else:  # none (or an older layout's): what the history kept uses
            extent = max((extent_of(h) for h in _entry_heads(parse_entries(entries))), default=(0, 0))
        messages = self._messages_path(name)
        segments, texts = plan_save(
            self._cache,
            session_id,
            checkpoint,
            head,
            lambda h: Transcript(session_id, read_lines(session_id, messages, extent), self._codec).texts(h.segments),
            self._codec,
        )
        lines, size = append_lines(session_id, self._messages_path(name), extent, texts)
        segments = extend_segments(segments, extent[0], len(texts))
        record, entry_record = encode_records(
            checkpoint, writer, segments, codec=self._codec, session_id=session_id, n=lines, b=size
        )
        atomic_write(self._path(name), record.encode())
        if self.history_limit > 0:
            self._write_lines(name, [entry_line(utc_now(), entry_record), *entries][: self.history_limit])

    def _check_stored(self, session_id: str, raw: bytes | None, checkpoint: Checkpoint) -> Head | None:
        """The stored head's header (None: none stored, or a whole checkpoint), after the version check."""
        if raw is None:
            check_version(session_id, None, checkpoint)
            return None
        data, head = split_record(session_id, raw, self._codec)  # a wrong key raises here, before any write
        if head is not None:
            if not valid_extent(head):
                raise CorruptCheckpointError(session_id, "its store header is damaged")
            data["messages"] = []
        check_version(session_id, decode_checkpoint(session_id, data).version, checkpoint)
        return head

    # -- load ------------------------------------------------------------------------------

    def load(self, session_id: str) -> Checkpoint | None:
        """The latest checkpoint, or None for an unknown session; a damaged one raises and stays (and the
        cache forgets the session: a save then reads what is stored, issue #31)."""
        try:
            return self._load(session_id)
        except SDKError:
            self._cache.drop(session_id)
            raise

    def _load(self, session_id: str) -> Checkpoint | None:
        name = file_name(session_id)
        with self._folder.shared(f"cp-{name}"), self._folder.translate():
            raw = read_file(self._path(name))
            if raw is None:
                return None
            data, head = split_record(session_id, raw, self._codec)
            if head is None:
                return decode_checkpoint(session_id, data)
            if not valid_extent(head):
                raise CorruptCheckpointError(session_id, "its store header is damaged")
            lines = read_lines(session_id, self._messages_path(name), extent_of(head))
        data["messages"] = Transcript(session_id, lines, self._codec).take(head.segments)
        checkpoint = decode_checkpoint(session_id, data)
        self._cache.put(session_id, Known(checkpoint.version, head.writer, tuple(checkpoint.messages)))
        return checkpoint

    def _head_checkpoint(self, name: str) -> Checkpoint | None:
        """The latest checkpoint of a file name without its messages (None: none, or unreadable)."""
        with suppress(SDKError):
            return self._read_head(name)
        return None

    def _read_head(self, name: str) -> Checkpoint | None:
        """The latest checkpoint of a file name without its messages (None: none); one that cannot be
        read, or is another session's, raises `CorruptCheckpointError`."""
        raw = read_file(self._path(name))
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise CorruptCheckpointError(name, "it is not JSON") from None
        session_id = str(data.get("session_id")) if isinstance(data, dict) else name
        data, head = split_record(session_id, data)
        if head is not None:
            data["messages"] = []
        checkpoint = decode_checkpoint(session_id, data)
        if file_name(checkpoint.session_id) != name:
            raise CorruptCheckpointError(name, f"it is the checkpoint of session {checkpoint.session_id!r}")
        return checkpoint

    # -- history ---------------------------------------------------------------------------

    def _history_lines(self, name: str) -> list[bytes]:
        """The history file's entries as JSON lines (`lousho.stores.file_history`)."""
        return history_lines(read_file(self._history_path(name)))

    def _entries(self, name: str) -> list[dict[str, Any]]:
        return parse_entries(self._history_lines(name))

    def _write_lines(self, name: str, lines: list[bytes]) -> None:
        atomic_write(self._history_path(name), history_file(lines))

    def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry]:
        """The session's saves, newest first (at most `limit`), each as it was saved; entries that
        cannot be read are skipped."""
        name = file_name(session_id)
        with self._folder.shared(f"cp-{name}"), self._folder.translate():
            records = []
            for entry in self._entries(name)[:limit]:
                try:
                    records.append(
                        (
                            str(entry["saved_at"]),
                            *split_record(session_id, entry["checkpoint"], self._codec, history=True),
                        )
                    )
                except PayloadKeyError:  # the store lacks a key: an error to fix, not an entry to skip (issue #17)
                    raise
                except (KeyError, SDKError):
                    continue
            heads = [head for _, _, head in records if head is not None and valid_extent(head)]
            extent = max((extent_of(head) for head in heads), default=(0, 0))
            lines = read_lines(session_id, self._messages_path(name), extent, strict=False)
        transcript, result = Transcript(session_id, lines, self._codec), []
        for saved_at, data, head in records:
            try:
                if head is not None:
                    if not valid_extent(head) or head.end > len(lines):
                        continue
                    data["messages"] = transcript.take(head.segments)
                checkpoint = decode_checkpoint(session_id, data)
            except PayloadKeyError:
                raise
            except SDKError:
                continue
            result.append(
                HistoryEntry(
                    step=checkpoint.step_index, saved_at=saved_at, status=checkpoint.status, checkpoint=checkpoint
                )
            )
        return result

    # -- delete, sessions, prune -----------------------------------------------------------

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        """Forget the session; with `keep_history` its history and the messages it refers to stay."""
        name = file_name(session_id)
        with self._folder.locked(f"cp-{name}"), self._folder.translate():
            paths = [self._path(name)]
            if not keep_history:
                messages = self._messages_path(name)
                paths += [self._history_path(name), messages, resealing_mark(messages)]
            for path in paths:
                with suppress(FileNotFoundError):
                    path.unlink()
            fsync_dir(self._folder.checkpoints)
        self._cache.drop(session_id)

    def sessions(self, status: str | None = None) -> Listing[str]:
        """Sessions with a latest checkpoint, sorted; with `status`, those of that status, and the ones
        whose checkpoint file cannot be read named in `skipped` (issue #21)."""
        with self._folder.translate():
            names = self._folder.names(self._folder.checkpoints)
        if status is None:
            return Listing(sorted(self._session_id_of(name) for name in names))

        def matching(name: str, _: object) -> str | None:
            checkpoint = self._read_head(name)
            return checkpoint.session_id if checkpoint is not None and checkpoint.status == status else None

        listed = read_each(((name, None) for name in names), matching, what="session")
        return Listing(sorted(listed), skipped={self._session_id_of(n): why for n, why in listed.skipped.items()})

    def _session_id_of(self, name: str) -> str:
        """The session a head file is for: its name, or for an id that is no safe file name (named by a hash,
        `file_name`) the id its head holds, read without opening its sealed part."""
        if not name.startswith("sha256-"):  # `file_name`'s hashed names (an id of that form holds itself too)
            return name
        with suppress(OSError, ValueError, AttributeError):
            data = json.loads(read_file(self._path(name)) or b"")
            if isinstance(data.get("session_id"), str):
                return str(data["session_id"])
        return name  # an unreadable head: listed by its file's name, as before

    def heads(self, session_ids: Sequence[str]) -> Listing[HeadFields]:
        """The plain head fields of each named session that has a checkpoint, in the order given, never opening a
        payload (issue #32: what listings read); a head that cannot be read is named in `skipped`."""
        found: list[tuple[str, tuple[bytes, float]]] = []
        with self._folder.translate():
            for session_id in session_ids:
                path = self._path(file_name(session_id))
                raw = read_file(path)
                with suppress(FileNotFoundError):
                    if raw is not None:  # the head file is replaced whole by each save: its time is the save's
                        found.append((session_id, (raw, path.stat().st_mtime)))

        def read(session_id: str, stored: tuple[bytes, float]) -> HeadFields:
            return head_fields(session_id, stored[0], saved_at=datetime.fromtimestamp(stored[1], UTC).isoformat())

        return read_each(found, read, what="session")

    def prune(self, older_than: datetime | timedelta) -> FilePruned:
        """Remove finished checkpoints last written before the cutoff, history entries saved before it,
        and the messages of sessions left with neither."""
        cutoff = datetime.now(UTC) - older_than if isinstance(older_than, timedelta) else older_than
        cutoff = cutoff if cutoff.tzinfo else cutoff.replace(tzinfo=UTC)
        folder, removed, dropped = self._folder, 0, 0
        with folder.translate():
            names = set(folder.names(folder.checkpoints)) | set(folder.names(folder.history))
            names |= set(folder.names(folder.messages, ".jsonl"))
        for name in sorted(names):
            with folder.locked(f"cp-{name}"), folder.translate():
                removed += self._prune_head(name, cutoff)
                dropped += self._prune_history(name, cutoff)
        return FilePruned(checkpoints=removed, history=dropped)

    def _prune_head(self, name: str, cutoff: datetime) -> int:
        path = self._path(name)
        with suppress(FileNotFoundError):
            if datetime.fromtimestamp(path.stat().st_mtime, UTC) < cutoff:
                checkpoint = self._head_checkpoint(name)
                if checkpoint is not None and checkpoint.status == "finished":
                    path.unlink()
                    self._cache.drop(checkpoint.session_id)
                    return 1
        return 0

    def _prune_history(self, name: str, cutoff: datetime) -> int:
        """Drop old entries; remove the messages file when neither a head nor an entry is left."""
        entries = self._entries(name)
        kept = [e for e in entries if _is_after(e.get("saved_at"), cutoff)]
        if kept and len(kept) != len(entries):
            self._write_lines(name, [json.dumps(e).encode() for e in kept])
        elif not kept:
            with suppress(FileNotFoundError):
                self._history_path(name).unlink()
        if not kept and not self._path(name).exists():
            for path in (self._messages_path(name), resealing_mark(self._messages_path(name))):
                with suppress(FileNotFoundError):
                    path.unlink()
        return len(entries) - len(kept)

    # -- re-seal ---------------------------------------------------------------------------

    def reseal(self, session_id: str) -> int:
        """Write every stored value of the session again, sealed under the codec's first key to its place
        (issue #31, `lousho reseal`); how many values. A value the codec cannot read raises and nothing is
        written; a crash part way leaves the session readable (`lousho.stores.file_reseal`)."""
        name = file_name(session_id)
        try:
            with self._folder.locked(f"cp-{name}"), self._folder.translate():
                files = SessionFiles(self._path(name), self._history_path(name), self._messages_path(name))
                return reseal_files(session_id, self._codec, files)
        finally:
            self._cache.drop(session_id)

    # -- raw records (tests) ---------------------------------------------------------------

    def get_raw(self, session_id: str) -> bytes | None:
        """The stored bytes of the latest checkpoint (its head), as they are (for inspection and tests)."""
        with self._folder.translate():
            return read_file(self._path(file_name(session_id)))

    def put_raw(self, session_id: str, raw: str | bytes) -> None:
        """Store `raw` as the latest checkpoint without checking it (tests of old, corrupt and foreign records)."""
        name = file_name(session_id)
        with self._folder.locked(f"cp-{name}"), self._folder.translate():
            atomic_write(self._path(name), raw.encode() if isinstance(raw, str) else raw)
        self._cache.drop(session_id)


def _entry_heads(entries: list[dict[str, Any]]) -> list[Head]:
    """The headers of history entries that have one (the extent of the messages file they use)."""
    heads = []
    for entry in entries:
        with suppress(SDKError):
            head = split_record("", entry.get("checkpoint") or {})[1]
            if head is not None and valid_extent(head):
                heads.append(head)
    return heads


def _is_after(saved_at: Any, cutoff: datetime) -> bool:
    try:
        stamp = datetime.fromisoformat(str(saved_at))
    except ValueError:
        return False
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)) >= cutoff
