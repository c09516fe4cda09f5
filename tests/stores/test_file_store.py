"""FileStore beyond the contract: atomic replacement, damaged files, two processes on one folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

import lousho
from lousho.errors import CheckpointConflictError, CorruptCheckpointError
from lousho.stores.file import FileStore
from lousho.testing.store_contract import sample_checkpoint, sample_snapshot

REPO = Path(lousho.__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store", history_limit=5)


def test_atomic_replace_leaves_no_temporary_files(store: FileStore) -> None:
    for version in range(1, 21):
        store.checkpoints.save("s-1", sample_checkpoint("s-1", version=version, step=version))
    store.approvals.save(sample_snapshot("appr_1"))
    files = sorted(str(p.relative_to(store.dir)) for p in store.dir.rglob("*") if p.is_file())
    assert files == [
        "approvals/appr_1.json",
        "checkpoint-history/s-1.json",
        "checkpoints/s-1.json",
        "locks/approval-appr_1.lock",
        "locks/cp-s-1.lock",
        "messages/s-1.jsonl",
    ]
    assert store.checkpoints.load("s-1").version == 20  # type: ignore[union-attr]
    assert [e.step for e in store.checkpoints.history("s-1")] == [20, 19, 18, 17, 16]


@pytest.mark.parametrize("damage", [b"", b'{"entries": [{"saved_at": "x", "checkp', b"\x00\xff", b'{"entries": 3}'])
def test_damaged_history_reads_as_none_and_the_next_save_rebuilds_it(store: FileStore, damage: bytes) -> None:
    store.checkpoints.save("s-h", sample_checkpoint("s-h", version=1, step=0))
    history_file = store.dir / "checkpoint-history" / "s-h.json"
    history_file.write_bytes(damage)
    assert store.checkpoints.history("s-h") == []
    store.checkpoints.save("s-h", sample_checkpoint("s-h", version=2, step=1))
    assert [e.step for e in store.checkpoints.history("s-h")] == [1]
    assert len(json.loads(history_file.read_text())["entries"]) == 1


def test_damaged_checkpoint_raises_and_is_left_unchanged(store: FileStore) -> None:
    store.checkpoints.save("s-c", sample_checkpoint("s-c", version=1))
    path = store.dir / "checkpoints" / "s-c.json"
    damaged = path.read_bytes()[:100]  # what a torn write would leave
    path.write_bytes(damaged)
    with pytest.raises(CorruptCheckpointError, match="'s-c'"):
        store.checkpoints.load("s-c")
    with pytest.raises(CorruptCheckpointError):  # a save does not overwrite what it cannot read
        store.checkpoints.save("s-c", sample_checkpoint("s-c", version=2))
    assert path.read_bytes() == damaged
    store.checkpoints.delete("s-c")  # the way out the error message names
    store.checkpoints.save("s-c", sample_checkpoint("s-c", version=1))


def test_prune_removes_old_finished_checkpoints_and_old_history(store: FileStore) -> None:
    store.checkpoints.save("s-old", sample_checkpoint("s-old", version=1, status="finished"))
    store.checkpoints.save("s-run", sample_checkpoint("s-run", version=1, status="in-progress"))
    assert store.prune(older_than=timedelta(seconds=-60)) == (1, 2)  # a cutoff in the future: everything is older
    assert store.sessions() == ["s-run"]
    assert store.checkpoints.history("s-run") == []
    assert store.sessions(status="in-progress") == ["s-run"]


WRITER = textwrap.dedent(
    """
    import sys
    from lousho.errors import CheckpointConflictError
    from lousho.stores.file import FileStore
    from lousho.testing.store_contract import sample_checkpoint, sample_snapshot

    store, name = FileStore(sys.argv[1]), sys.argv[2]
    wins = 0
    for version in range(2, 202):
        try:
            store.checkpoints.save("s-shared", sample_checkpoint("s-shared", version=version, business_state=name))
            wins += 1
        except CheckpointConflictError:
            pass
    print(wins)
    """
)


def test_two_processes_never_both_win_a_version(tmp_path: Path) -> None:
    """Each process tries versions 2..201 in turn; with a working lock every version is won exactly once."""
    store = FileStore(tmp_path / "shared", history_limit=0)
    store.checkpoints.save("s-shared", sample_checkpoint("s-shared", version=1))
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(store.dir), name], stdout=subprocess.PIPE, env=env)
        for name in ("a", "b")
    ]
    wins = [int(proc.communicate(timeout=100)[0]) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert sum(wins) == 200 and store.checkpoints.load("s-shared").version == 201  # type: ignore[union-attr]
    with pytest.raises(CheckpointConflictError):
        store.checkpoints.save("s-shared", sample_checkpoint("s-shared", version=201))


def test_sessions_lists_an_id_that_is_no_safe_file_name_by_the_id_not_its_files_hash(store: FileStore) -> None:
    """A FileStore takes ids other stores refuse ('a/b c'), naming their files by a hash: the listing, by status
    too, still says the id (`lousho reseal --all` and `lousho sessions` read it)."""
    for session_id in ("plain", "a/b c"):
        store.checkpoints.save(session_id, sample_checkpoint(session_id, status="in-progress", approval_id=None))
    assert list(store.checkpoints.sessions()) == ["a/b c", "plain"]
    assert list(store.checkpoints.sessions(status="in-progress")) == ["a/b c", "plain"]
    assert store.checkpoints.load("a/b c") is not None
