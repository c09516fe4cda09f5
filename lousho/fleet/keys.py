"""The fleet's own Redis keys, beside the store's: same prefix, same per-session hash tag."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from lousho.checkpoint import Checkpoint
from lousho.fleet.dispatch import tool_turn
from lousho.fleet.events import events_key, open_stream
from lousho.messages import ToolCall
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors, text

__all__ = ["FleetKeys", "new_epoch", "result_field"]


def new_epoch() -> str:
    """A fresh incarnation id for a session (lua/lib/epoch.lua, issue #21)."""
    return uuid.uuid4().hex[:16]


INTERRUPTED = "interrupted:"
"""The prefix of an 'ask' call's mark in the session's attempts hash: '<prefix><turn>:<call id>' (issue #17)."""


def result_field(turn: int, call_id: str) -> str:
    """A call's field in the session's results, dispatched and attempts hashes: `<turn>:<call id>`.

    The turn is part of it because a model may reuse call ids from turn to turn ('call_0' each
    time): a result committed for turn 3's `call_0` must never stand for turn 4's."""
    return f"{turn}:{call_id}"


@dataclass(frozen=True)
class FleetKeys:
    """The fleet's own per-session keys, beside the store's (same prefix and hash tag)."""

    store: RedisStore

    def has_interrupted_mark(self, checkpoint: Checkpoint, call: ToolCall) -> bool:
        """Whether `call` of the checkpoint's session carries the mark of an interrupted 'ask' call
        (`lousho.worker.interrupted`); read by the fold, and by the repair of an approval record, which must
        tell which kind of approval it was (issue #18)."""
        field = f"{INTERRUPTED}{result_field(tool_turn(checkpoint), call.id)}"
        session_id = checkpoint.session_id
        with redis_errors(self.store.client, f"read the interrupted mark of call {call.id!r} of {session_id!r}"):
            return bool(self.store.client.hexists(self.attempts(session_id), field))

    def lease(self, session_id: str) -> str:
        return self.store.keys.session_key(session_id, "lease")

    def call_lease(self, session_id: str, call_id: str) -> str:
        return self.store.keys.session_key(session_id, f"lease:{call_id}")

    def results(self, session_id: str) -> str:
        """Hash `result_field` -> result JSON: each call's result is committed once (HSETNX).
        Dropped, with `dispatched` and `attempts`, when the step that completes a turn ends."""
        return self.store.keys.session_key(session_id, "results")

    def dispatched(self, session_id: str) -> str:
        """Hash `result_field` -> 1: tool tasks already sent, so a fold does not send them again."""
        return self.store.keys.session_key(session_id, "dispatched")

    def attempts(self, session_id: str) -> str:
        """Hash 'turn:<n>' / 'call:<result_field>' -> started attempts (poison detection)."""
        return self.store.keys.session_key(session_id, "attempts")

    def abort(self, session_id: str) -> str:
        return self.store.keys.session_key(session_id, "abort")

    def requeued(self, session_id: str) -> str:
        """While a reaper's `advance` for the session waits on the queue: until when it may wait (server
        ms; `FleetSettings.requeue_wait_ms`). The reaper sends no other until a worker takes it or that
        time passes (issue #21)."""
        return self.store.keys.session_key(session_id, "requeued")

    def epoch(self, session_id: str) -> str:
        """The session's incarnation (lua/lib/epoch.lua): set anew when `Client.enqueue` creates the
        session, so work of a deleted session of the same id commits nothing (issue #21)."""
        return self.store.keys.session_key(session_id, "epoch")

    @property
    def running(self) -> str:
        """Sorted set of the tool calls running on the fleet (`RunningCall.entry`), scored by their
        last beat: how a restarted call finds the runs that died with its own (lua/call_begin.lua).
        The one key of a single Redis; on a Cluster, `running_of` a session and `shards` (issue #18)."""
        return self.store.keys.running

    def running_of(self, session_id: str) -> str:
        """The running index key (shard, on a Cluster) that lists `session_id`'s calls (issue #18)."""
        return self.store.keys.running_of(session_id)

    @property
    def parked(self) -> str:
        """Hash of sessions whose model turn killed its worker `max_attempts` times -> why. The one key of
        a single Redis; on a Cluster, `parked_of` a session and `shards` (issue #18)."""
        return self.store.keys.parked

    def parked_of(self, session_id: str) -> str:
        """The parked hash key (shard, on a Cluster) that would hold `session_id` (issue #18)."""
        return self.store.keys.parked_of(session_id)

    def parked_sessions(self) -> list[str]:
        """The parked sessions' ids, over every shard of the parked hash."""
        client = self.store.client
        with redis_errors(client, "list the parked sessions"):
            pipe = client.pipeline(transaction=False)
            for shard in self.shards("parked"):
                pipe.hkeys(shard)
            return [text(name) for names in pipe.execute() for name in names]

    def shards(self, index: str) -> list[str]:
        """Every key of a fleet index ('running', 'parked', 'inflight'): one, or one per slot (issue #18)."""
        return self.store.keys.shards(index)

    @property
    def reaper_locks(self) -> list[str]:
        """The reaper's pass locks: one on one Redis; on a Cluster one per slot group, each over the index
        shards of its group's slots (`RedisKeys.shards_in_groups`), so no key is global (issue #18)."""
        return self.store.keys.fleet_wide_shards("reaper:lock")

    def new_incarnation(self, session_id: str, epoch: str | None = None) -> None:
        """Make the session a new incarnation (lua/lib/epoch.lua, issue #21): a fresh epoch, and none of
        the fleet state a deleted session of the same id left behind (its results, marks, poison
        counts, its lease). Work of that earlier run still under way then commits nothing, and its
        fenced saves are refused: its lease is gone. One transaction, before the session's record is
        saved (by `Client.enqueue`, or by a parent starting a sub-agent's session, whose epoch is then the
        parent's: a sub-agent of an earlier incarnation of its parent is told apart by it)."""
        with redis_errors(self.store.client, f"start a new incarnation of {session_id!r}"):
            pipe = self.store.client.pipeline(transaction=True)
            pipe.set(self.epoch(session_id), new_epoch() if epoch is None else epoch)
            pipe.delete(self.lease(session_id), self.results(session_id), self.dispatched(session_id))
            pipe.delete(self.attempts(session_id), self.abort(session_id))
            pipe.hdel(self.parked_of(session_id), session_id)
            events = events_key(self.store, session_id)  # a fresh stream: none of the earlier run's (issue #34)
            pipe.delete(events)
            open_stream(pipe, events, self.store.ttl_s)
            pipe.execute()
