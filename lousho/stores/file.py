"""`FileStore`: checkpoints, their history and approvals as files in one folder.

Layout under `dir`:

    messages/<session>.jsonl            the session's messages, once each, one JSON per line (appended)
    checkpoints/<session>.json          the latest checkpoint's head (without its messages)
    checkpoint-history/<session>.json   {"entries": [{"saved_at", "checkpoint": <head>}, ...]}, newest first
    approvals/<id>.json                 one approval snapshot
    locks/<name>.lock                   taken with flock() around every change
    messages/.<session>.jsonl.resealing there while a re-seal rewrites the session (lousho.stores.file_reseal)

Heads and history files are replaced atomically (temporary file in the same folder, fsync,
`os.replace`, fsync of the folder), so a crash leaves the old file or the new one, never half
of one; messages are appended and fsynced before the head that counts them, and lines no head
counts are ignored. A save is a compare-and-set under an exclusive lock on the session's lock
file, so two processes on one machine cannot both win. Needs a POSIX system (fcntl) and a local
file system (flock is unreliable over NFS).

The parts: `lousho.stores.file_checkpoints` (`FileCheckpointStore`, the layout of a session),
`lousho.stores.file_messages` (the messages file), `lousho.stores.file_history` (the history
file), `lousho.stores.file_reseal` (`lousho reseal`), `lousho.stores.file_approvals`
(`FileApprovalStore`) and `lousho.stores.file_folder` (locks, atomic writes); their public
names are importable from here too.
"""

from __future__ import annotations

import os

from lousho.store_bundle import SessionsOfCheckpoints
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.file_approvals import FileApprovalStore
from lousho.stores.file_checkpoints import FileCheckpointStore, FilePruned
from lousho.stores.file_folder import Folder, atomic_write

__all__ = ["FileApprovalStore", "FileCheckpointStore", "FilePruned", "FileStore", "atomic_write", "open_url"]


class FileStore(SessionsOfCheckpoints):
    """A store bundle (`lousho.StoreBundle`) in one folder (created if missing): `.checkpoints`, `.approvals`,
    `sessions()`, `prune()`, `delete()`. `codec` compresses and encrypts messages, heads' secret fields and
    approvals (issue #17, off by default)."""

    checkpoints: FileCheckpointStore
    approvals: FileApprovalStore

    def __init__(
        self, dir: str | os.PathLike[str] = "./.lousho/store", *, history_limit: int = 50, codec: PayloadCodec = PLAIN
    ) -> None:
        folder = Folder(dir)
        self.dir = folder.root
        self.codec = codec = codec.for_store("file")  # issue #31: a folder may be moved, so not its path
        self.checkpoints = FileCheckpointStore(folder, history_limit=history_limit, codec=codec)
        self.approvals = FileApprovalStore(folder, codec=codec)

    def __repr__(self) -> str:
        return f"FileStore({str(self.dir)!r})"


def open_url(url: str, *, prefix: str = "lousho:", codec: PayloadCodec = PLAIN) -> FileStore:
    """`file:///abs/dir` or `file://./relative/dir`, the store registry's opener."""
    from lousho.stores.registry import local_path

    return FileStore(local_path(url, "file"), codec=codec)
