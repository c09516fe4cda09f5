"""What FileStore's parts share: the folder, file names, locks and atomic replacement."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from lousho.errors import StoreUnavailableError

__all__ = ["Folder", "atomic_write", "file_name", "fsync_dir", "read_file"]

_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@=+-]{0,199}")


def file_name(key: str) -> str:
    """A file name for an id: the id itself when it is safe, else a hash of it."""
    if _SAFE_NAME.fullmatch(key):
        return key
    return "sha256-" + hashlib.sha256(key.encode()).hexdigest()


def fsync_dir(folder: Path) -> None:
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
    fsync_dir(path.parent)


def read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


class Folder:
    """The store's folder: paths, locks, and OS errors turned into `StoreUnavailableError`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.root = Path(directory).expanduser()
        self.checkpoints = self.root / "checkpoints"
        self.history = self.root / "checkpoint-history"
        self.messages = self.root / "messages"
        self.approvals = self.root / "approvals"
        self.locks = self.root / "locks"
        with self.translate():
            for folder in (self.checkpoints, self.history, self.messages, self.approvals, self.locks):
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

    @contextmanager
    def shared(self, name: str) -> Iterator[None]:
        """Hold a shared flock on `locks/<name>.lock` while reading, if it exists (a file never
        locked has never been written under it, so there is nothing to wait for)."""
        with self.translate():
            try:
                fd = os.open(self.locks / f"{name}.lock", os.O_RDONLY)
            except FileNotFoundError:
                fd = -1
        if fd < 0:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    @staticmethod
    def names(folder: Path, suffix: str = ".json") -> list[str]:
        """Ids stored in `folder` (temporary files left by a crash are skipped)."""
        return sorted(p.name[: -len(suffix)] for p in folder.glob(f"*{suffix}") if not p.name.startswith("."))
