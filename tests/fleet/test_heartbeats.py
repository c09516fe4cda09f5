"""Heartbeats (issue #29): the work in flight on one event loop beats in one round trip, and each beat still does,
for its own piece of work, what a beat must: extend a lease only while it is ours, push the session's in-flight
deadline, mark a tool call's run alive, and bring `Client.abort` to the work. Real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from lousho.abort import AbortSignal
from lousho.fleet.keys import FleetKeys
from lousho.stores.redis import RedisStore
from lousho.worker import FleetSettings
from lousho.worker.heartbeat import Beating, Heart, beat, heart_of, heartbeat
from lousho.worker.leases import Lease
from lousho.worker.runtime import FleetRuntime
from tests.fixtures.round_trips import round_trips


def runtime_on(store: RedisStore, settings: FleetSettings) -> FleetRuntime:
    return FleetRuntime.build([], store, settings, None)


def held_lease(runtime: FleetRuntime, session_id: str) -> Lease:
    lease = Lease(runtime.store.client, runtime.keys.lease(session_id), runtime.settings.lease_ttl_ms)
    assert lease.acquire()
    return lease


def test_the_beats_due_on_a_loop_go_to_redis_in_one_round_trip(
    redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = runtime_on(redis_store, FleetSettings(lease_ttl_s=60.0))
    beating = [Beating(f"s{n}", held_lease(runtime, f"s{n}"), AbortSignal()) for n in range(50)]
    beat(runtime, beating)  # the first beat of a process loads the script (NOSCRIPT, SCRIPT LOAD, again)
    sent = round_trips(redis_store, monkeypatch)

    beat(runtime, beating)

    assert len(sent) == 1, "fifty beats, one round trip"
    assert sent[0].count(b"EVALSHA") == 50


def test_a_beat_extends_its_lease_pushes_the_deadline_and_marks_the_calls_run_alive(redis_store: RedisStore) -> None:
    runtime = runtime_on(redis_store, FleetSettings(lease_ttl_s=60.0))
    client, keys = redis_store.client, FleetKeys(redis_store)
    step = Beating("s1", held_lease(runtime, "s1"), AbortSignal())
    call = Beating("s2", held_lease(runtime, "s2"), AbortSignal(), entry="s2|call-entry")
    for item in (step, call):
        client.pexpire(item.lease.key, 1_000)  # about to expire: only the beat keeps it
    client.zadd(keys.running_of("s2"), {"s2|call-entry": 1})
    seconds, micros = client.time()
    before_ms = int(seconds) * 1000 + int(micros) // 1000

    beat(runtime, [step, call])

    for item in (step, call):
        assert client.pttl(item.lease.key) > 50_000
        assert client.get(item.lease.key) == item.lease.token.encode()
        assert client.zscore(redis_store.keys.inflight_of(item.session_id), item.session_id) >= before_ms + 60_000
        assert item.lease.held and not item.signal.aborted
    assert client.zscore(keys.running_of("s2"), "s2|call-entry") >= before_ms


def test_a_beat_brings_an_abort_to_the_work_of_that_session_only(redis_store: RedisStore) -> None:
    runtime = runtime_on(redis_store, FleetSettings(lease_ttl_s=60.0))
    aborted, other = (Beating(s, held_lease(runtime, s), AbortSignal()) for s in ("s1", "s2"))
    redis_store.client.set(FleetKeys(redis_store).abort("s1"), "1")

    beat(runtime, [aborted, other])

    assert aborted.signal.aborted
    assert not other.signal.aborted


def test_a_beat_on_a_lease_taken_over_changes_nothing_of_the_new_holders(redis_store: RedisStore) -> None:
    runtime = runtime_on(redis_store, FleetSettings(lease_ttl_s=60.0))
    client = redis_store.client
    lost, kept = (Beating(s, held_lease(runtime, s), AbortSignal()) for s in ("s1", "s2"))
    client.set(lost.lease.key, "another-worker", px=5_000)  # expired and taken over while this one was stopped

    beat(runtime, [lost, kept])

    assert lost.lease.held is False, "a save by this worker will be refused"
    assert client.get(lost.lease.key) == b"another-worker" and client.pttl(lost.lease.key) <= 5_000
    assert client.zscore(redis_store.keys.inflight_of("s1"), "s1") is None, "the new holder's deadline to push"
    assert kept.lease.held


def test_a_beat_of_work_whose_lease_was_released_sends_nothing(
    redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = runtime_on(redis_store, FleetSettings(lease_ttl_s=60.0))
    done = Beating("s1", held_lease(runtime, "s1"), AbortSignal())
    done.lease.release()  # a save that ended the step
    sent = round_trips(redis_store, monkeypatch)

    beat(runtime, [done])

    assert sent == []


def test_a_beat_that_redis_refuses_is_logged_and_the_next_one_still_comes(
    redis_store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = runtime_on(redis_store, FleetSettings(lease_ttl_s=60.0))
    item = Beating("s1", held_lease(runtime, "s1"), AbortSignal())
    redis_store.client.hset(FleetKeys(redis_store).abort("s1"), "not", "a flag")  # EXISTS still answers
    redis_store.client.set(redis_store.keys.inflight_of("s1"), "a string, not an index")  # ZADD fails

    beat(runtime, [item])

    assert "heartbeat for s1 failed" in caplog.text
    assert item.lease.held, "the lease was extended before the refused command"
    redis_store.client.delete(redis_store.keys.inflight_of("s1"))
    beat(runtime, [item])
    assert redis_store.client.zscore(redis_store.keys.inflight_of("s1"), "s1") is not None


async def test_work_running_past_its_lease_keeps_it_and_every_beat_of_the_loop_shares_a_round_trip(
    redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = FleetSettings(lease_ttl_s=1.5, heartbeat_interval_s=0.1)
    runtime = runtime_on(redis_store, settings)
    leases = [held_lease(runtime, f"s{n}") for n in range(20)]
    beat(runtime, [Beating("warm", held_lease(runtime, "warm"), AbortSignal())])  # the script loaded
    sent = round_trips(redis_store, monkeypatch)

    async def long_tool(n: int) -> None:
        async with heartbeat(runtime, f"s{n}", leases[n], AbortSignal()):
            await asyncio.sleep(2 * settings.lease_ttl_s)  # only the beats keep the lease

    await asyncio.gather(*(long_tool(n) for n in range(20)))

    for lease in leases:
        assert redis_store.client.get(lease.key) == lease.token.encode(), "expired while the work ran"
    beats = [packet for packet in sent if b"EVALSHA" in packet]
    assert len(beats) >= 2 * settings.lease_ttl_s / settings.heartbeat_s - 2
    # Work that began a moment apart (a busy machine can spread the twenty starts over ticks) falls into step at
    # the first beat: every later round trip carries all twenty.
    assert all(packet.count(b"EVALSHA") == 20 for packet in beats[1:]), "the loop's twenty beats in each round trip"
    assert not heart_of(runtime, asyncio.get_running_loop()).beating, "nothing beats once the work is over"


def test_work_half_way_to_its_beat_goes_in_the_round_trip_of_a_beat_that_is_due(
    redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work that began a moment apart falls into step: once one beat is due, those past half their interval beat
    in the same trip (and share the later ones); those less than half way wait for theirs. Time is set, not slept."""
    runtime = runtime_on(redis_store, FleetSettings(lease_ttl_s=60.0, heartbeat_interval_s=8.0))
    beat(runtime, [Beating("warm", held_lease(runtime, "warm"), AbortSignal())])  # the script loaded
    loop = asyncio.new_event_loop()
    heart, now = Heart(runtime, loop), time.monotonic()
    due, half, fresh = (Beating(s, held_lease(runtime, s), AbortSignal(), last_s=now - ago) for s, ago in
                        (("due", 7.5), ("half", 4.5), ("fresh", 3.5)))  # fmt: skip
    heart.beating |= {due, half, fresh}
    sent = round_trips(redis_store, monkeypatch)
    try:
        heart._tick()
    finally:
        loop.close()

    assert [packet.count(b"EVALSHA") for packet in sent if b"EVALSHA" in packet] == [2]
    assert due.last_s == half.last_s > now
    assert fresh.last_s == now - 3.5


def test_a_redis_that_is_down_does_not_stop_the_heart(redis_store: RedisStore) -> None:
    runtime = runtime_on(redis_store, FleetSettings(lease_ttl_s=60.0))
    item = Beating("s1", held_lease(runtime, "s1"), AbortSignal())
    down = RedisStore(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2), prefix=redis_store.prefix)

    beat(runtime_on(down, FleetSettings(lease_ttl_s=60.0)), [item])  # logged; nothing raised

    assert item.lease.held
