"""FileStore's transcript layout: a save writes the same bytes at step 500 as at step 10, history
entries are small heads, the older layout still loads, and a crash between writes leaves the old
state or the new one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import lousho
import lousho.stores.file_checkpoints as file_checkpoints
from lousho.checkpoint import Checkpoint
from lousho.errors import CorruptCheckpointError
from lousho.messages import Message
from lousho.stores.file import FileStore
from lousho.stores.file_folder import atomic_write
from lousho.stores.file_messages import append_lines
from lousho.testing.store_contract import sample_checkpoint
from tests.stores.transcripts import message, run

REPO = Path(lousho.__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")


class Written:
    """Bytes each save writes, per file kind (messages appended, head, history file)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes: dict[str, int] = {}

        def counted_write(path: Path, data: bytes) -> None:
            self.bytes[path.parent.name] = self.bytes.get(path.parent.name, 0) + len(data)
            atomic_write(path, data)

        def counted_append(session_id: str, path: Path, extent: Any, texts: list[str]) -> Any:
            self.bytes["messages"] = self.bytes.get("messages", 0) + sum(len(t.encode()) + 1 for t in texts)
            return append_lines(session_id, path, extent, texts)

        monkeypatch.setattr(file_checkpoints, "atomic_write", counted_write)
        monkeypatch.setattr(file_checkpoints, "append_lines", counted_append)


def _files(store: FileStore, session_id: str) -> tuple[Path, Path, Path]:
    return (
        store.dir / "checkpoints" / f"{session_id}.json",
        store.dir / "checkpoint-history" / f"{session_id}.json",
        store.dir / "messages" / f"{session_id}.jsonl",
    )


def test_save_writes_only_new_messages_and_small_heads(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    written = Written(monkeypatch)
    seen: dict[int, dict[str, int]] = {}
    saved = []
    for checkpoint in run("long", 500):
        written.bytes.clear()
        store.checkpoints.save("long", checkpoint)
        saved.append(checkpoint)
        new = checkpoint.messages if checkpoint.version == 1 else checkpoint.messages[-1:]
        assert written.bytes["messages"] == sum(len(m.model_dump_json().encode()) + 1 for m in new)
        if checkpoint.version in (10, 60, 500):
            seen[checkpoint.version] = dict(written.bytes)
    _, history, messages = _files(store, "long")
    assert abs(seen[500]["checkpoints"] - seen[10]["checkpoints"]) <= 20 and seen[500]["checkpoints"] < 1000
    ring = seen[60]["checkpoint-history"]  # the ring is full (50 heads) at both; a few more digits at 500
    assert abs(seen[500]["checkpoint-history"] - ring) <= 0.02 * ring
    entries = json.loads(history.read_bytes())["entries"]
    assert len(entries) == 50 and max(len(json.dumps(e)) for e in entries) < 1000
    assert messages.stat().st_size == sum(len(m.model_dump_json()) + 1 for m in saved[-1].messages)
    assert [e.checkpoint for e in store.checkpoints.history("long")] == saved[::-1][:50]
    assert FileStore(store.dir).checkpoints.load("long") == saved[-1]  # another process: no cache


def test_a_store_that_did_not_write_the_head_appends_only_what_differs(store: FileStore) -> None:
    other = FileStore(store.dir)
    saved = list(run("shared", 6))
    for checkpoint in saved:
        (store if checkpoint.version % 2 else other).checkpoints.save("shared", checkpoint)
    assert len(_files(store, "shared")[2].read_bytes().splitlines()) == 8
    assert [e.checkpoint for e in other.checkpoints.history("shared")] == saved[::-1]


def _crash_at_head(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(path: Path, data: bytes) -> None:
        if path.parent.name == "checkpoints":
            raise KeyboardInterrupt("the process dies after appending the messages, before the head")
        atomic_write(path, data)

    monkeypatch.setattr(file_checkpoints, "atomic_write", crash)


def test_crash_between_the_append_and_the_head_leaves_the_old_state(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = list(run("crash", 4))
    for checkpoint in saved[:3]:
        store.checkpoints.save("crash", checkpoint)
    messages = _files(store, "crash")[2]
    size = messages.stat().st_size
    with monkeypatch.context() as patch:
        _crash_at_head(patch)
        with pytest.raises(KeyboardInterrupt):
            store.checkpoints.save("crash", saved[3])
    assert messages.stat().st_size > size  # lines no head counts
    fresh = FileStore(store.dir)
    assert fresh.checkpoints.load("crash") == saved[2]
    assert [e.checkpoint for e in fresh.checkpoints.history("crash")] == saved[2::-1]
    fresh.checkpoints.save("crash", saved[3])
    assert messages.stat().st_size == size + len(saved[3].messages[-1].model_dump_json()) + 1  # cut, then appended
    assert FileStore(store.dir).checkpoints.load("crash") == saved[3]


@pytest.mark.parametrize("tail", [b'{"role": "assis', b'{"role": "user", "content": "x"}\n', b"\x00\x00\xff\n\n"])
def test_garbage_after_the_last_counted_line_is_ignored_then_cut(store: FileStore, tail: bytes) -> None:
    saved = list(run("tail", 3))
    for checkpoint in saved[:2]:
        store.checkpoints.save("tail", checkpoint)
    _, _, messages = _files(store, "tail")
    size = messages.stat().st_size
    with messages.open("ab") as handle:
        handle.write(tail)
    assert FileStore(store.dir).checkpoints.load("tail") == saved[1]
    assert [e.checkpoint for e in store.checkpoints.history("tail")] == saved[1::-1]
    store.checkpoints.save("tail", saved[2])
    assert tail not in messages.read_bytes() and messages.stat().st_size > size
    assert FileStore(store.dir).checkpoints.load("tail") == saved[2]


def test_messages_file_shorter_than_its_head_raises_and_nothing_is_changed(store: FileStore) -> None:
    saved = list(run("short", 3))
    for checkpoint in saved[:2]:
        store.checkpoints.save("short", checkpoint)
    head, history, messages = _files(store, "short")
    messages.write_bytes(messages.read_bytes()[:-10])
    before = [path.read_bytes() for path in (head, history, messages)]
    with pytest.raises(CorruptCheckpointError, match="shorter than its head says"):
        FileStore(store.dir).checkpoints.load("short")
    with pytest.raises(CorruptCheckpointError):
        FileStore(store.dir).checkpoints.save("short", saved[2])
    assert [path.read_bytes() for path in (head, history, messages)] == before
    assert [e.step for e in store.checkpoints.history("short")] == [1]  # the entry naming the damaged line is skipped
    messages.unlink()
    with pytest.raises(CorruptCheckpointError, match="missing"):
        store.checkpoints.load("short")


KILLER = textwrap.dedent(
    """
    import os, sys
    import lousho.stores.file_checkpoints as file_checkpoints
    from lousho.stores.file import FileStore
    from tests.stores.transcripts import run

    store, saved = FileStore(sys.argv[1]), list(run("killed", 3))
    for checkpoint in saved[:2]:
        store.checkpoints.save("killed", checkpoint)
    real = file_checkpoints.atomic_write

    def dying(path, data):
        if path.parent.name == sys.argv[2]:
            os._exit(3)
        real(path, data)

    file_checkpoints.atomic_write = dying
    store.checkpoints.save("killed", saved[2])
    """
)


@pytest.mark.parametrize(("dies_at", "survives"), [("checkpoints", 2), ("checkpoint-history", 3)])
def test_a_process_killed_in_a_save_leaves_the_old_checkpoint_or_the_new(
    tmp_path: Path, dies_at: str, survives: int
) -> None:
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, str(script), str(tmp_path / "store"), dies_at]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 3, done.stderr
    store = FileStore(tmp_path / "store")
    saved = list(run("killed", 3))
    assert store.checkpoints.load("killed") == saved[survives - 1]
    assert [e.checkpoint for e in store.checkpoints.history("killed")] == saved[:2][::-1]
    if survives == 2:
        store.checkpoints.save("killed", saved[2])
    assert store.checkpoints.load("killed") == saved[2]


def test_delete_keep_history_then_prune_removes_the_messages_file(store: FileStore) -> None:
    saved = list(run("again", 3))
    for checkpoint in saved:
        store.checkpoints.save("again", checkpoint)
    store.checkpoints.delete("again", keep_history=True)
    restarted = Checkpoint(session_id="again", version=1, messages=[Message.user("new start")])
    store.checkpoints.save("again", restarted)
    assert [e.checkpoint for e in store.checkpoints.history("again")] == [restarted, *saved[::-1]]
    store.checkpoints.delete("again", keep_history=True)
    _, _, messages = _files(store, "again")
    assert messages.exists()

    assert store.prune(timedelta(seconds=-60)) == (0, 4)
    assert not messages.exists() and store.checkpoints.history("again") == []
    store.checkpoints.save("plain", next(run("plain", 1)))
    store.checkpoints.delete("plain")
    assert not _files(store, "plain")[2].exists()


def test_files_of_the_whole_json_layout_load_and_continue(store: FileStore) -> None:
    saved = [sample_checkpoint("s-old", version=v, step=v - 1, status="in-progress", approval_id=None) for v in (1, 2)]
    head, history, messages = _files(store, "s-old")
    head.write_text(saved[-1].model_dump_json())
    entries = [{"saved_at": f"2024-01-01T00:00:0{c.version}+00:00", "checkpoint": c.model_dump()} for c in saved]
    history.write_text(json.dumps({"entries": entries[::-1]}, default=str))
    assert store.checkpoints.load("s-old") == saved[-1]
    assert [e.checkpoint for e in store.checkpoints.history("s-old")] == saved[::-1]
    following = saved[-1].model_copy(
        update={"version": 3, "step_index": 2, "messages": [*saved[-1].messages, message(1)]}
    )
    store.checkpoints.save("s-old", following)
    assert FileStore(store.dir).checkpoints.load("s-old") == following
    assert [e.checkpoint for e in store.checkpoints.history("s-old")] == [following, *saved[::-1]]
    assert len(messages.read_bytes().splitlines()) == len(following.messages)
    assert json.loads(head.read_bytes())["messages"] is None  # an older lousho refuses it, never reads it empty
