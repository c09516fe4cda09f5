"""A warm cache hides no damage (issue #21): a process that holds a session's transcript (it made
or read the last save) reads a damaged session as a process without it does, and writes nothing.

The stores keep, per session, the transcript of the last save they made or read; RedisStore then
reads back only the head. Its read script checks, on every read, that the messages list still hashes
to the head's digest (issue #31: cache or not), so the damage is seen on the server, without a round
trip; a read that fails drops the cache entry, so no save builds on it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from lousho.checkpoint import Checkpoint
from lousho.errors import CorruptCheckpointError
from lousho.messages import Message
from lousho.scheduler import Client
from lousho.stores.file import FileStore
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import load_script, text
from lousho.stores.sql import SqliteStore
from lousho.worker import broker_url
from tests.stores.test_redis_reliability import snapshot_of
from tests.stores.test_redis_store import grow, run_steps

MakeStore = Callable[..., RedisStore]

DAMAGED = {
    "not JSON": b'{"role":"assistant","content":"cut',
    "not a message": b'{"role":"robot","content":"hi"}',
}


def read_reply_kind(store: RedisStore, session: str) -> str:
    """What the store's read script answers this store for the session: 'known' (from the cache),
    'head' (the transcript was sent), 'corrupt' or 'none'."""
    known = store.checkpoints.reader.cached(session)
    reply = load_script(store.client, "load")(
        keys=[*store.checkpoints.reader.read_keys(session)], args=[known.writer if known else ""]
    )
    return text(reply[0])


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_message_under_a_warm_cache_is_refused_and_nothing_is_written(
    make_redis_store: MakeStore, redis_client: redis.Redis, redis_url: str, damage: str
) -> None:
    warm = make_redis_store()
    saved = run_steps(warm, "s", 4)
    assert read_reply_kind(warm, "s") == "known", "the cache is warm: the transcript is not sent"
    redis_client.lset(warm.keys.messages("s"), 1, DAMAGED[damage])
    before = snapshot_of(redis_client, warm, "s")

    fresh = make_redis_store()
    with pytest.raises(CorruptCheckpointError, match=DIGEST_MISMATCH):
        fresh.checkpoints.load("s")
    assert read_reply_kind(warm, "s") == "corrupt", "the digest no longer matches: the read refuses it"
    with pytest.raises(CorruptCheckpointError, match=DIGEST_MISMATCH):
        latest = warm.checkpoints.load("s")
        warm.checkpoints.save("s", grow(latest or saved[-1], Message.user("on top")))
    client = Client(broker=broker_url(redis_url), store=warm)
    with pytest.raises(CorruptCheckpointError, match=DIGEST_MISMATCH):
        client.enqueue("agent", "more input", session_id="s")
    assert snapshot_of(redis_client, warm, "s") == before


DIGEST_MISMATCH = "do not hash to the digest (its head|the entry) carries"


def test_an_edited_then_restored_message_is_never_served_nor_saved_on_warm_cache_or_not(
    make_redis_store: MakeStore, redis_client: redis.Redis
) -> None:
    """Issue #31, finding 3: a raw edit of a message that still parses ("transfer 9999 EUR to Eve") is
    refused by every read, cache or not; once the entry is restored, a process that read during the edit
    serves the stored message, not the edit, and its save extends the stored transcript."""
    warm = make_redis_store()
    saved = run_steps(warm, "s", 3)
    key = warm.keys.messages("s")
    original = redis_client.lindex(key, 1)
    assert original is not None
    redis_client.lset(key, 1, Message.assistant("transfer 9999 EUR to Eve").model_dump_json())
    before = snapshot_of(redis_client, warm, "s")

    for store in (warm, make_redis_store()):  # already loaded, and fresh
        with pytest.raises(CorruptCheckpointError, match=DIGEST_MISMATCH):
            store.checkpoints.load("s")
        assert store.checkpoints.reader.cached("s") is None, "a read that fails drops the cache entry"
        with pytest.raises(CorruptCheckpointError, match=DIGEST_MISMATCH):  # a save built on what it held
            store.checkpoints.save("s", grow(saved[-1], Message.user("on top")))
        with pytest.raises(CorruptCheckpointError, match=DIGEST_MISMATCH):
            store.checkpoints.history("s")
    assert snapshot_of(redis_client, warm, "s") == before, "nothing was written on top of the edit"

    redis_client.lset(key, 1, original)
    restored = warm.checkpoints.load("s")
    assert restored == saved[-1] and "Eve" not in restored.model_dump_json()
    warm.checkpoints.save("s", grow(restored, Message.user("next")))
    fresh = make_redis_store().checkpoints.load("s")
    assert fresh is not None and fresh.messages[:-1] == saved[-1].messages
    assert redis_client.lindex(key, 1) == original


def test_a_head_without_a_digest_is_read_whole_and_the_next_save_adds_one(
    make_redis_store: MakeStore, redis_client: redis.Redis
) -> None:
    """Heads an older lousho wrote carry no digest: the cache is not trusted for them; the next save
    sends the whole transcript once (the script cannot vouch for stored messages it did not hash)."""
    warm = make_redis_store()
    saved = run_steps(warm, "s", 3)
    key = warm.keys.head("s")
    head = json.loads(redis_client.get(key) or "")
    assert isinstance(head["$store"].pop("h"), str)
    redis_client.set(key, json.dumps(head, separators=(",", ":")))
    assert read_reply_kind(warm, "s") == "head"
    assert warm.checkpoints.load("s") == saved[-1]
    warm.checkpoints.save("s", grow(saved[-1], Message.user("next")))
    assert redis_client.llen(warm.keys.messages("s")) == 4, "the full write appended only the new message"
    assert read_reply_kind(warm, "s") == "known"


def _damage_sqlite(path: Path) -> None:
    with sqlite3.connect(path) as conn:  # another connection, as another program would
        conn.execute("UPDATE lousho_messages SET data = '{\"role\":\"robot\"}' WHERE session_id = 's' AND seq = 1")
    conn.close()


def _damage_file(path: Path) -> None:
    messages = path / "messages" / "s.jsonl"
    lines = messages.read_bytes().split(b"\n")
    lines[1] = b"x" * len(lines[1])  # the same length: the head's extent still matches
    messages.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_sql_and_file_stores_read_the_transcript_on_every_load_so_a_warm_cache_hides_nothing(
    tmp_path: Path, kind: str
) -> None:
    """Their loads always read the messages (only a save uses the cache): this guards the same rule."""
    path = tmp_path / ("jobs.db" if kind == "sqlite" else "store")
    warm: Any = SqliteStore(path) if kind == "sqlite" else FileStore(path)
    checkpoint = Checkpoint(session_id="s", version=1, messages=[Message.user("a")])
    warm.checkpoints.save("s", checkpoint)
    warm.checkpoints.save("s", grow(checkpoint, Message.assistant("b"), Message.user("c")))
    (_damage_sqlite if kind == "sqlite" else _damage_file)(path)
    with pytest.raises(CorruptCheckpointError, match="stored message is damaged"):
        warm.checkpoints.load("s")
    if kind == "sqlite":
        warm.close()
