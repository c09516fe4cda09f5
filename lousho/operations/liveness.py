"""Whether a session is live on the fleet, and why: what `delete` and `prune` read before they delete anything.

A session is live while a worker moves it:

- a tool call of it runs: its entry is in the fleet's running index and the call's lease is held. An entry alone
  is not enough: a run that died leaves its entry a while (lua/call_begin.lua), and its lease expires;
- a worker holds the session's lease (a model turn, a fold, a step's save);
- it is in the in-flight index with its deadline still ahead, by the Redis server's clock (queued for a worker,
  or between two steps; each heartbeat pushes that deadline while the work goes on). A session whose deadline
  passed is not live: its worker is gone, and the reaper requeues it.

Off a fleet (an SQLite, file or dbm store, a run in process) no worker holds a lease that another process can read:
no session is live there, and `prune` and `delete` treat each one as stopped. Stop a run in process before you
prune its store.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from lousho.operations.target import Target

if TYPE_CHECKING:
    from lousho.stores.redis import RedisStore

__all__ = ["LiveReason", "live_sessions"]


class LiveReason(enum.Enum):
    """Why a session is live, the strongest reason first (a running call holds its session in flight too)."""

    TOOL_CALL_RUNNING = "tool-call-running"
    SESSION_LEASE_HELD = "session-lease-held"
    IN_FLIGHT = "in-flight"

    @property
    def code(self) -> str:
        """The reason as `--json` and the dashboard name it."""
        return self.value

    @property
    def explanation(self) -> str:
        """The reason in a sentence, for the dry run, the refusal and the dashboard."""
        return _EXPLANATIONS[self]


_EXPLANATIONS = {
    LiveReason.TOOL_CALL_RUNNING: "a worker is running one of its tool calls (the call's lease is held)",
    LiveReason.SESSION_LEASE_HELD: "a worker holds its lease (a model turn or a step is under way)",
    LiveReason.IN_FLIGHT: "it is in flight within its deadline (queued for a worker, or between two steps)",
}


def live_sessions(target: Target, session_ids: Sequence[str]) -> dict[str, LiveReason]:
    """Each of `session_ids` that is live on the target's fleet, with why (the others are not named). Empty off a
    fleet: nothing is live there. A few round trips in all, whatever the number of sessions."""
    store = target.fleet_store
    if store is None or not session_ids:
        return {}
    from lousho.fleet.inflight import InflightIndex
    from lousho.fleet.keys import FleetKeys
    from lousho.stores.redis_common import redis_errors
    from lousho.stores.redis_slots import on_shards

    keys, wanted = FleetKeys(store), list(dict.fromkeys(session_ids))
    calls = _running_calls(store, wanted)
    call_leases = [(s, keys.call_lease(s, call)) for s in wanted for call in calls.get(s, [])]
    leases = [keys.lease(s) for s in wanted]
    session_of = dict(zip(leases, wanted, strict=True))  # a session's lease is in its slot, as its in-flight shard
    with redis_errors(store.client, "read whether the sessions are live"):
        now_ms = InflightIndex.of(store, 0).server_time_ms()
        held = on_shards(store.client, [key for _, key in call_leases] + leases, lambda pipe, key: pipe.exists(key))
        deadlines = on_shards(
            store.client,
            leases,
            lambda pipe, key: pipe.zscore(store.keys.inflight_of(session_of[key]), session_of[key]),
        )
    running = {s for (s, _), h in zip(call_leases, held[: len(call_leases)], strict=True) if h}
    leased = {s for s, h in zip(wanted, held[len(call_leases) :], strict=True) if h}
    found: dict[str, LiveReason] = {}
    for session_id, deadline in zip(wanted, deadlines, strict=True):
        if session_id in running:
            found[session_id] = LiveReason.TOOL_CALL_RUNNING
        elif session_id in leased:
            found[session_id] = LiveReason.SESSION_LEASE_HELD
        elif deadline is not None and float(deadline) > now_ms:
            found[session_id] = LiveReason.IN_FLIGHT
    return found


def _running_calls(store: RedisStore, session_ids: list[str]) -> dict[str, list[str]]:
    """Session -> the ids of its calls listed in the fleet's running index ('<host>|<pid>|<session>|<turn>:<call>'),
    each shard of the index read once."""
    from lousho.stores.redis_common import redis_errors, text
    from lousho.stores.redis_slots import on_shards

    wanted = set(session_ids)
    shards = sorted({store.keys.running_of(s) for s in session_ids})
    with redis_errors(store.client, "read the fleet's running index"):
        entries = on_shards(store.client, shards, lambda pipe, shard: pipe.zrange(shard, 0, -1))
    calls: dict[str, list[str]] = {}
    for raw in (entry for shard in cast(list[list[Any]], entries) for entry in shard):
        parts = text(raw).split("|", 3)
        if len(parts) == 4 and parts[2] in wanted:
            calls.setdefault(parts[2], []).append(parts[3].partition(":")[2])
    return calls
