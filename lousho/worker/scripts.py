"""A step's round trips to Redis, each one Lua script (lua/*.lua): what a fleet hop costs.

A model turn hop is three round trips (`begin_step`, the checkpoint save, `end_step`); a tool
call hop five (the checkpoint read, `begin_call`, `commit_call`, the save, `end_step`), plus the
broker's. Each script says in its header what it does; this module calls them and types their
replies (issue #9: fleet per-step latency).
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from lousho.checkpoint import Checkpoint
from lousho.errors import CorruptCheckpointError, SessionSupersededError
from lousho.fleet.keys import FleetKeys
from lousho.stores.codec import result_place
from lousho.stores.redis import RedisStore
from lousho.stores.redis_checkpoints import AndThen
from lousho.stores.redis_common import load_script, redis_errors, text
from lousho.stores.segments import Known
from lousho.worker.leases import Lease

__all__ = ["Begun", "CallBegun", "CallState", "Ending", "FleetScripts", "sends", "turn_results"]


def sends(reply: list[Any]) -> list[bool]:
    """end_step.lua's reply: per call, whether it is to be sent (pushed already if it had a message)."""
    return [bool(flag) for flag in reply[1:]]


def turn_results(raw: dict[str, bytes], turn: int) -> dict[str, Any]:
    """The committed results of tool turn `turn` in the results hash `raw`, by call id."""
    prefix = f"{turn}:"
    return {field[len(prefix) :]: json.loads(value) for field, value in raw.items() if field.startswith(prefix)}


@dataclass(frozen=True)
class Begun:
    """What a step read as it took the session's lease (one script, so all of it at one moment)."""

    parked: bool
    aborted: bool
    attempts: int
    """Starts of the model turn counted with the lease (0 when none was)."""
    results: dict[str, bytes]
    """The committed results hash, field -> JSON (`turn_results` picks one turn's)."""
    checkpoint: Checkpoint | None
    epoch: str
    """The session's incarnation (epoch.lua): every later write of the step checks it is still this."""


@dataclass(frozen=True)
class Ending:
    """A step's end as end_step.lua takes it: the turn's state to drop, the calls to mark and send,
    the next model turn's message. A message is '' when the worker sends that task itself."""

    queue_key: str
    """The broker's queue list the messages go to (`Outbox.encode`)."""
    epoch: str
    """The incarnation the step worked for: if the session is another one now, the end only releases."""
    turn_complete: bool = False
    redispatch: bool = False
    calls: Sequence[tuple[str, str]] = ()
    """Per call: its field (`result_field`) and its message."""
    next_message: str = ""
    ack: tuple[str, str, str] | None = None
    """kombu's unacked hash, its index and the delivery tag of the message the step ran for: acknowledged with the
    end (end_step.lua; `Outbox.ack_keys`). None: Celery acknowledges it as the task returns."""


class CallState(enum.Enum):
    """Where a tool call's task finds the call as it tries the call's lease (call_begin.lua)."""

    COMMITTED = "committed"
    """Its result is committed already: only the fold may be left to do."""
    BUSY = "busy"
    """Someone else holds its lease: it runs elsewhere."""
    STARTED = "started"
    """The lease is ours and this start is counted: run it."""


@dataclass(frozen=True)
class CallBegun:
    """What a tool call's task read as it tried the call's lease (`begin_call`)."""

    state: CallState
    starts: int
    """With `STARTED`: the starts counted against the call, this one included (poison detection)."""
    aborted: bool
    checkpoint: Checkpoint | None
    epoch: str
    """The session's incarnation as the call began (epoch.lua)."""
    shared: int = 0
    """Starts of the call whose run died together with other sessions' runs (not counted in `starts`)."""


@dataclass
class FleetScripts:
    """The worker's scripts, registered once per process."""

    store: RedisStore

    def __post_init__(self) -> None:
        self.client: redis.Redis = self.store.client
        self.keys = FleetKeys(self.store)
        self._begin = load_script(self.client, "lousho.worker:open_step")
        self._call_begin = load_script(self.client, "lousho.worker:call_begin")
        self._commit = load_script(self.client, "lousho.worker:call_commit")
        self._end = load_script(self.client, "lousho.worker:close_step")
        self._save_end = load_script(self.client, "lousho.worker:save_end")
        self._commit_fold = load_script(self.client, "lousho.worker:commit_fold")
        self._guarded = load_script(self.client, "lousho.worker:guarded")
        # Whether sessions' keys expire (`RedisStore(ttl_s=...)`): only then do the scripts ask a head's TTL for
        # the fleet keys they create to follow it (issue #30: a command less a step otherwise). A fleet's workers
        # share one store configuration.
        self._expiring = "1" if self.store.ttl_s is not None else "0"

    def _seal(self, session_id: str, field: str, result_json: str) -> str | bytes:
        """A tool result as the results hash keeps it: encoded by the store's codec (issue #17), bound to
        its session and call (issue #31)."""
        return self.store.codec.encode_json(result_json, result_place(session_id, field))

    def _open(self, session_id: str, field: bytes | str, stored: bytes) -> bytes:
        place = result_place(session_id, text(field))
        return self.store.codec.decode(stored, place) if isinstance(stored, bytes) else stored

    def begin_step(self, session_id: str, lease: Lease, attempt_field: str = "") -> Begun | None:
        """Take the session's lease and read the step's state; None when someone else holds it."""
        keys, args, known = self._begin_parts(session_id, lease, attempt_field)
        started = time.monotonic()
        with redis_errors(self.client, f"take the lease of session {session_id!r}"):
            reply = self._begin(keys=keys, args=args)
        try:
            return self._begun(session_id, lease, reply, started, known)
        except CorruptCheckpointError:
            self._undo_begin(session_id, lease, attempt_field)
            raise

    def begin_call(self, session_id: str, field: str, lease: Lease, entry: str) -> CallBegun:
        """Read the checkpoint and the abort flag; unless the call's result is committed, take the
        call's lease and count this start. A damaged checkpoint is handed back untouched."""
        known = self.store.checkpoints.reader.cached(session_id)
        keys = [
            self.keys.results(session_id),
            lease.key,
            self.keys.attempts(session_id),
            self.keys.abort(session_id),
            *self.store.checkpoints.reader.read_keys(session_id),
            self.keys.epoch(session_id),
            self.keys.running_of(session_id),
        ]
        args: list[str | int] = [field, lease.token, lease.ttl_ms, known.writer if known else "", entry, self._expiring]
        started = time.monotonic()
        with redis_errors(self.client, f"take the lease of call {field!r} of session {session_id!r}"):
            reply = self._call_begin(keys=keys, args=args)
        starts, epoch = int(reply[0]), text(reply[3])
        state = CallState.STARTED if starts > 0 else CallState.BUSY if starts == 0 else CallState.COMMITTED
        lease.held, lease.confirmed_at = state is CallState.STARTED, started
        if lease.held:  # the lease's token names the incarnation it is held for (call_begin.lua)
            lease.token = f"{lease.token}@{epoch}"
        try:
            checkpoint = self.store.checkpoints.reader.from_reply(session_id, reply[2], known)
        except CorruptCheckpointError:
            self.undo_call(session_id, field, lease, (epoch, entry))
            raise
        return CallBegun(state, max(starts, 0), bool(reply[1]), checkpoint, epoch, shared=int(reply[4]))

    def undo_call(self, session_id: str, field: str, lease: Lease, run: tuple[str, str]) -> None:
        """Take back `begin_call` (the call does not run after all: recorded, stale, not approved).
        `run`: the call's epoch and its entry in the running index."""
        if lease.held:
            self.count(session_id, run[0], f"call:{field}", -1)
            self.leave_running(run[1])
            lease.release()

    def commit_call(
        self, session_id: str, field: str, result_json: str, call_lease: Lease, lease: Lease, run: tuple[str, str]
    ) -> Begun | None:
        """Commit the call's result (first writer wins), release its lease, then `begin_step`.
        `run`: the call's epoch and its entry in the running index. Raises `SessionSupersededError`
        when the session is another incarnation than that epoch now."""
        keys, args, known = self._begin_parts(session_id, lease, "")
        commit_keys = [
            keys[4],
            call_lease.key,
            *keys[:4],
            *keys[5:],
            self.keys.running_of(session_id),
        ]  # call_commit.lua's order
        commit_args = [field, self._seal(session_id, field, result_json), call_lease.token, run[0], *args, run[1]]
        started = time.monotonic()
        with redis_errors(self.client, f"commit the result of call {field!r} of session {session_id!r}"):
            reply, acked = self.store.replica_ack.run(self.client, self._commit, commit_keys, commit_args)
        call_lease.held = False
        if int(reply[0]) < 0:
            raise SessionSupersededError(session_id, f"the result of call {field!r}")
        # a result a failover may lose is not done: the step fails, the session's lease expires (issue #18)
        self.store.replica_ack.check(self.client, acked, f"the result of call {field!r} of session {session_id!r}")
        try:
            return self._begun(session_id, lease, reply, started, known)
        except CorruptCheckpointError:
            self._undo_begin(session_id, lease, "")
            raise

    def results(self, session_id: str) -> dict[str, bytes]:
        """The committed results hash as it is now (`turn_results` picks one turn's)."""
        with redis_errors(self.client, f"read the committed results of session {session_id!r}"):
            raw = self.client.hgetall(self.keys.results(session_id))
        return {text(field): self._open(session_id, field, value) for field, value in raw.items()}  # type: ignore[union-attr]

    def end_step(self, session_id: str, lease: Lease, ending: Ending) -> list[bool]:
        """Mark the calls, drop a completed turn's state, release the lease, push the messages
        (close_step.lua); per call, whether it is to be sent."""
        keys, args = self._end_parts(session_id, ending)
        with redis_errors(self.client, f"release the lease of session {session_id!r}"):
            reply = self._end(keys=[lease.key, *keys], args=[lease.token, *args])
        lease.held = False
        return sends(reply)

    def save_and_end(self, session_id: str, ending: Ending) -> AndThen:
        """`end_step` in the round trip of the step's last save (`RedisCheckpointStore.save(and_then=...)`);
        its reply goes through `sends`."""
        keys, args = self._end_parts(session_id, ending)
        return AndThen(script=self._save_end, keys=keys, args=args)

    def commit_fold(
        self, session_id: str, field: str, result_json: str, call_lease: Lease, lease: Lease, ending: Ending, entry: str
    ) -> AndThen:
        """commit_fold.lua after a save fenced on `lease` (not taken yet: the script takes it)."""
        keys = [
            self.keys.dispatched(session_id),
            self.keys.results(session_id),
            self.keys.attempts(session_id),
            self._queue_key(session_id, ending),
            call_lease.key,
            self.keys.parked_of(session_id),
            self.keys.abort(session_id),
            self.keys.epoch(session_id),
            self.keys.running_of(session_id),
            *(ending.ack[:2] if ending.ack else ()),
        ]
        args: list[str | int | bytes] = [
            *(
                field,
                self._seal(session_id, field, result_json),
                call_lease.token,
                lease.ttl_ms,
                ending.next_message,
                ending.epoch,
                entry,
                ending.ack[2] if ending.ack else "",
            )
        ]
        return AndThen(script=self._commit_fold, keys=keys, args=args)

    def leave_running(self, entry: str) -> None:
        """The run's entry leaves the running index (a task that ends without committing)."""
        with redis_errors(self.client, "update the fleet's running index"):
            session_id = entry.split("|", 3)[2]  # '<host>|<pid>|<session>|<field>': its shard (issue #18)
            self.client.zrem(self.keys.running_of(session_id), entry)

    def commit_result(self, session_id: str, epoch: str, field: str, result_json: str) -> bool:
        """Commit a call's one result (first writer wins) while the session is incarnation `epoch`."""
        keys = [self.keys.epoch(session_id), self.keys.results(session_id)]
        args = [epoch, "commit", field, self._seal(session_id, field, result_json)]
        with redis_errors(self.client, f"commit the result of call {field!r} of session {session_id!r}"):
            reply, acked = self.store.replica_ack.run(self.client, self._guarded, keys, args)
        self.store.replica_ack.check(self.client, acked, f"the result of call {field!r} of session {session_id!r}")
        return int(reply) == 1

    def count(self, session_id: str, epoch: str, attempt_field: str, by: int = 1) -> int:
        """Count `by` more starts of `attempt_field` (the field goes when it reaches 0); -1 when the
        session is another incarnation than `epoch` now (nothing counted)."""
        keys = [self.keys.epoch(session_id), self.keys.attempts(session_id)]
        with redis_errors(self.client, f"count a start of {attempt_field!r} of session {session_id!r}"):
            return int(self._guarded(keys=keys, args=[epoch, "count", attempt_field, by]))

    def park(self, session_id: str, epoch: str | None, reason: str) -> bool:
        """Mark the session parked and take it out of the in-flight index, if it is still `epoch`
        (None: the step could not read the session, a damaged checkpoint: what it found is now)."""
        keys = [self.keys.epoch(session_id), self.keys.parked_of(session_id), self.store.keys.inflight_of(session_id)]
        with redis_errors(self.client, f"park session {session_id!r}"):
            if epoch is None:
                self.client.hset(self.keys.parked_of(session_id), session_id, reason)
                self.client.zrem(self.store.keys.inflight_of(session_id), session_id)
                return True
            return int(self._guarded(keys=keys, args=[epoch, "park", session_id, reason, session_id])) == 1

    def _queue_key(self, session_id: str, ending: Ending) -> str:
        """The broker's queue for the outbox's pushes; on a Redis Cluster store (issue #18) the outbox is off
        (the broker is another server: no message to push, nor a mark holding one), and a key of the session's
        own slot stands in, never read or written, so the script still touches one slot."""
        return self.store.keys.session_key(session_id, "outbox") if self.store.keys.per_slot else ending.queue_key

    def _end_parts(self, session_id: str, ending: Ending) -> tuple[list[str], list[str | int]]:
        """end_step.lua's keys after the lease (dispatched, results, attempts, the queue, the epoch, a
        call lease per call, kombu's unacked hash and index with an ack) and its args after the token (the epoch,
        clear, redispatch, the next message, the delivery tag or '', per call its field and message)."""
        keys = [
            self.keys.dispatched(session_id),
            self.keys.results(session_id),
            self.keys.attempts(session_id),
            self._queue_key(session_id, ending),
            self.keys.epoch(session_id),
            *(self.keys.call_lease(session_id, field.split(":", 1)[1]) for field, _ in ending.calls),
            *(ending.ack[:2] if ending.ack else ()),
        ]
        args: list[str | int] = [
            ending.epoch,
            "1" if ending.turn_complete else "0",
            "1" if ending.redispatch else "0",
            ending.next_message,
            ending.ack[2] if ending.ack else "",
            *(part for call in ending.calls for part in call),
        ]
        return keys, args

    def _begin_parts(
        self, session_id: str, lease: Lease, attempt_field: str
    ) -> tuple[list[str], list[Any], Known | None]:
        """open_step.lua's KEYS and ARGV, and the cached save whose writer id they name."""
        known = self.store.checkpoints.reader.cached(session_id)
        keys = [
            lease.key,
            self.keys.parked_of(session_id),
            self.keys.abort(session_id),
            self.keys.attempts(session_id),
            self.keys.results(session_id),
            *self.store.checkpoints.reader.read_keys(session_id),
            self.keys.epoch(session_id),
        ]
        args = [lease.token, lease.ttl_ms, session_id, attempt_field, known.writer if known else "", self._expiring]
        return keys, args, known

    def _undo_begin(self, session_id: str, lease: Lease, attempt_field: str) -> None:
        """A damaged checkpoint is left exactly as it was, its session's keys included: the start
        counted with the lease is taken back (no turn started), and the lease released."""
        if attempt_field:
            key = self.keys.attempts(session_id)
            with redis_errors(self.client, f"take back a start counted for {attempt_field!r} of {session_id!r}"):
                if int(cast(int, self.client.hincrby(key, attempt_field, -1))) <= 0:
                    self.client.hdel(key, attempt_field)
        lease.release()

    def _begun(
        self, session_id: str, lease: Lease, reply: list[Any], started: float, known: Known | None
    ) -> Begun | None:
        if not reply[0]:
            return None
        lease.held, lease.confirmed_at = True, started
        flat = reply[4]
        return Begun(
            parked=bool(reply[1]),
            aborted=bool(reply[2]),
            attempts=int(reply[3]),
            results={text(flat[i]): self._open(session_id, flat[i], flat[i + 1]) for i in range(0, len(flat), 2)},
            checkpoint=self.store.checkpoints.reader.from_reply(session_id, reply[5], known),
            epoch=text(reply[6]),
        )
