"""`FileStore`: checkpoints, their history and approvals as JSON files in one folder.

Layout under `dir`:

    checkpoints/<session>.json          the latest checkpoint
    checkpoint-history/<session>.json   {"entries": [{"saved_at", "checkpoint"}, ...]}, newest first
    approvals/<id>.json                 one approval snapshot
    locks/<name>.lock                   taken with flock() around every change

Every file is replaced atomically (temporary file in the same folder, fsync,
`os.replace`, fsync of the folder), so a crash leaves the old file or the new one,
never half of one. A save is a compare-and-set under an exclusive lock on the
session's lock file, so two processes on one machine cannot both win. A history
file damaged anyway reads as no history and is rebuilt by the next save. Needs a
POSIX system (fcntl) and a local file system (flock is unreliable over NFS).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from lousho.approvals import ApprovalSnapshot, decode_snapshot, utc_now
from lousho.checkpoint import Checkpoint, HistoryEntry, check_version, decode_checkpoint
from lousho.errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError, SDKError, StoreUnavailableError

__all__ = ["FileApprovalStore", "FileCheckpointStore", "FilePruned", "FileStore"]

_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@=+-]{0,199}")


class FilePruned(NamedTuple):
    """What `prune()` removed."""

    checkpoints: int
    history: int


def _file_name(key: str) -> str:
    """A file name for an id: the id itself when it is safe, else a hash of it."""
    if _SAFE_NAME.fullmatch(key):
        return key
    return "sha256-" + hashlib.sha256(key.encode()).hexdigest()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so a reader (or a crash) sees the old file or the new one, whole."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    _fsync_dir(path.parent)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


class _Folder:
    """The store's folder: paths, locks, and OS errors turned into `StoreUnavailableError`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.root = Path(directory).expanduser()
        self.checkpoints = self.root / "checkpoints"
        self.history = self.root / "checkpoint-history"
        self.approvals = self.root / "approvals"
        self.locks = self.root / "locks"
        with self.translate():
            for folder in (self.checkpoints, self.history, self.approvals, self.locks):
                folder.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def translate(self) -> Iterator[None]:
        try:
            yield
        except OSError as error:
            raise StoreUnavailableError(
                f"the store folder {self.root} cannot be used: {error}; check that it exists and is writable"
            ) from error

    @contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """Hold an exclusive flock on `locks/<name>.lock` (released when the file is closed, even by a crash)."""
        with self.translate():
            fd = os.open(self.locks / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @staticmethod
    def names(folder: Path) -> list[str]:
        """Ids stored in `folder` (temporary files left by a crash are skipped)."""
        return sorted(p.stem for p in folder.glob("*.json") if not p.name.startswith("."))


class FileCheckpointStore:
    """Latest checkpoint per session in its own file, plus a history file per session."""

    def __init__(self, directory: str | os.PathLike[str] | _Folder, *, history_limit: int = 50) -> None:
        self._folder = directory if isinstance(directory, _Folder) else _Folder(directory)
        self.history_limit = history_limit

    def _path(self, session_id: str) -> Path:
        return self._folder.checkpoints / f"{_file_name(session_id)}.json"

    def _history_path(self, session_id: str) -> Path:
        return self._folder.history / f"{_file_name(session_id)}.json"

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        """Store `checkpoint` if it follows the stored version; else `CheckpointConflictError`, nothing written.

        A stored file that cannot be read raises `CorruptCheckpointError` and is not overwritten."""
        raw = checkpoint.model_dump_json()
        with self._folder.locked(f"cp-{_file_name(session_id)}"), self._folder.translate():
            stored = self.load(session_id)
            check_version(session_id, stored.version if stored else None, checkpoint)
            atomic_write(self._path(session_id), raw.encode())
            if self.history_limit > 0:
                entries = self._entries(session_id)
                entries.insert(0, {"saved_at": utc_now(), "checkpoint": json.loads(raw)})
                self._write_entries(session_id, entries[: self.history_limit])

    def _entries(self, session_id: str) -> list[dict[str, Any]]:
        """The history file's entries; a damaged file counts as no history (the next save rewrites it)."""
        raw = _read(self._history_path(session_id))
        try:
            data = json.loads(raw) if raw is not None else {}
        except ValueError:
            return []
        entries = data.get("entries") if isinstance(data, dict) else None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def _write_entries(self, session_id: str, entries: list[dict[str, Any]]) -> None:
        atomic_write(self._history_path(session_id), json.dumps({"entries": entries}).encode())

    def load(self, session_id: str) -> Checkpoint | None:
        with self._folder.translate():
            raw = _read(self._path(session_id))
        return None if raw is None else decode_checkpoint(session_id, raw)

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        with self._folder.locked(f"cp-{_file_name(session_id)}"), self._folder.translate():
            paths = [self._path(session_id)] + ([] if keep_history else [self._history_path(session_id)])
            for path in paths:
                with suppress(FileNotFoundError):
                    path.unlink()
            _fsync_dir(self._folder.checkpoints)

    def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry]:
        """The session's saves, newest first (at most `limit`); entries that cannot be read are skipped."""
        with self._folder.translate():
            entries = self._entries(session_id)
        result: list[HistoryEntry] = []
        for entry in entries:
            try:
                checkpoint = decode_checkpoint(session_id, entry["checkpoint"])
                saved_at = str(entry["saved_at"])
            except (KeyError, SDKError):
                continue
            result.append(
                HistoryEntry(
                    step=checkpoint.step_index, saved_at=saved_at, status=checkpoint.status, checkpoint=checkpoint
                )
            )
        return result[:limit]

    def sessions(self, status: str | None = None) -> list[str]:
        """Sessions with a latest checkpoint, sorted; only readable ones with `status` when given."""
        with self._folder.translate():
            names = self._folder.names(self._folder.checkpoints)
        if status is None:
            return names
        found = []
        for name in names:
            with suppress(SDKError):
                checkpoint = self.load(name)
                if checkpoint is not None and checkpoint.status == status:
                    found.append(name)
        return found

    def prune(self, older_than: datetime | timedelta) -> FilePruned:
        """Remove finished checkpoints last written before the cutoff, and history entries saved before it."""
        cutoff = datetime.now(UTC) - older_than if isinstance(older_than, timedelta) else older_than
        cutoff = cutoff if cutoff.tzinfo else cutoff.replace(tzinfo=UTC)
        removed = dropped = 0
        for session_id in self.sessions():
            with self._folder.locked(f"cp-{_file_name(session_id)}"), self._folder.translate():
                path = self._path(session_id)
                with suppress(SDKError, FileNotFoundError):
                    old = datetime.fromtimestamp(path.stat().st_mtime, UTC) < cutoff
                    if old and (checkpoint := self.load(session_id)) and checkpoint.status == "finished":
                        path.unlink()
                        removed += 1
        for session_id in self._folder.names(self._folder.history):
            with self._folder.locked(f"cp-{session_id}"), self._folder.translate():
                entries = self._entries(session_id)
                kept = [e for e in entries if _is_after(e.get("saved_at"), cutoff)]
                dropped += len(entries) - len(kept)
                if len(kept) != len(entries):
                    self._write_entries(session_id, kept)
        return FilePruned(checkpoints=removed, history=dropped)

    def get_raw(self, session_id: str) -> bytes | None:
        """The stored bytes of the latest checkpoint, as they are (for inspection and tests)."""
        with self._folder.translate():
            return _read(self._path(session_id))

    def put_raw(self, session_id: str, raw: str | bytes) -> None:
        """Store `raw` as the latest checkpoint without checking it (tests of old, corrupt and foreign records)."""
        with self._folder.locked(f"cp-{_file_name(session_id)}"), self._folder.translate():
            atomic_write(self._path(session_id), raw.encode() if isinstance(raw, str) else raw)


def _is_after(saved_at: Any, cutoff: datetime) -> bool:
    try:
        stamp = datetime.fromisoformat(str(saved_at))
    except ValueError:
        return False
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)) >= cutoff


class FileApprovalStore:
    """Approval snapshots, one file each; `decide` holds the approval's lock, so exactly one caller wins."""

    def __init__(self, directory: str | os.PathLike[str] | _Folder) -> None:
        self._folder = directory if isinstance(directory, _Folder) else _Folder(directory)

    def _path(self, approval_id: str) -> Path:
        return self._folder.approvals / f"{_file_name(approval_id)}.json"

    def save(self, snapshot: ApprovalSnapshot) -> None:
        with self._folder.locked(f"approval-{_file_name(snapshot.id)}"), self._folder.translate():
            atomic_write(self._path(snapshot.id), snapshot.model_dump_json().encode())

    def load(self, approval_id: str) -> ApprovalSnapshot | None:
        with self._folder.translate():
            raw = _read(self._path(approval_id))
        return None if raw is None else decode_snapshot(approval_id, raw)

    def decide(self, approval_id: str, approved: bool, note: str | None) -> ApprovalSnapshot:
        with self._folder.locked(f"approval-{_file_name(approval_id)}"):
            snapshot = self.load(approval_id)
            if snapshot is None:
                raise ApprovalNotFoundError(
                    f"no approval {approval_id!r} in {self._folder.root}; check the id and the store"
                )
            if snapshot.status != "pending":
                raise ApprovalAlreadyResolvedError(
                    f"approval {approval_id!r} was already {snapshot.status} at {snapshot.decided_at}; it is not run again"
                )
            status = "approved" if approved else "rejected"
            decided = snapshot.model_copy(update={"status": status, "note": note, "decided_at": utc_now()})
            with self._folder.translate():
                atomic_write(self._path(approval_id), decided.model_dump_json().encode())
            return decided

    def reopen(self, approval_id: str) -> None:
        """Put a decided approval back to pending; an unknown id is left alone."""
        with self._folder.locked(f"approval-{_file_name(approval_id)}"):
            snapshot = self.load(approval_id)
            if snapshot is not None:
                reopened = snapshot.model_copy(update={"status": "pending", "note": None, "decided_at": None})
                with self._folder.translate():
                    atomic_write(self._path(approval_id), reopened.model_dump_json().encode())

    def pending(self, session_id: str | None = None) -> list[ApprovalSnapshot]:
        """Approvals waiting for a decision, oldest first."""
        with self._folder.translate():
            raws = [
                (name, _read(self._folder.approvals / f"{name}.json"))
                for name in self._folder.names(self._folder.approvals)
            ]
        snapshots = [decode_snapshot(name, raw) for name, raw in raws if raw is not None]
        waiting = [s for s in snapshots if s.status == "pending" and (session_id is None or s.session_id == session_id)]
        return sorted(waiting, key=lambda s: (s.created_at, s.id))


class FileStore:
    """A store bundle in one folder: `.checkpoints` and `.approvals` (created if missing)."""

    def __init__(self, dir: str | os.PathLike[str] = "./.lousho/store", *, history_limit: int = 50) -> None:
        folder = _Folder(dir)
        self.dir = folder.root
        self.checkpoints = FileCheckpointStore(folder, history_limit=history_limit)
        self.approvals = FileApprovalStore(folder)

    def sessions(self, status: str | None = None) -> list[str]:
        return self.checkpoints.sessions(status)

    def prune(self, older_than: datetime | timedelta) -> FilePruned:
        return self.checkpoints.prune(older_than)

    def __repr__(self) -> str:
        return f"FileStore({str(self.dir)!r})"
