"""Listings never open payloads (issue #32): `list_sessions` (what `lousho sessions` and the dashboard's sessions page
show) reads the status index and each head's plain fields (`checkpoints.heads()`), so a process whose key cannot
open a single payload still lists every session with its agent, steps, message count and save time, on every store;
rows come newest save first."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lousho.checkpoint import Checkpoint
from lousho.errors import PayloadKeyError
from lousho.messages import Message
from lousho.operations import Target, list_sessions
from lousho.stores.codec import PayloadCodec
from lousho.stores.file import FileStore
from lousho.stores.mapping import dbm_store
from lousho.stores.memory import memory_store
from lousho.stores.redis import RedisStore
from lousho.stores.sql import SqliteStore
from tests.stores.codecs import KEY_1, KEY_2

BACKENDS = ["redis", "sqlite", "postgres", "dbm", "file"]
WRITER = PayloadCodec(compress="zstd", keys={"k1": KEY_1})
OTHER_KEY = PayloadCodec(keys={"k2": KEY_2})
"""A process whose key opens none of the payloads: any payload a listing opened would raise `PayloadKeyError`."""


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[PayloadCodec], Any]]:
    """The same storage opened with the codec a test gives (a process with other settings)."""
    opened: list[Any] = []
    kind = request.param
    if kind == "redis":
        client, prefix = request.getfixturevalue("redis_client"), request.getfixturevalue("redis_prefix")
        yield lambda c: RedisStore(client, prefix=prefix, codec=c)
        return
    schema = f"lousho_t_{os.urandom(8).hex()}"

    def make(c: PayloadCodec) -> Any:
        if kind == "postgres":
            from lousho.stores.sql import SqlStore

            opened.append(SqlStore(request.getfixturevalue("postgres_url"), schema=schema, codec=c))
        elif kind == "sqlite":
            opened.append(SqliteStore(tmp_path / "jobs.db", codec=c))
        elif kind == "dbm":
            for store in opened:
                store.close()
            opened.append(dbm_store(tmp_path / "d", codec=c))
        else:
            opened.append(FileStore(tmp_path / "f", codec=c))
        return opened[-1]

    yield make
    for store in opened:
        close = getattr(store, "close", None)
        if close is not None:
            close()


def save_run(store: Any, session: str, *, agent: str, status: str = "finished") -> None:
    first = Checkpoint(session_id=session, version=1, agent_name=agent, messages=[Message.user("card 4242")])
    store.checkpoints.save(session, first)
    messages = [*first.messages, Message.assistant("paid " * 60)]
    second = first.model_copy(update={"version": 2, "step_index": 1, "status": status, "messages": messages})
    store.checkpoints.save(session, second)


def test_a_listing_opens_no_payload_and_shows_what_the_heads_hold(open_store: Callable[[PayloadCodec], Any]) -> None:
    writer = open_store(WRITER)
    save_run(writer, "older", agent="travel")
    time.sleep(0.05)  # save times a millisecond store (Redis, the mapping store) tells apart
    save_run(writer, "newer", agent="billing", status="in-progress")

    reader = open_store(OTHER_KEY)
    with pytest.raises(PayloadKeyError):
        reader.checkpoints.load("newer")  # its payloads do not open here...
    page = list_sessions(Target(reader))  # ...and the listing never tries
    assert not page.rows.skipped
    rows = [(r.session_id, r.status, r.agent, r.steps, r.messages) for r in page.rows]
    assert rows == [("newer", "in-progress", "billing", 1, 2), ("older", "finished", "travel", 1, 2)]  # newest first
    assert all(r.saved_at for r in page.rows)
    assert [r.session_id for r in list_sessions(Target(reader), "finished").rows] == ["older"]


def test_the_memory_store_lists_from_its_heads_newest_first() -> None:
    store = memory_store()
    save_run(store, "a-older", agent="travel")
    time.sleep(0.01)
    save_run(store, "b-newer", agent="billing")
    page = list_sessions(Target(store))
    assert [(r.session_id, r.agent, r.messages) for r in page.rows] == [
        ("b-newer", "billing", 2),
        ("a-older", "travel", 2),
    ]
