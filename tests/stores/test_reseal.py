"""Migrating to sealed values (issue #31): data a keyed store did not seal (stored before the keys, or by lousho 0.1
without the place) is refused, read only under `read_unsealed=True`, and `reseal` writes it again under the
current key, each value bound to its place, so the setting can be turned off and an old key retired."""

from __future__ import annotations

import base64
import json
import os
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from lousho.approvals import ApprovalSnapshot
from lousho.checkpoint import Checkpoint
from lousho.errors import ConfigurationError, CorruptCheckpointError, PayloadKeyError, UnsealedValueError
from lousho.messages import Message, ToolCall
from lousho.operations import Target, reseal_sessions
from lousho.stores.codec import MAGIC, PLAIN, TEXT_MARK, PayloadCodec, Place
from lousho.stores.file import FileStore
from lousho.stores.mapping import dbm_store
from lousho.stores.redis import RedisStore
from lousho.stores.sql import SqliteStore
from tests.docs.walkthrough import bash_block_after
from tests.ops.conftest import LOUSHO, ROOT, run_clean
from tests.stores.codecs import KEY_1, KEY_2

BACKENDS = ["redis", "sqlite", "postgres", "dbm", "file"]
SECRET = "card 4242-4242"


def codec(*key_ids: str, unsealed: bool = False) -> PayloadCodec:
    keys = {k: {"k1": KEY_1, "k2": KEY_2}[k] for k in key_ids}
    return PayloadCodec(compress="zstd", keys=keys, read_unsealed=unsealed)


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[PayloadCodec], Any]]:
    """The same storage opened with the codec a test gives (a process restarted with new settings)."""
    opened: list[Any] = []
    kind = request.param
    if kind == "redis":
        client, prefix = request.getfixturevalue("redis_client"), request.getfixturevalue("redis_prefix")
        yield lambda c: RedisStore(client, prefix=prefix, codec=c)
        return
    if kind == "postgres":
        url = request.getfixturevalue("postgres_url")
        schema = f"lousho_t_{os.urandom(8).hex()}"

        def on_postgres(c: PayloadCodec) -> Any:
            from lousho.stores.sql import SqlStore

            opened.append(SqlStore(url, schema=schema, codec=c))
            return opened[-1]

        yield on_postgres
        for store in opened:
            store.close()
        return

    def local(c: PayloadCodec) -> Any:
        if kind == "file":
            return FileStore(tmp_path / "f", codec=c)
        for store in opened:
            store.close()
        made = SqliteStore(tmp_path / "jobs.db", codec=c) if kind == "sqlite" else dbm_store(tmp_path / "d", codec=c)
        opened.append(made)
        return made

    yield local
    for store in opened:
        store.close()


def run(store: Any, session: str) -> Checkpoint:
    checkpoint = Checkpoint(session_id=session, version=1, messages=[Message.user(SECRET)])
    store.checkpoints.save(session, checkpoint)
    checkpoint = checkpoint.model_copy(
        update={"version": 2, "step_index": 1, "messages": [*checkpoint.messages, Message.assistant("paid " * 80)]}
    )
    store.checkpoints.save(session, checkpoint)
    return checkpoint


def test_plain_data_is_refused_read_when_migrating_then_resealed_and_read_strictly(
    open_store: Callable[[PayloadCodec], Any],
) -> None:
    latest = run(open_store(PLAIN), "s1")
    with pytest.raises(UnsealedValueError, match="read_unsealed"):
        open_store(codec("k1")).checkpoints.load("s1")

    migrating = open_store(codec("k1", unsealed=True))
    assert migrating.checkpoints.load("s1") == latest
    done = reseal_sessions(Target(migrating))  # every session of the store
    assert done.key_id == "k1" and done.values == {"s1": 2 + 1 + 2}  # two messages, the head, two history entries

    strict = open_store(codec("k1"))
    assert strict.checkpoints.load("s1") == latest
    assert [e.checkpoint.version for e in strict.checkpoints.history("s1")] == [2, 1]
    strict.checkpoints.save("s1", latest.model_copy(update={"version": 3}))
    assert open_store(codec("k1")).checkpoints.load("s1") == latest.model_copy(update={"version": 3})


def test_resealing_under_a_new_key_lets_the_old_one_go(open_store: Callable[[PayloadCodec], Any]) -> None:
    latest = run(open_store(codec("k1")), "s1")
    rotated = open_store(codec("k2", "k1"))
    reseal_sessions(Target(rotated), ["s1"])
    only_new = open_store(codec("k2"))
    assert only_new.checkpoints.load("s1") == latest
    assert [e.checkpoint.version for e in only_new.checkpoints.history("s1")] == [2, 1]
    with pytest.raises(PayloadKeyError, match="'k2'"):
        open_store(codec("k1")).checkpoints.load("s1")


def approval(approval_id: str, session: str) -> ApprovalSnapshot:
    paused = Checkpoint(session_id=session, version=1, status="awaiting-approval", messages=[Message.user(SECRET)])
    call = ToolCall(id=f"call-{approval_id}", name="pay", arguments={"card": SECRET})
    return ApprovalSnapshot(id=approval_id, session_id=session, tool_call=call, checkpoint=paused)


def test_approvals_pending_and_decided_are_resealed_too(open_store: Callable[[PayloadCodec], Any]) -> None:
    """Issue #31: `lousho reseal` used to skip approvals, so a pending one written before the keys (or under a
    key being retired) could not be decided once the migration setting was off."""
    plain = open_store(PLAIN)
    run(plain, "s1")
    run(plain, "s2")
    for snapshot in (approval("a1", "s1"), approval("a2", "s1"), approval("b1", "s2")):
        plain.approvals.save(snapshot)
    plain.approvals.decide("a2", True, None)
    with pytest.raises(UnsealedValueError):
        open_store(codec("k1")).approvals.load("a1")

    migrating = open_store(codec("k1", unsealed=True))
    assert reseal_sessions(Target(migrating), ["s1"]).approvals == 2  # the session's own, decided or not
    strict = open_store(codec("k1"))
    loaded = strict.approvals.load("a1")
    assert loaded is not None and loaded.tool_call.arguments == {"card": SECRET}
    decided = strict.approvals.load("a2")
    assert decided is not None and decided.status == "approved"
    with pytest.raises(UnsealedValueError):
        strict.approvals.load("b1")  # another session's: not named, not touched

    assert reseal_sessions(Target(open_store(codec("k1", unsealed=True)))).approvals == 3  # --all: every one
    assert [a.id for a in open_store(codec("k1")).approvals.pending()] == ["a1", "b1"]


def test_a_file_store_reseals_its_approvals(tmp_path: Path) -> None:
    FileStore(tmp_path / "f").approvals.save(approval("a1", "s1"))
    migrating = FileStore(tmp_path / "f", codec=codec("k1", unsealed=True))
    assert migrating.approvals.reseal() == 1
    loaded = FileStore(tmp_path / "f", codec=codec("k1")).approvals.load("a1")
    assert loaded is not None and loaded.tool_call.arguments == {"card": SECRET}


def test_resealing_needs_a_key_and_a_store_that_can() -> None:
    with pytest.raises(ConfigurationError, match="LOUSHO_PAYLOAD_KEYS"):
        reseal_sessions(Target(SqliteStore(":memory:")), [])


def file_dump(folder: Path) -> dict[str, bytes]:
    """Every file of a FileStore's folder but its lock files, with its bytes."""
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and "locks" not in p.parts}


def damage_a_history_entry(folder: Path) -> PayloadCodec:
    history = folder / "checkpoint-history" / "s1.json"
    history.write_bytes(history.read_bytes().replace(b'{"saved_at"', b'{"saved":', 1))
    return codec("k1")


@pytest.mark.parametrize(
    ("written", "reseal", "refused"),
    [
        (PLAIN, lambda _: codec("k1"), UnsealedValueError),  # plain data, a codec that does not migrate
        (codec("k1"), lambda _: codec("k2"), PayloadKeyError),  # the old key already dropped
        (codec("k1"), damage_a_history_entry, CorruptCheckpointError),  # the history read skips it; a re-seal cannot
    ],
)
def test_a_file_store_refuses_to_reseal_a_value_it_cannot_open_and_changes_no_file(
    tmp_path: Path, written: PayloadCodec, reseal: Callable[[Path], PayloadCodec], refused: type[Exception]
) -> None:
    folder = tmp_path / "f"
    latest = run(FileStore(folder, codec=written), "s1")
    resealing = reseal(folder)
    before = file_dump(folder)
    with pytest.raises(refused):
        FileStore(folder, codec=resealing).checkpoints.reseal("s1")
    assert file_dump(folder) == before
    assert FileStore(folder, codec=written).checkpoints.load("s1") == latest


def _extents(folder: Path) -> list[tuple[int, int]]:
    """(n, b) of the head, then of each history entry."""
    head = json.loads((folder / "checkpoints" / "s1.json").read_bytes())
    entries = json.loads((folder / "checkpoint-history" / "s1.json").read_bytes())["entries"]
    return [(r["$store"]["n"], r["$store"]["b"]) for r in [head, *(e["checkpoint"] for e in entries)]]


def test_a_file_store_reseal_counts_the_new_bytes_and_later_saves_append_after_them(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    latest = run(FileStore(folder), "s1")
    assert FileStore(folder, codec=codec("k1", unsealed=True)).checkpoints.reseal("s1") == 5
    lines = (folder / "messages" / "s1.jsonl").read_bytes().splitlines(keepends=True)
    assert all(line.startswith(TEXT_MARK.encode()) for line in lines) and SECRET.encode() not in lines[0]
    assert _extents(folder) == [(2, len(lines[0] + lines[1])), (2, len(lines[0] + lines[1])), (1, len(lines[0]))]

    strict = FileStore(folder, codec=codec("k1"))
    following = latest.model_copy(update={"version": 3, "messages": [*latest.messages, Message.user("and then")]})
    strict.checkpoints.save("s1", following)
    size = (folder / "messages" / "s1.jsonl").stat().st_size
    assert size > len(b"".join(lines)) and _extents(folder)[0] == (3, size)
    fresh = FileStore(folder, codec=codec("k1"))  # another process: no cache
    assert fresh.checkpoints.load("s1") == following
    assert [e.checkpoint for e in fresh.checkpoints.history("s1")] == [following, latest, *_first(latest)]
    assert not list((folder / "messages").glob(".*"))  # no mark, no temporary file left


def _first(latest: Checkpoint) -> list[Checkpoint]:
    """`run`'s first save."""
    return [Checkpoint(session_id=latest.session_id, version=1, messages=latest.messages[:1])]


def test_a_file_store_reseals_a_session_it_lists_under_a_hash_of_its_id(tmp_path: Path) -> None:
    """An id that is not a safe file name is stored, and listed, under a hash of it: `--all` binds the values to
    the id the session's records name, not to that file name."""
    folder = tmp_path / "f"
    latest = run(FileStore(folder), "chat 42/eve")
    migrating = FileStore(folder, codec=codec("k1", unsealed=True))
    assert list(reseal_sessions(Target(migrating)).values.values()) == [5]
    assert FileStore(folder, codec=codec("k1")).checkpoints.load("chat 42/eve") == latest


def _v010_value(plain: bytes) -> bytes:
    """A value as lousho 0.1 encrypted it: codec format 1, the header alone as associated data."""
    header = MAGIC + bytes((1, 2, 2)) + b"k1"
    nonce = os.urandom(12)
    return header + nonce + AESGCM(KEY_1).encrypt(nonce, plain, header)


def test_a_value_lousho_0_1_encrypted_reads_only_when_migrating() -> None:
    stored = TEXT_MARK + base64.b64encode(_v010_value(b'{"role": "user", "content": "hi"}')).decode()
    place = Place("s", "message 0")
    with pytest.raises(UnsealedValueError, match=r"lousho 0\.1"):
        codec("k1").decode_text(stored, place)
    assert codec("k1", unsealed=True).decode_text(stored, place) == '{"role": "user", "content": "hi"}'


@pytest.mark.slow  # a few lousho processes: out of `scripts/check --fast`
def test_the_docs_reseal_command_migrates_a_store_written_before_its_keys(tmp_path: Path) -> None:
    """docs/stores.md's re-seal block, run as printed against a SQLite store written without keys."""
    path = tmp_path / "jobs.db"
    plain = SqliteStore(path)
    latest = run(plain, "s1")
    plain.close()
    keys = f"k1:{base64.b64encode(KEY_1).decode()}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"},
        "LOUSHO_STORE_URL": f"sqlite:///{path}",
        "LOUSHO_PAYLOAD_KEYS": keys,
    }
    refused = run_clean([LOUSHO, "show", "s1"], env=env)
    assert refused.returncode != 0 and "LOUSHO_UNSEALED_VALUE" in refused.stderr, refused.stderr[-2000:]

    commands = bash_block_after(ROOT / "docs" / "stores.md", "### Re-sealing: old data, retired keys")
    assert commands == ["lousho reseal --all"]
    for command in commands:
        done = run_clean([LOUSHO, *shlex.split(command)[1:]], env={**env, "LOUSHO_PAYLOAD_READ_UNSEALED": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        assert "1 session(s) re-sealed under key k1" in done.stdout

    shown = run_clean([LOUSHO, "show", "s1", "--json"], env=env)
    assert shown.returncode == 0 and SECRET in shown.stdout, shown.stderr[-2000:]
    strict = SqliteStore(path, codec=codec("k1"))
    assert strict.checkpoints.load("s1") == latest
    strict.close()


@pytest.mark.slow  # lousho processes: out of `scripts/check --fast`
def test_lousho_reseal_all_reseals_a_file_store(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    latest = run(FileStore(folder), "s1")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"},
        "LOUSHO_STORE_URL": f"file://{folder}",
        "LOUSHO_PAYLOAD_KEYS": f"k1:{base64.b64encode(KEY_1).decode()}",
    }
    done = run_clean([LOUSHO, "reseal", "--all"], env={**env, "LOUSHO_PAYLOAD_READ_UNSEALED": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "re-sealed 5 values of session s1 under key k1" in done.stdout
    shown = run_clean([LOUSHO, "show", "s1", "--json"], env=env)
    assert shown.returncode == 0 and SECRET in shown.stdout, shown.stderr[-2000:]
    assert FileStore(folder, codec=codec("k1")).checkpoints.load("s1") == latest
