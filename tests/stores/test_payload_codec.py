"""The payload codec on each store that outlives its object (Redis, SQLite, files, dbm): keys rotate, a wrong
or missing key is a typed error that changes nothing, plain records still read, and Redis holds no plaintext
of a secret (issue #17). The store contract with the codec on is in test_contract.py / test_redis_contract.py."""

from __future__ import annotations

import base64
import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from lousho.checkpoint import Checkpoint
from lousho.errors import ConfigurationError, PayloadDecodeError, PayloadKeyError, UnsealedValueError
from lousho.messages import Message, ToolCall
from lousho.stores.codec import MAGIC, PLAIN, SEALED, TEXT_MARK, PayloadCodec, parse_keys
from lousho.stores.file import FileStore
from lousho.stores.mapping import dbm_store
from lousho.stores.redis import RedisStore
from lousho.stores.sql import SqliteStore
from lousho.testing.store_contract.samples import sample_checkpoint, sample_snapshot
from tests.stores.codecs import KEY_1, KEY_2, holding, raw_values

BACKENDS = ["redis", "sqlite", "file", "dbm"]
SESSION = "codec-s"


@dataclass
class Backend:
    """One store's storage, opened again with whichever codec a test gives (a process restarted with new keys)."""

    open: Callable[[PayloadCodec], Any]
    raw: Callable[[], Any]
    """Everything the storage holds, to compare before and after a refused call."""


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    opened: list[Any] = []

    def keep(store: Any) -> Any:
        opened.append(store)
        return store

    if request.param == "redis":
        client, prefix = request.getfixturevalue("redis_client"), request.getfixturevalue("redis_prefix")
        yield Backend(
            lambda codec: RedisStore(client, prefix=prefix, codec=codec),
            lambda: sorted(raw_values_under(client, prefix)),
        )
    elif request.param == "sqlite":
        path = tmp_path / "codec.db"
        yield Backend(lambda codec: keep(SqliteStore(path, codec=codec)), lambda: _sqlite_dump(path))
    elif request.param == "file":
        folder = tmp_path / "files"
        yield Backend(lambda codec: FileStore(folder, codec=codec), lambda: _files(folder))
    else:
        path = tmp_path / "codec-dbm"
        yield Backend(lambda codec: keep(dbm_store(path, codec=codec)), lambda: _dbm_items(opened))
    for store in opened:
        store.close()


def raw_values_under(client: redis.Redis, prefix: str) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw_values(client) if k.startswith(prefix.encode())]


def _sqlite_dump(path: Path) -> list[str]:
    with closing(sqlite3.connect(path)) as db:  # the WAL's pages too, unlike the file's bytes
        return list(db.iterdump())


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "locks" not in p.parts
    }


def _dbm_items(opened: list[Any]) -> dict[str, Any]:
    mapping = opened[0].mapping
    return {k: mapping[k] for k in mapping.keys()}  # noqa: SIM118 - a dbm is not iterable everywhere


def codec_of(*key_ids: str, compress: bool = True) -> PayloadCodec:
    return PayloadCodec(compress=compress, keys={k: {"k1": KEY_1, "k2": KEY_2}[k] for k in key_ids})


def secret_checkpoint(secret: str, version: int = 1) -> Checkpoint:
    messages = [
        Message.user(f"my card is {secret}"),
        Message.assistant(tool_calls=[ToolCall(id="c1", name="pay", arguments={"card": secret})]),
        Message(role="tool", content=f'{{"paid_with": "{secret}"}}', tool_call_id="c1", name="pay"),
    ]
    extra = [Message.assistant(f"done with {secret}")] if version > 1 else []
    return sample_checkpoint(
        SESSION, version=version, status="in-progress", messages=messages + extra, business_state={"card": secret}
    )


def key_id_of(stored: str | bytes) -> str:
    """The key id in an encoded value's header (text or bytes form)."""
    raw = stored.encode() if isinstance(stored, str) else stored
    if raw.startswith(TEXT_MARK.encode()):
        raw = base64.b64decode(raw[len(TEXT_MARK) :])
    assert raw.startswith(MAGIC), raw[:20]
    length = raw[len(MAGIC) + 2]
    return raw[len(MAGIC) + 3 : len(MAGIC) + 3 + length].decode()


# -- the codec itself ------------------------------------------------------------------------


def test_an_encoded_payload_reads_back_and_a_plain_one_reads_as_it_is() -> None:
    codec = codec_of("k1")
    plain = b'{"content": "' + b"hello " * 100 + b'"}'
    encoded = codec.encode(plain)
    assert encoded.startswith(MAGIC) and b"hello" not in encoded
    assert len(encoded) < len(plain)  # compressed before it was encrypted
    assert codec.decode(encoded) == plain
    with pytest.raises(UnsealedValueError):  # a keyed codec refuses plain JSON (issue #31)
        codec.decode(plain)
    assert PayloadCodec(keys={"k1": KEY_1}, read_unsealed=True).decode(plain) == plain
    assert codec.decode_text(codec.encode_text(plain.decode())) == plain.decode()


@pytest.mark.parametrize("compress", ["zlib", "zstd"])
def test_each_compression_reads_back_in_a_store_of_the_other(compress: str) -> None:
    plain = b'{"rows": [' + b'{"id": 1, "name": "table by the window"}, ' * 40 + b"{}]}"
    encoded = PayloadCodec(compress=compress, keys={"k1": KEY_1}).encode(plain)
    assert len(encoded) < len(plain) / 2
    other = "zstd" if compress == "zlib" else "zlib"
    assert PayloadCodec(compress=other, keys={"k1": KEY_1}).decode(encoded) == plain
    with pytest.raises(ConfigurationError, match="'zlib' or 'zstd'"):
        PayloadCodec(compress="lz4")


def test_a_compressed_only_payload_reads_in_a_store_without_a_codec() -> None:
    encoded = PayloadCodec(compress=True).encode_text('{"a": "' + "x" * 400 + '"}')
    assert encoded.startswith(TEXT_MARK)
    assert PLAIN.decode_text(encoded) == '{"a": "' + "x" * 400 + '"}'


def test_a_damaged_payload_is_a_decode_error() -> None:
    encoded = bytearray(codec_of("k1").encode(b'{"a": 1}' * 20))
    encoded[-1] ^= 1
    with pytest.raises(PayloadKeyError, match="altered"):  # the tag does not verify: wrong key or edited
        codec_of("k1").decode(bytes(encoded))
    with pytest.raises(PayloadDecodeError, match="newer lousho"):
        PLAIN.decode(MAGIC + bytes((9, 0, 0)) + b"x")


def test_keys_must_be_aes_keys_and_the_environment_names_them() -> None:
    with pytest.raises(ConfigurationError, match="16, 24 or 32 bytes"):
        PayloadCodec(keys={"k1": b"short"})
    with pytest.raises(ConfigurationError, match="base64"):
        parse_keys("k1:not base64!")
    env = {"LOUSHO_PAYLOAD_KEYS": f"k2:{base64.b64encode(KEY_2).decode()},k1:{base64.b64encode(KEY_1).decode()}"}
    codec = PayloadCodec.from_env({**env, "LOUSHO_PAYLOAD_COMPRESS": "1"})
    assert codec.keys == {"k2": KEY_2, "k1": KEY_1} and codec.compress
    assert key_id_of(codec.encode(b"{}")) == "k2"  # the first key writes
    assert PayloadCodec.from_env({}) is PLAIN
    assert "k1" in repr(codec) and KEY_1.hex() not in repr(codec)


# -- on every store that outlives its object -----------------------------------------------------


def test_data_written_under_key_1_reads_after_key_2_is_added_and_new_writes_use_key_2(backend: Backend) -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    first = backend.open(codec_of("k1"))
    first.checkpoints.save(SESSION, secret_checkpoint(secret))
    first.approvals.save(sample_snapshot("appr-rotate", SESSION))

    rotated = backend.open(codec_of("k2", "k1"))
    assert rotated.checkpoints.load(SESSION) == secret_checkpoint(secret)
    assert rotated.approvals.load("appr-rotate") == sample_snapshot("appr-rotate", SESSION).model_copy(
        update={"created_at": rotated.approvals.load("appr-rotate").created_at}
    )
    rotated.checkpoints.save(SESSION, secret_checkpoint(secret, version=2))
    rotated.approvals.decide("appr-rotate", True, "ok")

    again = backend.open(codec_of("k2", "k1"))
    assert again.checkpoints.load(SESSION) == secret_checkpoint(secret, version=2)
    assert [e.checkpoint.version for e in again.checkpoints.history(SESSION)] == [2, 1]
    assert again.approvals.load("appr-rotate").status == "approved"
    assert key_id_of(json.loads(head_of(again, SESSION))[SEALED]) == "k2"  # new writes: the newest key
    only_new = backend.open(codec_of("k2"))
    assert only_new.approvals.load("appr-rotate").status == "approved"  # re-written under k2
    with pytest.raises(PayloadKeyError, match="'k1'"):  # the first save's messages stay under k1: keep it
        only_new.checkpoints.load(SESSION)


def head_of(store: Any, session_id: str) -> str:
    """The stored head of a session, as text."""
    if isinstance(store, RedisStore):
        raw = store.client.get(store.keys.head(session_id))
    else:
        raw = store.checkpoints.get_raw(session_id)
    assert raw is not None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def test_a_wrong_key_is_a_typed_error_and_changes_nothing(backend: Backend) -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    right = backend.open(codec_of("k1"))
    right.checkpoints.save(SESSION, secret_checkpoint(secret))
    right.approvals.save(sample_snapshot("appr-wrong", SESSION))
    before = backend.raw()

    wrong = backend.open(PayloadCodec(compress=True, keys={"k1": KEY_2}))  # the id is right, the key is not
    with pytest.raises(PayloadKeyError, match="'k1' does not open"):
        wrong.checkpoints.load(SESSION)
    with pytest.raises(PayloadKeyError):
        wrong.checkpoints.save(SESSION, secret_checkpoint(secret, version=2))
    with pytest.raises(PayloadKeyError):
        wrong.checkpoints.history(SESSION)
    with pytest.raises(PayloadKeyError):
        wrong.approvals.decide("appr-wrong", True, None)
    assert backend.raw() == before
    assert backend.open(codec_of("k1")).checkpoints.load(SESSION) == secret_checkpoint(secret)


def test_a_missing_key_id_names_the_key_to_add(backend: Backend) -> None:
    backend.open(codec_of("k1")).checkpoints.save(SESSION, secret_checkpoint("x"))
    before = backend.raw()
    with pytest.raises(PayloadKeyError, match=r"key id 'k1'.*keys=\{'k1'"):
        backend.open(codec_of("k2")).checkpoints.load(SESSION)
    with pytest.raises(PayloadKeyError, match="key id 'k1'"):
        backend.open(PLAIN).checkpoints.load(SESSION)  # a store without the codec does not read it as empty
    assert backend.raw() == before


def test_records_written_before_the_codec_was_turned_on_read_only_when_migrating(backend: Backend) -> None:
    """Issue #31: a store with keys refuses what no key sealed (anyone who can write could have), unless it is
    opened with `read_unsealed=True` to migrate (then `lousho reseal`, tests/stores/test_reseal.py)."""
    backend.open(PLAIN).checkpoints.save(SESSION, secret_checkpoint("old"))
    before = backend.raw()
    with pytest.raises(UnsealedValueError, match="read_unsealed"):
        backend.open(codec_of("k1")).checkpoints.load(SESSION)
    with pytest.raises(UnsealedValueError):
        backend.open(codec_of("k1")).checkpoints.save(SESSION, secret_checkpoint("old", version=2))
    assert backend.raw() == before
    on = backend.open(PayloadCodec(compress=True, keys={"k1": KEY_1}, read_unsealed=True))
    assert on.checkpoints.load(SESSION) == secret_checkpoint("old")
    on.checkpoints.save(SESSION, secret_checkpoint("old", version=2))
    again = backend.open(PayloadCodec(compress=True, keys={"k1": KEY_1}, read_unsealed=True))
    assert again.checkpoints.load(SESSION) == secret_checkpoint("old", version=2)
    assert [e.checkpoint.version for e in again.checkpoints.history(SESSION)] == [2, 1]


def test_listing_by_status_and_prune_need_no_key(backend: Backend) -> None:
    """Status, ids and times stay plain (the secret boundary, docs/stores.md): a store without the key lists."""
    backend.open(codec_of("k1")).checkpoints.save(SESSION, secret_checkpoint("x"))
    assert backend.open(PLAIN).sessions(status="in-progress") == [SESSION]


def test_redis_holds_no_plaintext_of_a_secret_in_messages_tool_results_state_or_approvals(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    store = RedisStore(redis_client, prefix=redis_prefix, codec=codec_of("k1"))
    store.checkpoints.save(SESSION, secret_checkpoint(secret))
    store.checkpoints.save(SESSION, secret_checkpoint(secret, version=2))
    snapshot = sample_snapshot("appr-secret", SESSION)
    call = snapshot.tool_call.model_copy(update={"arguments": {"card": secret}})
    store.approvals.save(snapshot.model_copy(update={"tool_call": call}))
    assert store.checkpoints.load(SESSION) == secret_checkpoint(secret, version=2)

    assert holding(redis_client, secret) == []
    plain = RedisStore(redis_client, prefix=redis_prefix + "plain:")  # the same write without the codec: found
    plain.checkpoints.save(SESSION, secret_checkpoint(secret))
    assert holding(redis_client, secret) != []


def test_a_redis_client_that_decodes_replies_to_text_is_refused_with_the_codec(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigurationError, match="decode_responses"):
            RedisStore(client, codec=codec_of("k1"))
        RedisStore(client)  # without the codec it is the client it always was
    finally:
        client.close()


def test_compression_alone_keeps_a_head_plain_unless_its_state_is_worth_compressing() -> None:
    codec = PayloadCodec(compress=True)
    small = Checkpoint(session_id=SESSION, version=1, business_state={"turn": 1})
    assert SEALED not in codec.seal_head(small)  # nothing secret without a key, nothing to gain
    big = small.model_copy(update={"business_state": {"rows": ["the same row"] * 200}})
    head = json.loads(codec.seal_head(big))
    assert head[SEALED].startswith(TEXT_MARK) and head["status"] == "in-progress"
    assert codec.open_fields(head)["business_state"] == big.business_state
    assert codec.encode_text('{"a": 1}') == '{"a": 1}'  # too small to compress: stays plain JSON


def test_every_built_in_store_url_opens_with_the_codec_and_an_opener_without_it_is_refused(tmp_path: Path) -> None:
    from lousho.stores import registry

    built_in = [s for s, e in registry._OPENERS.items() if str(e.opener).startswith("lousho.")]  # not tests'
    assert {"redis", "sqlite", "postgresql", "file", "dbm"} <= set(built_in)
    for scheme in built_in:
        opener = registry._resolve(registry._OPENERS[scheme].opener)
        assert registry._takes_codec(opener), f"the opener of {scheme!r} takes no codec= (issue #17)"
    store = registry.open_store(f"sqlite:///{tmp_path}/c.db", codec=codec_of("k1"))
    assert store.codec.keys == {"k1": KEY_1}
    store.close()

    registry.register_store("nocodec", lambda url, *, prefix="lousho:": SqliteStore(tmp_path / "n.db"), example="x")
    try:
        with pytest.raises(ConfigurationError, match="takes no codec"):
            registry.open_store("nocodec://x", codec=codec_of("k1"))
        registry.open_store("nocodec://x", codec=PLAIN).close()  # the codec off: opened as before
    finally:
        registry._OPENERS.pop("nocodec")


def test_a_listing_skips_a_damaged_encoded_record_and_raises_for_a_missing_key() -> None:
    from lousho.stores.memory import memory_store

    store = memory_store(codec=PayloadCodec(compress=True))
    store.approvals.save(sample_snapshot("appr-ok", SESSION))
    store.approvals.put_raw("appr-cut", TEXT_MARK + base64.b64encode(MAGIC + bytes((1, 1, 0)) + b"cut").decode())
    listing = store.approvals.pending()
    assert [s.id for s in listing] == ["appr-ok"] and list(listing.skipped) == ["appr-cut"]

    encrypted = codec_of("k1").encode_text(sample_snapshot("appr-k1", SESSION).model_dump_json())
    store.approvals.put_raw("appr-k1", encrypted)
    with pytest.raises(PayloadKeyError, match="'k1'"):
        store.approvals.pending()


def test_a_wrong_key_saves_nothing_even_over_a_checkpoint_without_messages(backend: Backend) -> None:
    backend.open(codec_of("k1")).checkpoints.save(SESSION, Checkpoint(session_id=SESSION, version=1))
    before = backend.raw()
    wrong = backend.open(PayloadCodec(keys={"k1": KEY_2}))
    with pytest.raises(PayloadKeyError):
        wrong.checkpoints.save(SESSION, Checkpoint(session_id=SESSION, version=2, messages=[Message.user("x")]))
    assert backend.raw() == before
