"""What `Client.enqueue` costs in round trips to the store (issue #30): every read it can batch is batched."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lousho.fleet.settings import FleetSettings
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from tests.fixtures.round_trips import round_trips


def test_enqueue_takes_four_round_trips_to_the_store_for_a_new_session_or_an_existing_one(
    make_redis_store: Callable[..., RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new job: the stored checkpoint's read, the registry (server time and entries, one pipeline), the new
    incarnation (one transaction, which clears the abort and parked marks and opens the live-event stream, issue
    #34), the save. A job on an existing session: the read, the registry, the save, and the stream opened with the
    marks cleared (one transaction). Was 7 and 6 before issue #30, without the stream; 5 and 5 with it."""
    store = make_redis_store()
    client = Client(broker="memory://", store=store, settings=FleetSettings())
    client.enqueue("agent", "warm up", session_id="warm", require_worker=False)  # the scripts loaded, connected
    sent = round_trips(client.store, monkeypatch)

    client.enqueue("agent", "hello", session_id="new", require_worker=False)
    new_session = list(sent)
    sent.clear()
    client.enqueue("agent", "more", session_id="new", require_worker=False)

    assert len(new_session) == 4, new_session
    assert len(sent) == 4, sent
    assert b"TIME" in new_session[1] and b"HGETALL" in new_session[1], "the registry's reads in one round trip"
    assert b"XADD" in new_session[2] and b"SET" in new_session[2], "the stream opened by the new incarnation"
    assert all(command in sent[-1] for command in (b"XADD", b"DEL", b"HDEL")), "stream and marks in one round trip"
