"""RedisStore, checked by reading Redis itself: the layout, the history ring, TTLs, the in-flight index."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
import redis
from redis.cluster import key_slot

from lousho.checkpoint import Checkpoint
from lousho.errors import CheckpointConflictError, ConfigurationError, CorruptCheckpointError, InvalidSessionIdError
from lousho.fleet.inflight import InflightIndex
from lousho.messages import Message
from lousho.stores.redis import RedisStore
from lousho.testing.store_contract import sample_checkpoint, sample_snapshot

MakeStore = Callable[..., RedisStore]


def grow(checkpoint: Checkpoint, *messages: Message, **update: object) -> Checkpoint:
    """The next save of a run: one version more, the same message objects plus new ones."""
    return checkpoint.model_copy(
        update={
            "version": checkpoint.version + 1,
            "step_index": checkpoint.step_index + 1,
            "messages": [*checkpoint.messages, *messages],
            **update,
        }
    )


def run_steps(store: RedisStore, session: str, steps: int, size: int = 40) -> list[Checkpoint]:
    """Save `steps` checkpoints of one growing transcript; every saved checkpoint, oldest first."""
    checkpoint = Checkpoint(session_id=session, version=1, messages=[Message.user("start")])
    store.checkpoints.save(session, checkpoint)
    saved = [checkpoint]
    for step in range(1, steps):
        checkpoint = grow(checkpoint, Message.assistant(f"{step:05d}" + "x" * size))
        store.checkpoints.save(session, checkpoint)
        saved.append(checkpoint)
    return saved


def session_keys(client: redis.Redis, store: RedisStore, session: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{store.prefix}{{{session}}}*"))


def test_history_ring_is_a_list_trimmed_to_history_limit(
    make_redis_store: MakeStore, redis_client: redis.Redis
) -> None:
    store = make_redis_store(history_limit=50)
    saved = run_steps(store, "ring", 60)
    assert redis_client.llen(store.keys.history("ring")) == 50
    assert redis_client.llen(store.keys.messages("ring")) == 60, "each message is stored once"
    entries = store.checkpoints.history("ring")
    assert [e.step for e in entries] == [c.step_index for c in saved[::-1][:50]]


def test_history_entries_load_the_checkpoint_as_it_was(redis_store: RedisStore) -> None:
    saved = run_steps(redis_store, "asitwas", 30)
    entries = redis_store.checkpoints.history("asitwas")
    assert [e.checkpoint for e in entries] == saved[::-1]
    assert [len(e.checkpoint.messages) for e in entries] == list(range(30, 0, -1))
    fresh = RedisStore(redis_store.client, prefix=redis_store.prefix)  # another process: nothing cached
    assert [e.checkpoint for e in fresh.checkpoints.history("asitwas", limit=3)] == saved[::-1][:3]


def test_a_sessions_keys_share_one_cluster_slot(redis_store: RedisStore, redis_client: redis.Redis) -> None:
    run_steps(redis_store, "slotted.session:42", 3)
    keys = session_keys(redis_client, redis_store, "slotted.session:42")
    assert [k.rsplit(b":", 1)[1] for k in keys] == [b"cp", b"hist", b"msgs"]
    assert {key_slot(k) for k in keys} == {key_slot(b"slotted.session:42")}
    lease = redis_store.keys.session_key("slotted.session:42", "lease").encode()
    assert key_slot(lease) == key_slot(keys[0])


def test_entry_bytes_do_not_grow_with_the_transcript(redis_store: RedisStore, redis_client: redis.Redis) -> None:
    checkpoint = Checkpoint(session_id="long", version=1, messages=[Message.user("go")])
    redis_store.checkpoints.save("long", checkpoint)
    sizes: dict[int, tuple[int, int]] = {}
    for step in range(2, 501):
        checkpoint = grow(checkpoint, Message.assistant("m" * 1000))
        redis_store.checkpoints.save("long", checkpoint)
        if step in (10, 500):
            entry = redis_client.lindex(redis_store.keys.history("long"), 0)
            head = redis_client.strlen(redis_store.keys.head("long"))
            assert entry is not None
            sizes[step] = (len(entry), head)
    (entry10, head10), (entry500, head500) = sizes[10], sizes[500]
    assert entry500 <= entry10 * 1.05 + 16 and head500 <= head10 * 1.05 + 16, sizes
    assert redis_client.llen(redis_store.keys.messages("long")) == 500
    assert len(redis_store.checkpoints.load("long").messages) == 500  # type: ignore[union-attr]


def test_ttl_is_set_on_every_session_key_and_refreshed(make_redis_store: MakeStore, redis_client: redis.Redis) -> None:
    store = make_redis_store(ttl_s=60)
    saved = run_steps(store, "ttl", 2)
    keys = session_keys(redis_client, store, "ttl")
    assert len(keys) == 3 and all(50_000 < redis_client.pttl(k) <= 60_000 for k in keys)
    for key in keys:
        redis_client.pexpire(key, 5_000)
    store.checkpoints.save("ttl", grow(saved[-1], Message.user("again")))
    assert all(50_000 < redis_client.pttl(k) <= 60_000 for k in keys), "a save refreshes every key's TTL"
    store.approvals.save(sample_snapshot("appr_ttl"))
    assert 50_000 < redis_client.pttl(store.keys.approval("appr_ttl")) <= 60_000


def test_without_ttl_keys_do_not_expire(redis_store: RedisStore, redis_client: redis.Redis) -> None:
    run_steps(redis_store, "forever", 2)
    assert {redis_client.pttl(k) for k in session_keys(redis_client, redis_store, "forever")} == {-1}


def test_inflight_index_tracks_running_sessions_by_server_deadline(make_redis_store: MakeStore) -> None:
    store = make_redis_store(inflight_deadline_ms=5_000)
    cps, index = store.checkpoints, InflightIndex.of(store, 5_000)
    running = run_steps(store, "running", 2)[-1]
    run_steps(store, "paused", 1)
    now = index.server_time_ms()
    tracked = dict(index.due(due_before_ms=now + 60_000))
    assert set(tracked) == {"running", "paused"}
    assert all(now + 4_000 < deadline <= now + 5_000 for deadline in tracked.values()), tracked
    assert len(index.due(now + 60_000, limit=1)) == 1
    assert index.due() == [], "nothing is due yet"
    cps.save("paused", grow(cps.load("paused"), status="awaiting-approval"))  # type: ignore[arg-type]
    cps.save("running", grow(running, status="finished", finish_reason="stop"))
    assert index.due(now + 60_000) == []
    run_steps(store, "again", 1)
    index.touch("again", deadline_ms=1)
    assert index.due(due_before_ms=now) == [("again", 1)]
    cps.delete("again")
    assert index.due(now + 60_000) == []


def test_inflight_index_can_be_turned_off(make_redis_store: MakeStore, redis_client: redis.Redis) -> None:
    store = make_redis_store(inflight_deadline_ms=0)
    run_steps(store, "untracked", 2)
    assert redis_client.exists(store.keys.inflight) == 0


def test_sessions_lists_heads_by_status(redis_store: RedisStore) -> None:
    cps = redis_store.checkpoints
    cps.save("a", sample_checkpoint("a", status="in-progress", approval_id=None))
    cps.save("b", sample_checkpoint("b"))
    cps.save("c", sample_checkpoint("c", status="finished", finish_reason="stop"))
    cps.put_raw("d", "not json")
    assert cps.sessions() == ["a", "b", "c", "d"]
    assert cps.sessions(status="awaiting-approval") == ["b"]
    assert cps.sessions(status="finished") == ["c"]
    other = RedisStore(redis_store.client, prefix=redis_store.prefix + "other:")
    assert other.checkpoints.sessions() == []


def test_delete_keep_history_keeps_ring_and_messages(redis_store: RedisStore, redis_client: redis.Redis) -> None:
    saved = run_steps(redis_store, "kept", 3)
    redis_store.checkpoints.delete("kept", keep_history=True)
    assert [k.rsplit(b":", 1)[1] for k in session_keys(redis_client, redis_store, "kept")] == [b"hist", b"msgs"]
    assert [e.checkpoint for e in redis_store.checkpoints.history("kept")] == saved[::-1]
    restarted = Checkpoint(session_id="kept", version=1, messages=[Message.user("new start")])
    redis_store.checkpoints.save("kept", restarted)
    assert redis_store.checkpoints.load("kept") == restarted
    assert [e.checkpoint for e in redis_store.checkpoints.history("kept")] == [restarted, *saved[::-1]]
    redis_store.checkpoints.delete("kept")
    assert session_keys(redis_client, redis_store, "kept") == []


def test_a_save_sends_only_new_messages_and_a_cold_cache_does_not_duplicate(
    redis_store: RedisStore, redis_client: redis.Redis
) -> None:
    saved = run_steps(redis_store, "dedup", 5)
    cold = RedisStore(redis_client, prefix=redis_store.prefix)  # no cache: sends the whole transcript
    cold.checkpoints.save("dedup", grow(saved[-1], Message.user("six")))
    assert redis_client.llen(redis_store.keys.messages("dedup")) == 6, "the script kept only what was new"
    with pytest.raises(CheckpointConflictError):  # the first store's cache is stale: the version check catches it
        redis_store.checkpoints.save("dedup", grow(saved[-1], Message.user("other six")))
    latest = redis_store.checkpoints.load("dedup")
    assert latest is not None
    redis_store.checkpoints.save("dedup", grow(latest, Message.user("seven")))
    assert redis_client.llen(redis_store.keys.messages("dedup")) == 7


def test_a_recreated_session_is_not_mistaken_for_the_cached_one(make_redis_store: MakeStore) -> None:
    mine, theirs = make_redis_store(), make_redis_store()
    first = Checkpoint(session_id="reborn", version=1, messages=[Message.user("a"), Message.assistant("b")])
    mine.checkpoints.save("reborn", first)
    theirs.checkpoints.delete("reborn")
    theirs.checkpoints.save("reborn", Checkpoint(session_id="reborn", version=1, messages=[Message.user("c")] * 2))
    # Same version stored, so the compare-and-set passes; the writer id shows the head is not the cached one.
    mine.checkpoints.save("reborn", grow(first, Message.user("d")))
    assert [m.content for m in mine.checkpoints.load("reborn").messages] == ["a", "b", "d"]  # type: ignore[union-attr]


def test_a_rewritten_transcript_keeps_older_entries_readable(
    redis_store: RedisStore, redis_client: redis.Redis
) -> None:
    saved = run_steps(redis_store, "rewrite", 4)
    patched = saved[-1].model_copy(
        update={"version": 5, "messages": [*saved[-1].messages[:2], Message.user("what if")]}
    )
    redis_store.checkpoints.save("rewrite", patched)
    assert redis_store.checkpoints.load("rewrite") == patched
    assert [e.checkpoint for e in redis_store.checkpoints.history("rewrite")] == [patched, *saved[::-1]]
    head = json.loads(redis_client.get(redis_store.keys.head("rewrite")) or "")
    assert head["$store"]["s"] == [[0, 2], [4, 1]]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda c, k: c.set(k.head("s"), "{not json"), "not JSON"),
        (lambda c, k: c.set(k.head("s"), '{"$store":{"f":1,"v":"x"},"session_id":"s"}'), "store header"),
        (lambda c, k: c.set(k.head("s"), '{"$store":{"f":7,"v":1,"w":"a","t":1,"s":[]}}'), "newer lousho"),
        (lambda c, k: c.delete(k.messages("s")), "messages list is shorter"),
        (lambda c, k: c.sadd(k.head("s"), "x") if c.delete(k.head("s")) else None, "holds a set"),
        (lambda c, k: c.set(k.messages("s"), "x"), "holds a string"),
    ],
)
def test_damaged_records_raise_refuse_saves_and_are_left_as_they_are(
    redis_store: RedisStore, redis_client: redis.Redis, damage: Callable[..., object], problem: str
) -> None:
    saved = run_steps(redis_store, "s", 2)
    damage(redis_client, redis_store.keys)
    before = {k: redis_client.dump(k) for k in session_keys(redis_client, redis_store, "s")}
    with pytest.raises(CorruptCheckpointError, match=problem):
        redis_store.checkpoints.load("s")
    with pytest.raises(CorruptCheckpointError):
        redis_store.checkpoints.save("s", grow(saved[-1], Message.user("over it")))
    assert {k: redis_client.dump(k) for k in session_keys(redis_client, redis_store, "s")} == before


@pytest.mark.parametrize("ring", [True, False])
def test_a_save_whose_history_ring_or_inflight_index_is_of_the_wrong_type_writes_nothing(
    make_redis_store: MakeStore, redis_client: redis.Redis, ring: bool
) -> None:
    """The history ring and the in-flight index are type-checked by the save's first writes (issue #30: no TYPE
    asked of a key of the right type); one of the wrong type refuses the save, and nothing is written: the ring's
    entry, pushed before the index was found wrong, is taken back."""
    store = make_redis_store(history_limit=10).with_inflight_deadline(60_000)
    saved = run_steps(store, "s", 2)
    damaged = store.keys.history("s") if ring else store.keys.inflight_of("s")
    redis_client.delete(damaged)
    redis_client.sadd(damaged, "x")
    watched = [*session_keys(redis_client, store, "s"), store.keys.inflight_of("s").encode()]
    before = {k: redis_client.dump(k) for k in watched}

    with pytest.raises(
        CorruptCheckpointError, match=f"{re.escape(damaged)} holds a set, not a {'list' if ring else 'zset'}"
    ):
        store.checkpoints.save("s", grow(saved[-1], Message.user("over it")))

    assert {k: redis_client.dump(k) for k in watched} == before


def test_a_damaged_message_fails_loads_and_stays_as_it_is(redis_store: RedisStore, redis_client: redis.Redis) -> None:
    """Every read of the transcript reports a damaged message, the process that made the last save included (its
    cache is used only while the list matches the head's digest: issue #21), and nothing rewrites it: a save after
    the damage was seen sends the whole transcript, and the script refuses it when the stored messages no longer
    hash to the head's digest (issue #31: no save lands on a message changed since it was saved)."""
    saved = run_steps(redis_store, "s", 2)
    redis_client.lset(redis_store.keys.messages("s"), 0, "{bad")
    reader = RedisStore(redis_client, prefix=redis_store.prefix)  # another process
    reads = (reader.checkpoints.load, redis_store.checkpoints.load, redis_store.checkpoints.history)
    for read in reads:
        # the digest every read checks (issue #31) finds it first; a read that gets past it finds the bad JSON
        with pytest.raises(CorruptCheckpointError, match=r"stored message is damaged|do not hash to the digest"):
            read("s")
    with pytest.raises(CorruptCheckpointError, match="the save was refused"):
        redis_store.checkpoints.save("s", grow(saved[-1], Message.user("more")))
    assert redis_client.lindex(redis_store.keys.messages("s"), 0) == b"{bad"


def test_from_env_and_bad_configuration(redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    with RedisStore.from_env(prefix=redis_prefix) as store:
        store.checkpoints.save("env", sample_checkpoint("env"))
        assert store.checkpoints.load("env") == sample_checkpoint("env")
        store.checkpoints.delete("env")
        assert "password" not in repr(store)
    monkeypatch.delenv("REDIS_URL")
    with pytest.raises(ConfigurationError, match="REDIS_URL"):
        RedisStore.from_env()
    with pytest.raises(ConfigurationError):
        RedisStore(redis_url, prefix="{bad}:")
    with pytest.raises(ConfigurationError):
        RedisStore("http://not-redis")


def test_session_ids_that_keys_cannot_carry_are_refused(redis_store: RedisStore) -> None:
    for bad in ["a{b}", "a b", "x*", ""]:
        with pytest.raises(InvalidSessionIdError):
            redis_store.checkpoints.save(bad, sample_checkpoint(bad))
        with pytest.raises(InvalidSessionIdError):
            redis_store.checkpoints.load(bad)
