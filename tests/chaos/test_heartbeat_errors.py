"""A Redis error in any of the heartbeat's commands must not stop the heartbeat: a heartbeat that dies lets
the lease expire while the tool still runs, and another worker runs the same call at the same time.

The fault is real, not mocked: a Redis ACL user that may run everything but EXISTS (the heartbeat's abort
check), so that command fails every time, as a command on a dropped connection fails once.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from lousho.abort import AbortSignal
from lousho.stores.redis import RedisStore
from lousho.testing.redis_server import RedisServer
from lousho.worker import FleetSettings
from lousho.worker.heartbeat import heartbeat
from lousho.worker.leases import Lease
from lousho.worker.runtime import FleetRuntime
from tests.chaos.harness import Row, record

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


async def test_the_heartbeat_outlives_a_failing_redis_command(private_redis_server: RedisServer) -> None:
    started = time.monotonic()
    admin = private_redis_server.client()
    admin.acl_setuser("noexists", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all", "-exists"])
    client = redis.Redis(unix_socket_path=private_redis_server.socket_path, username="noexists", password="pw")
    store = RedisStore(client, prefix="hb:")
    settings = FleetSettings(lease_ttl_s=0.6, heartbeat_interval_s=0.15)
    runtime = FleetRuntime.build([], store, settings, None)
    lease = Lease(client, runtime.keys.lease("s1"), settings.lease_ttl_ms)
    assert lease.acquire()
    problems = []
    try:
        async with heartbeat(runtime, "s1", lease, AbortSignal()):
            await asyncio.sleep(4 * settings.lease_ttl_s)  # a long tool: only the heartbeat keeps the lease
    except redis.RedisError as exc:
        problems.append(f"the heartbeat died and its error escaped: {type(exc).__name__}: {exc}")
    if admin.get(runtime.keys.lease("s1")) != lease.token.encode():
        problems.append("the lease expired while the work ran: another worker could have run it too")
    lease.release()
    record(Row("Redis refuses a heartbeat command", 1, "heartbeat", {"EXISTS refused by an ACL": 1}, problems,
               time.monotonic() - started))  # fmt: skip
    assert problems == []
