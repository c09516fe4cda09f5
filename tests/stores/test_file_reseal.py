"""FileStore's re-seal stopped at each of its writes (issue #31): its three files cannot be replaced at once, so
a crash can leave the new messages file, its lines at new lengths, under a head or history entries that count
the old bytes. The session stays readable and writable at every point, and the re-seal run again finishes it."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

import lousho.stores.file_reseal as file_reseal
from lousho.checkpoint import Checkpoint
from lousho.errors import CorruptCheckpointError
from lousho.messages import Message
from lousho.stores.codec import PayloadCodec
from lousho.stores.file import FileStore
from lousho.stores.file_folder import atomic_write
from tests.stores.codecs import KEY_1

MIGRATING = PayloadCodec(keys={"k1": KEY_1}, read_unsealed=True)
STRICT = PayloadCodec(keys={"k1": KEY_1})


class Crash(BaseException):
    """The process dies here: nothing after it runs."""


def crash_at(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """The re-seal's file writes, in order: the mark, the messages file, the head, the history file; `point`
    names the write the process dies before ("the mark removed": after the last one)."""

    def write(path: Path, data: bytes) -> None:
        kind = "resealing" if path.name.endswith(".resealing") else path.parent.name
        if kind == point:
            raise Crash(point)
        atomic_write(path, data)
        if (kind, point) == ("checkpoint-history", "the mark removed"):
            raise Crash(point)

    monkeypatch.setattr(file_reseal, "atomic_write", write)


def saves(session: str) -> list[Checkpoint]:
    first = Checkpoint(session_id=session, version=1, messages=[Message.user("card 4242-4242")])
    second = first.model_copy(
        update={"version": 2, "step_index": 1, "messages": [*first.messages, Message.assistant("paid " * 80)]}
    )
    return [first, second]


def saved_plain(folder: Path, session: str = "s1") -> list[Checkpoint]:
    """`saves(session)` saved without a codec (re-sealed, their lines grow longer); the checkpoints."""
    saved = saves(session)
    for checkpoint in saved:
        FileStore(folder).checkpoints.save(session, checkpoint)
    return saved


def head_bytes(folder: Path) -> int:
    return int(json.loads((folder / "checkpoints" / "s1.json").read_bytes())["$store"]["b"])


MARK = Path("messages") / ".s1.jsonl.resealing"


@pytest.mark.parametrize("point", ["resealing", "messages", "checkpoints", "checkpoint-history", "the mark removed"])
def test_a_reseal_stopped_at_any_write_leaves_the_session_readable_and_a_second_run_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    folder = tmp_path / "f"
    saved = saved_plain(folder)
    with monkeypatch.context() as patch:
        crash_at(patch, point)
        with pytest.raises(Crash):
            FileStore(folder, codec=MIGRATING).checkpoints.reseal("s1")
    if point == "checkpoints":  # the new lines are in place, the head still counts the old ones' bytes
        assert head_bytes(folder) != (folder / "messages" / "s1.jsonl").stat().st_size
        assert (folder / MARK).exists()

    after = FileStore(folder, codec=MIGRATING)  # another process, with the codec that ran the re-seal
    assert after.checkpoints.load("s1") == saved[-1]
    assert [e.checkpoint for e in after.checkpoints.history("s1")] == saved[::-1]
    following = saved[-1].model_copy(update={"version": 3, "messages": [*saved[-1].messages, Message.user("more")]})
    after.checkpoints.save("s1", following)  # appended after the counted lines, at their new length
    assert FileStore(folder, codec=MIGRATING).checkpoints.load("s1") == following

    assert FileStore(folder, codec=MIGRATING).checkpoints.reseal("s1") == 3 + 1 + 3
    assert not (folder / MARK).exists()
    strict = FileStore(folder, codec=STRICT)
    assert strict.checkpoints.load("s1") == following
    assert [e.checkpoint for e in strict.checkpoints.history("s1")] == [following, *saved[::-1]]


def test_without_the_mark_a_head_counting_other_bytes_still_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a re-seal's mark lets a head's byte count differ from its lines: without it, a messages file whose
    lines do not end where the head says is damaged, as before."""
    folder = tmp_path / "f"
    for checkpoint in saves("s1"):
        FileStore(folder).checkpoints.save("s1", checkpoint)
    with monkeypatch.context() as patch:
        crash_at(patch, "checkpoints")
        with pytest.raises(Crash):
            FileStore(folder, codec=MIGRATING).checkpoints.reseal("s1")
    (folder / MARK).unlink()
    with pytest.raises(CorruptCheckpointError, match="shorter than its head says"):
        FileStore(folder, codec=MIGRATING).checkpoints.load("s1")


@pytest.mark.parametrize("keep_history", [False, True])
def test_deleting_or_pruning_a_session_a_reseal_stopped_in_removes_its_mark_with_its_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_history: bool
) -> None:
    folder = tmp_path / "f"
    saved = saved_plain(folder)
    with monkeypatch.context() as patch:
        crash_at(patch, "checkpoints")
        with pytest.raises(Crash):
            FileStore(folder, codec=MIGRATING).checkpoints.reseal("s1")
    store = FileStore(folder, codec=MIGRATING)
    store.checkpoints.delete("s1", keep_history=keep_history)
    assert (folder / MARK).exists() == keep_history  # the history kept still counts the old bytes
    if keep_history:
        assert [e.checkpoint for e in store.checkpoints.history("s1")] == saved[::-1]
        assert store.prune(timedelta(seconds=-60)).history == 2  # the history gone, the messages and mark go too
        assert not (folder / MARK).exists() and not (folder / "messages" / "s1.jsonl").exists()
