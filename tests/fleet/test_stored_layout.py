"""The stored layout is recorded once in Redis and checked at every worker's start (issue #35): `lousho.formats
.STORED_LAYOUT` was published in the registry but nothing compared it with what the fleet's Redis holds, so a
worker of an older release would have run beside workers whose keys it does not know. Now the first worker
records it at `<prefix>layout`, and a worker refuses to start on a newer one, with a typed error that names both
versions and what to do, having written nothing."""

from __future__ import annotations

import time

import pytest
import redis

from lousho.errors import ConfigurationError, NewerLayoutError
from lousho.fleet.layout import claim_layout, layout_key
from lousho.formats import STORED_LAYOUT
from lousho.testing.workers import spawn_worker
from tests.fleet.conftest import ROOT, Fleet

pytestmark = pytest.mark.workers


def test_the_first_process_records_the_layout_and_an_older_one_is_raised(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    key = layout_key(redis_prefix)
    assert claim_layout(redis_client, redis_prefix) == STORED_LAYOUT
    assert redis_client.get(key) == str(STORED_LAYOUT).encode()  # recorded once, under the prefix
    redis_client.set(key, "0")  # an older layout: this release records its own (the upgrade order)
    assert claim_layout(redis_client, redis_prefix) == STORED_LAYOUT
    assert redis_client.get(key) == str(STORED_LAYOUT).encode()


def test_a_newer_layout_is_refused_naming_both_versions_and_left_as_it_is(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    key = layout_key(redis_prefix)
    redis_client.set(key, str(STORED_LAYOUT + 1))
    with pytest.raises(NewerLayoutError) as refused:
        claim_layout(redis_client, redis_prefix)
    assert refused.value.stored == STORED_LAYOUT + 1 and refused.value.supported == STORED_LAYOUT
    said = str(refused.value)
    assert "LOUSHO_NEWER_LAYOUT" in said and f"layout {STORED_LAYOUT + 1}" in said and f"layout {STORED_LAYOUT}" in said
    assert "docs/upgrading.md" in said
    assert redis_client.get(key) == str(STORED_LAYOUT + 1).encode()
    redis_client.set(key, "garbage")
    with pytest.raises(ConfigurationError, match="not a stored layout number"):
        claim_layout(redis_client, redis_prefix)


def test_a_worker_refuses_to_start_on_a_newer_layout_and_writes_nothing(fleet: Fleet) -> None:
    fleet.redis.set(layout_key(fleet.prefix), str(STORED_LAYOUT + 1))
    before = sorted(fleet.redis.keys(f"{fleet.prefix}*"))
    worker = spawn_worker(
        "tests.fleet.fleet_app", queue=fleet.queue, name="old", env=fleet.env, cwd=ROOT, log_dir=fleet.log_dir
    )
    deadline = time.monotonic() + 60
    while worker.process.poll() is None:
        assert time.monotonic() < deadline, "the worker did not stop"
        time.sleep(0.1)
    log = worker.log_path.read_text()
    assert worker.process.returncode != 0, log[-3000:]
    assert "this worker does not start" in log and "LOUSHO_NEWER_LAYOUT" in log, log[-3000:]
    assert sorted(fleet.redis.keys(f"{fleet.prefix}*")) == before  # no registry entry, nothing else
    assert fleet.redis.get(layout_key(fleet.prefix)) == str(STORED_LAYOUT + 1).encode()

    fleet.redis.delete(layout_key(fleet.prefix))  # a prefix of its own layout: the worker starts and records it
    fleet.start_worker("current")
    assert fleet.redis.get(layout_key(fleet.prefix)) == str(STORED_LAYOUT).encode()
