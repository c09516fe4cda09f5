"""One damaged record never blocks a listing (issue #21), seen from a web app's `Client` on Redis:
the readable records are returned, the damaged ones named in `skipped` and logged, and left as they are.
(The same rule for every store is in the store contract: lousho/testing/store_contract/.)"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis

from lousho.scheduler import Client
from lousho.stores.listing import Listing
from lousho.stores.redis import RedisStore
from lousho.testing.store_contract import sample_checkpoint, sample_snapshot
from lousho.worker import broker_url


def test_client_listings_return_the_readable_records_and_name_and_log_the_damaged_ones(
    make_redis_store: Callable[..., RedisStore],
    redis_client: redis.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = make_redis_store()
    store.approvals.save(sample_snapshot("appr_a", "s-1", "2024-01-01T00:00:01+00:00"))
    store.approvals.save(sample_snapshot("appr_c", "s-3", "2024-01-01T00:00:03+00:00"))
    store.approvals.put_raw("appr_b", '{"id": "appr_b", "status": "pending"}')
    for session in ("s-1", "s-3"):
        store.checkpoints.save(session, sample_checkpoint(session))
    store.checkpoints.put_raw("s-2", "[not a checkpoint")
    damaged = (redis_client.dump(store.keys.approval("appr_b")), redis_client.dump(store.keys.head("s-2")))
    client = Client(broker=broker_url(redis_url), store=store)

    with caplog.at_level(logging.WARNING, logger="lousho.stores"):
        approvals = client.approvals()
        sessions = client.sessions(status="awaiting-approval")
    assert isinstance(approvals, Listing) and isinstance(sessions, Listing)
    assert [a.id for a in approvals] == ["appr_a", "appr_c"]
    assert list(approvals.skipped) == ["appr_b"] and "LOUSHO_APPROVAL_CORRUPT" in approvals.skipped["appr_b"]
    assert list(sessions) == ["s-1", "s-3"]
    assert list(sessions.skipped) == ["s-2"] and "LOUSHO_CHECKPOINT_CORRUPT" in sessions.skipped["s-2"]
    assert [r.getMessage() for r in caplog.records] == [
        "skipped 1 unreadable approval: appr_b",
        "skipped 1 unreadable session: s-2",
    ]
    assert [a.id for a in client.approvals("s-3")] == ["appr_c"]
    assert store.approvals.decide("appr_c", True, None).status == "approved"
    assert (redis_client.dump(store.keys.approval("appr_b")), redis_client.dump(store.keys.head("s-2"))) == damaged
