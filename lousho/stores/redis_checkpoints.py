"""Checkpoints in Redis: a small head per save, the transcript stored once, the history as a list.

Layout per session (all under one hash tag, so one Cluster slot):

- `<prefix>{s}:msgs`: every message ever saved, as JSON, appended with RPUSH and never rewritten.
- `<prefix>{s}:cp`: the latest head: the checkpoint without its messages, behind a store header
  `{"$store":{"f":1,"v":<version>,"w":<writer id>,"t":<ms>,"s":[[start,count],...]}, ...}` whose
  segments name the transcript as slices of `msgs` (one slice, unless a save rewrote the transcript).
- `<prefix>{s}:hist`: the history ring (LPUSH + LTRIM): each entry is such a head, so an entry does
  not grow with the transcript, and loading it gives the checkpoint exactly as it was at that save.

A save sends only the messages the stored transcript lacks: the store remembers, per session, the
version, writer id and messages of the last checkpoint it saved or loaded. The save script checks
the version (the fencing token) and that the stored head is still the one remembered; when it is
not (another process wrote, the cache was cold), the writer sends the whole transcript and the
script appends only what differs from the stored one.

A read by the process that holds the transcript gets back only the head, but never on trust
(issue #21): each head carries `h`, a digest chained over its messages as their writers sent them
(a save extends it by its new messages alone), and the read script answers from the cache only
when the list still hashes to it. A message damaged since (a raw write) makes the script send the
transcript, and the read raises `CorruptCheckpointError` as in any other process, before the
caller builds a save on it. The check costs the server a SHA-1 of the transcript per such read,
no round trip and no transcript bytes on the wire (docs/stores.md has the figures).

The in-flight index `<prefix>inflight` (session -> deadline, Redis server time in ms) holds the
sessions a worker should be moving: a save of an 'in-progress' checkpoint adds or refreshes it
(deadline = now + `inflight_deadline_ms`, given at construction); a save of a 'finished' or
'awaiting-approval' one removes it (nothing runs until a human decides), as does `delete`. That
upkeep is here because it is atomic with the save; reading and moving the index is the fleet's
(`lousho.fleet.inflight.InflightIndex`, issue #14). On a Redis Cluster the index is sharded by slot and a
session's entry lives in the shard of the session's own slot (`RedisKeys.inflight_of`), so a save still
touches one slot (issue #18).

Messages of a transcript that a save rewrote (rare: a patched fork into the same session) stay in
`msgs` until the session is deleted; older history entries may still refer to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import redis
from redis.commands.core import Script

from lousho.checkpoint import Checkpoint, HistoryEntry, validate_session_id
from lousho.errors import CheckpointConflictError, CorruptCheckpointError, LeaseLostError
from lousho.messages import Message
from lousho.stores.codec import PLAIN, PayloadCodec, message_place
from lousho.stores.head_fields import HeadFields, head_fields
from lousho.stores.listing import Listing, read_each
from lousho.stores.redis_common import RedisKeys, load_script, redis_errors, text
from lousho.stores.redis_reader import CheckpointReader
from lousho.stores.redis_records import MessagePool, decode_record, status_of
from lousho.stores.redis_replication import NO_REPLICA_ACK, ReplicaAck
from lousho.stores.reseal import reseal_redis_session
from lousho.stores.segments import Known, SessionCache, common_prefix, new_writer_id

__all__ = ["AndThen", "CheckpointReader", "LeaseLostError", "RedisCheckpointStore", "SaveSkipped"]


@dataclass(frozen=True)
class AndThen:
    """A caller's script to run right after a save, in the same round trip (`save(and_then=...)`).

    Its source calls `save_checkpoint()` first (`-- needs: save_checkpoint`), then does its own part
    only when the save answered 'ok' or 'done', and replies `{save reply}` or `{save reply, its own}`.
    It gets the save's KEYS (with the fence key at 5) and ARGV, then `keys` and `args`; the save's
    ARGV[11] says how many messages follow its ARGV[12], so its own ARGV start at 13 + that count. It may also
    decide not to save, before writing anything of the save's: it replies `{{'skipped', why}}` and
    `save` raises `SaveSkipped`."""

    script: Script
    keys: list[str]
    args: Sequence[str | int | bytes]


class SaveSkipped(Exception):
    """A `save(and_then=...)` whose script chose not to save (`why` says what it found)."""

    def __init__(self, session_id: str, why: str) -> None:
        super().__init__(f"the save of session {session_id!r} was skipped: {why}")
        self.why = why


@dataclass(frozen=True)
class _SaveRequest:
    session_id: str
    checkpoint: Checkpoint
    body: tuple[str, str]
    """The head's JSON and its history entry's ('' = the head's)."""
    writer_id: str
    fence: tuple[str, str] | None
    and_then: AndThen | None


class RedisCheckpointStore:
    """`CheckpointStore` with history on Redis; see the module docstring for the layout."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        *,
        history_limit: int = 50,
        ttl_ms: int = 0,
        inflight_deadline_ms: int = 120_000,
        cache_size: int = 1024,
        reader: CheckpointReader | None = None,
        codec: PayloadCodec = PLAIN,
        replica_ack: ReplicaAck = NO_REPLICA_ACK,
    ) -> None:
        """`reader`: share another store's cache (`RedisStore.with_inflight_deadline`); else a new one.
        `codec`: encodes heads' secret fields and messages (issue #17); the reader decodes with it.
        `replica_ack`: each save waits for that many replicas (`WAIT`), else `SaveNotReplicatedError` (#18)."""
        self.client = client
        self.keys = keys
        self.history_limit = history_limit
        self.ttl_ms = ttl_ms
        self._inflight_deadline_ms = inflight_deadline_ms
        self.codec = codec
        self.replica_ack = replica_ack
        self.reader = reader or CheckpointReader(keys, SessionCache(cache_size), codec)
        self._cache = self.reader.cache
        encoder = client.get_encoder()
        self._encoding: tuple[str, str] = (encoder.encoding, encoder.encoding_errors)
        self._save = load_script(client, "save")
        self._load = load_script(client, "load")
        self._history = load_script(client, "history")

    # -- save ------------------------------------------------------------------------------

    def save(
        self,
        session_id: str,
        checkpoint: Checkpoint,
        *,
        fence: tuple[str, str] | None = None,
        and_then: AndThen | None = None,
        before: Callable[[Any], int] | None = None,
    ) -> Any:
        """Compare-and-set `checkpoint` as the session's latest (version must be stored + 1).

        `fence=(lease_key, token)`: the save also requires that key to hold that token, checked in
        the same script, so a worker whose lease expired and was taken over writes nothing
        (`LeaseLostError`). The lease key must be one of the session's keys (`keys.session_key`).
        `and_then` (fenced saves only): a script of the caller's that runs in the same round trip,
        only if the save did; its reply is returned. `before(pipeline) -> n`: queues n commands of the caller's
        ahead of the save's script, in the same round trip; their replies are dropped (issue #34: a step's
        pending events reach the session's stream just before its save, at no round trip of their own).
        """
        validate_session_id(session_id)
        if fence is not None and not fence[0].startswith(self.keys.session_key(session_id, "")):
            raise ValueError(f"fence key {fence[0]!r} is not a key of session {session_id!r}")
        if and_then is not None and fence is None:
            raise ValueError("save(and_then=...) needs fence=: the script after the save is given the lease key")
        bodies = self.codec.seal_record(checkpoint, session_id)
        body = (bodies[0], "" if bodies[1] == bodies[0] else bodies[1])  # '': the same text (no key, #31)
        writer_id = new_writer_id()
        known = self._cache.get(session_id)
        if self.codec.active and checkpoint.version > 1 and (known is None or known.version != checkpoint.version - 1):
            # Issue #17: encoded messages never equal byte for byte, so the script cannot find the stored
            # prefix of a whole transcript; a read first fills the cache (the save then sends only new
            # messages) and raises `PayloadKeyError` on a wrong key before anything is written. A first save
            # (version 1) has nothing stored to build on: a stored head makes the script refuse it.
            self.load(session_id)
            known = self._cache.get(session_id)
        request = _SaveRequest(session_id, checkpoint, body, writer_id, fence, and_then)
        with redis_errors(self.client, f"save session {session_id!r}"):
            if known is not None and known.version == checkpoint.version - 1:
                keep = common_prefix(known.messages, checkpoint.messages)
                reply, after = self._run_save(request, known.writer, keep, before)
                if reply[0] == "resync":  # what `before` queued went with the first try
                    reply, after = self._run_save(request, "", 0)
            else:
                reply, after = self._run_save(request, "", 0, before)
        self._settle(session_id, checkpoint, writer_id, reply, fence)
        return after

    def _run_save(
        self, request: _SaveRequest, expected: str, keep: int, before: Callable[[Any], int] | None = None
    ) -> tuple[list[Any], Any]:
        """One save script call; `expected=''` sends the whole transcript (the script dedups it)."""
        checkpoint, fence, and_then = request.checkpoint, request.fence, request.and_then
        first = keep if expected else 0
        new = checkpoint.messages[first:]
        session_id = request.session_id
        args: list[str | int | bytes] = [
            checkpoint.version,
            expected,
            keep,
            request.writer_id,
            request.body[0],
            self.history_limit,
            self.ttl_ms,
            self._deadline_for(checkpoint),
            request.session_id,
            fence[1] if fence else "",
            len(new),
            request.body[1],
            *self._message_texts(session_id, first, new),
        ]
        keys = [
            *self.keys.session_keys(request.session_id),
            self.keys.inflight_of(request.session_id),
            *([fence[0]] if fence else []),
        ]
        keys_sent, args_sent = self._wire(keys), self._wire(args)
        if and_then is None:
            reply, acked = self.replica_ack.run(self.client, self._save, keys_sent, args_sent, before)
            after = None
        else:
            both, acked = self.replica_ack.run(
                self.client, and_then.script, [*keys_sent, *and_then.keys], [*args_sent, *and_then.args], before
            )
            reply, after = both[0], (both[1] if len(both) > 1 else None)
        reply = [text(part) if isinstance(part, bytes) else part for part in reply]
        if reply[0] in ("ok", "done") and acked < self.replica_ack.min_replicas:
            self._cache.drop(request.session_id)  # whether it stands is unknown: the next save sends it all
            self.replica_ack.check(self.client, acked, f"the save of session {request.session_id!r}")
        return reply, after

    def _message_texts(self, session_id: str, first: int, new: Sequence[Message]) -> list[str | bytes]:
        """The JSON of the new messages, from transcript index `first` on, encoded each bound to its place (issue
        #31); as they are when the codec is off, without making the places it would not use (issue #30)."""
        if not self.codec.active:
            return [message.model_dump_json() for message in new]
        return [
            self.codec.encode_json(message.model_dump_json(), message_place(session_id, first + i))
            for i, message in enumerate(new)
        ]

    def _wire(self, values: Sequence[str | int | bytes]) -> list[str | int | bytes]:
        """`values` as the bytes redis-py would send, encoded here in one pass: its encoder's type checks
        per argument cost a save about as much as the rest of packing the command (issue #20)."""
        encoding, errors = self._encoding
        return [
            value
            if isinstance(value, bytes)
            else (value if isinstance(value, str) else str(value)).encode(encoding, errors)
            for value in values
        ]

    @property
    def inflight_deadline_ms(self) -> int:
        """How long a save keeps an 'in-progress' session in the in-flight index (0: the index is off)."""
        return self._inflight_deadline_ms

    def _deadline_for(self, checkpoint: Checkpoint) -> int:
        """In-flight action: a deadline for running work, 0 (remove) otherwise, -1 when the index is off."""
        if self._inflight_deadline_ms <= 0:
            return -1
        return self._inflight_deadline_ms if checkpoint.status == "in-progress" else 0

    def _settle(
        self, session_id: str, checkpoint: Checkpoint, writer_id: str, reply: list[Any], fence: tuple[str, str] | None
    ) -> None:
        """Turn the script's reply into the cache update or the typed error."""
        outcome = reply[0]
        if outcome in ("ok", "done"):
            self._cache.put(session_id, Known(checkpoint.version, writer_id, tuple(checkpoint.messages)))
            return
        if outcome == "skipped":  # the and_then script chose not to save: nothing was written
            raise SaveSkipped(session_id, str(reply[1]) if len(reply) > 1 else "")
        self._cache.drop(session_id)
        if outcome == "fenced" and fence is not None:
            raise LeaseLostError(session_id, fence[0], checkpoint.version - 1)
        if outcome == "conflict":
            found = int(reply[1])
            raise CheckpointConflictError(session_id, checkpoint.version - 1, None if found < 0 else found)
        if outcome == "corrupt":
            raise CorruptCheckpointError(session_id, f"{reply[1]}; the save was refused")
        raise CorruptCheckpointError(session_id, f"the save script answered {reply!r}; the save was refused")

    def forget_transcript(self, session_id: str) -> None:
        """Drop what this process remembers of the session's last saved transcript (what a save builds on). A
        worker calls it when the session stops (finished, aborted, parked): its next save is a client's, whose
        writer makes the entry useless, and a worker process would otherwise hold up to `cache_size` transcripts
        of sessions long over (issue #29)."""
        self._cache.drop(session_id)

    def set_aside_transcript(self, session_id: str, keep_s: float) -> None:
        """The worker's step of the session is over: keep what this process remembers of its transcript `keep_s`
        more, for the session's next step if it runs here, then forget it (issue #29: `SessionCache.set_aside`)."""
        self._cache.set_aside(session_id, keep_s)

    # -- load ------------------------------------------------------------------------------

    def load(self, session_id: str) -> Checkpoint | None:
        """The latest checkpoint, or None for an unknown session; a damaged one raises and stays."""
        validate_session_id(session_id)
        known = self.reader.cached(session_id)
        with redis_errors(self.client, f"load session {session_id!r}"):
            reply = self._load(keys=[*self.reader.read_keys(session_id)], args=[known.writer if known else ""])
        return self.reader.from_reply(session_id, reply, known)

    # -- history ---------------------------------------------------------------------------

    def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry]:
        """The newest `limit` saves (all kept when None), newest first, each as it was saved."""
        validate_session_id(session_id)
        if limit is not None and limit <= 0:
            return []
        with redis_errors(self.client, f"read the history of session {session_id!r}"):
            reply = self._history(
                keys=[self.keys.history(session_id), self.keys.messages(session_id)],
                args=[-1 if limit is None else limit],
            )
        if text(reply[0]) == "corrupt":
            raise CorruptCheckpointError(session_id, text(reply[1]))
        count = int(reply[1])
        entries, pool = reply[2 : 2 + count], MessagePool(session_id, reply[2 + count :], self.codec)
        result = []
        for raw in entries:
            checkpoint, meta = decode_record(session_id, raw, pool.take, self.codec, history=True)
            if meta is not None and isinstance(meta.get("h"), str) and pool.digest(meta["s"]) != meta["h"]:
                raise CorruptCheckpointError(  # issue #31: as read_checkpoint.lua checks a head
                    session_id,
                    f"the messages of its history entry of version {checkpoint.version} do not hash to the "
                    "digest the entry carries: one was changed, moved or removed after it was saved",
                )
            saved_at = datetime.fromtimestamp(int(meta["t"]) / 1000, UTC).isoformat() if meta else ""
            result.append(
                HistoryEntry(
                    step=checkpoint.step_index, saved_at=saved_at, status=checkpoint.status, checkpoint=checkpoint
                )
            )
        return result

    # -- delete, sessions -------------------------------------------------

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        """Forget the session; with `keep_history` the ring and the messages it refers to stay.

        Every key of the session goes, the fleet's too (issue #16): its run keys, its calls' leases,
        and its entries in the fleet's indexes (in-flight, running, parked). Approvals are the
        approval store's: their keys are named by approval id, not by session."""
        validate_session_id(session_id)
        head, messages, history = self.keys.session_keys(session_id)
        with redis_errors(self.client, f"delete session {session_id!r}"):
            runs = self._running_entries(session_id)
            call_leases = [self.keys.session_key(session_id, f"lease:{call_id}") for call_id in runs.values()]
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(head) if keep_history else pipe.delete(head, messages, history)
            pipe.delete(*self.keys.run_keys(session_id), *call_leases)
            if runs:
                pipe.zrem(self.keys.running_of(session_id), *runs)
            pipe.zrem(self.keys.inflight_of(session_id), session_id)
            pipe.hdel(self.keys.parked_of(session_id), session_id)
            pipe.execute()
        self._cache.drop(session_id)

    def _running_entries(self, session_id: str) -> dict[str, str]:
        """The session's entries in the fleet's running index, each with its call's id (a run holds the
        call's lease while it is listed: lousho/worker/running.py)."""
        runs: dict[str, str] = {}
        for raw in cast(list[bytes | str], self.client.zrange(self.keys.running_of(session_id), 0, -1)):
            entry = text(raw)
            parts = entry.split("|", 3)  # '<host>|<pid>|<session>|<turn>:<call id>'
            if len(parts) == 4 and parts[2] == session_id:
                runs[entry] = parts[3].partition(":")[2]
        return runs

    def sessions(self, status: str | None = None) -> Listing[str]:
        """Session ids with a latest checkpoint (SCAN on the prefix), sorted, optionally of one `status`;
        a head whose status cannot be read is named in `skipped` (issue #21)."""
        with redis_errors(self.client, "list sessions"):
            found: dict[str, str] = {}
            for key in self.client.scan_iter(match=self.keys.head_pattern, count=1000):
                name = text(key)
                session = self.keys.session_of_head(name)
                if session is not None:
                    found[session] = name
            if status is None:
                return Listing(sorted(found))
            pipe = self.client.pipeline(transaction=False)  # GETs, not MGET: on a Cluster heads span slots (#18)
            for head in found.values():
                pipe.get(head)
            heads: list[Any] = pipe.execute() if found else []

        def matching(session_id: str, raw: bytes | str) -> str | None:
            stored = status_of(raw)
            if stored is None:
                raise CorruptCheckpointError(session_id, "its head is not a JSON object with a status")
            return session_id if stored == status else None

        stored_heads = sorted((s, raw) for s, raw in zip(found, heads, strict=True) if raw is not None)
        return read_each(stored_heads, matching, what="session")

    def heads(self, session_ids: Sequence[str]) -> Listing[HeadFields]:
        """The plain head fields of each named session that has a checkpoint, in the order given, never opening a
        payload (issue #32: what listings read); a head that cannot be read is named in `skipped`."""
        with redis_errors(self.client, "read session heads"):
            pipe = self.client.pipeline(transaction=False)  # GETs, not MGET: on a Cluster heads span slots (#18)
            for session_id in session_ids:
                pipe.get(self.keys.head(session_id))
            raws: list[Any] = pipe.execute() if session_ids else []
        stored = [(s, raw) for s, raw in zip(session_ids, raws, strict=True) if raw is not None]
        return read_each(stored, head_fields, what="session")

    def reseal(self, session_id: str) -> int:
        """Write every stored value of the session again under the codec's first key, bound to its place (issue
        #31, `lousho reseal`): `lousho.stores.reseal.reseal_redis_session`; how many values."""
        return reseal_redis_session(self, session_id)

    def put_raw(self, session_id: str, raw: str | bytes) -> None:
        """Store a raw value as the latest head (tests of corrupt and foreign records)."""
        with redis_errors(self.client, f"write a raw head for {session_id!r}"):
            self.client.set(self.keys.head(session_id), raw)
        self._cache.drop(session_id)
