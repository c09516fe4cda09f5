"""The fleet's Lua scripts as one process loads them, and the small guarded writes of a step.

A hop's round trips are each one script, called from the module of its transition (issue #30: the path
of a hop readable in one place; docs/fleet.md walks it in order):

- `begin.py`: a step takes its session's lease and reads all it needs (open_step.lua); a tool call's task
  takes the call's lease (call_begin.lua);
- `commit.py`: a tool call's result committed once, and the session's lease taken (call_commit.lua);
- `fold.py`: a turn's last result committed, folded into the checkpoint and the step ended (commit_fold.lua);
- `ending.py`: the step ended, alone (close_step.lua) or in its last save (save_end.lua).

What is left here is what every transition shares: the loaded scripts, a result's sealing, and the
guarded writes (guarded.lua) a step makes on the side: a start counted, the session parked, a run
leaving the running index.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from lousho.fleet.keys import FleetKeys
from lousho.stores.codec import result_place
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import load_script, redis_errors, text

__all__ = ["FleetScripts"]


@dataclass
class FleetScripts:
    """The worker's scripts, registered once per process (`FleetRuntime.scripts`)."""

    store: RedisStore

    def __post_init__(self) -> None:
        self.client: redis.Redis = self.store.client
        self.keys = FleetKeys(self.store)
        self.open_step = load_script(self.client, "lousho.worker:open_step")
        self.call_begin = load_script(self.client, "lousho.worker:call_begin")
        self.call_commit = load_script(self.client, "lousho.worker:call_commit")
        self.close_step = load_script(self.client, "lousho.worker:close_step")
        self.save_end = load_script(self.client, "lousho.worker:save_end")
        self.commit_fold = load_script(self.client, "lousho.worker:commit_fold")
        self.guarded = load_script(self.client, "lousho.worker:guarded")
        # Whether sessions' keys expire (`RedisStore(ttl_s=...)`): only then do the scripts ask a head's TTL for
        # the fleet keys they create to follow it (issue #30: a command less a step otherwise). A fleet's workers
        # share one store configuration.
        self.expiring = "1" if self.store.ttl_s is not None else "0"

    def seal(self, session_id: str, field: str, result_json: str) -> str | bytes:
        """A tool result as the results hash keeps it: encoded by the store's codec (issue #17), bound to
        its session and call (issue #31)."""
        return self.store.codec.encode_json(result_json, result_place(session_id, field))

    def unseal(self, session_id: str, field: bytes | str, stored: bytes) -> bytes:
        """A result as the results hash keeps it, decoded (`seal`'s inverse)."""
        place = result_place(session_id, text(field))
        return self.store.codec.decode(stored, place) if isinstance(stored, bytes) else stored

    def count(self, session_id: str, epoch: str, attempt_field: str, by: int = 1) -> int:
        """Count `by` more starts of `attempt_field` (the field goes when it reaches 0); -1 when the
        session is another incarnation than `epoch` now (nothing counted)."""
        keys = [self.keys.epoch(session_id), self.keys.attempts(session_id)]
        with redis_errors(self.client, f"count a start of {attempt_field!r} of session {session_id!r}"):
            return int(self.guarded(keys=keys, args=[epoch, "count", attempt_field, by]))

    def park(self, session_id: str, epoch: str | None, reason: str) -> bool:
        """Mark the session parked and take it out of the in-flight index, if it is still `epoch`
        (None: the step could not read the session, a damaged checkpoint: what it found is now)."""
        keys = [self.keys.epoch(session_id), self.keys.parked_of(session_id), self.store.keys.inflight_of(session_id)]
        with redis_errors(self.client, f"park session {session_id!r}"):
            if epoch is None:
                self.client.hset(self.keys.parked_of(session_id), session_id, reason)
                self.client.zrem(self.store.keys.inflight_of(session_id), session_id)
                return True
            return int(self.guarded(keys=keys, args=[epoch, "park", session_id, reason, session_id])) == 1

    def leave_running(self, entry: str) -> None:
        """The run's entry leaves the running index (a task that ends without committing)."""
        with redis_errors(self.client, "update the fleet's running index"):
            session_id = entry.split("|", 3)[2]  # '<host>|<pid>|<session>|<field>': its shard (issue #18)
            self.client.zrem(self.keys.running_of(session_id), entry)
