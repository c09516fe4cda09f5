"""Approval snapshots in Redis: one JSON value per id plus an index of the pending ones.

`<prefix>approval:<id>` holds the snapshot; `<prefix>approvals:pending` (a sorted set,
id -> created_at ms) lists the pending ones, so `pending()` reads only those instead of
scanning every approval ever made. `decide` and `reopen` are optimistic: read the snapshot, check its
status, write the change only if the snapshot is still what was read, else read again: of two deciders
racing on one approval exactly one succeeds and the other sees it decided, so the tool never runs twice.
The write is a compare-and-set script (lua/approval_write.lua) rather than MULTI/EXEC under WATCH, so
that with `min_replicas_acked` a `WAIT` follows it on the same connection (issue #18); the snapshot is
encoded here and Lua only compares and stores the bytes (its cjson does not keep every number exactly).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any, cast

import redis

from lousho.approvals import (
    REOPENED,
    ApprovalSnapshot,
    InterruptedAction,
    decided_update,
    decode_snapshot,
    parse_decision,
)
from lousho.errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError
from lousho.stores.codec import PLAIN, PayloadCodec, approval_place
from lousho.stores.listing import Listing, read_each, waiting
from lousho.stores.redis_common import RedisKeys, load_script, redis_errors, text
from lousho.stores.redis_replication import NO_REPLICA_ACK, ReplicaAck

__all__ = ["RedisApprovalStore"]

_MGET_CHUNK = 500


class RedisApprovalStore:
    """`ApprovalStore` on Redis; `decide` is atomic across processes."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        *,
        ttl_ms: int = 0,
        codec: PayloadCodec = PLAIN,
        replica_ack: ReplicaAck = NO_REPLICA_ACK,
    ) -> None:
        self.client = client
        self.keys = keys
        self.ttl_ms = ttl_ms
        self.codec = codec
        """Encodes each snapshot as a whole (issue #17); the pending index keeps only ids and times."""
        self.replica_ack = replica_ack
        """How many replicas confirm each write (`WAIT`), as the checkpoints' saves (issue #18)."""
        self._write = load_script(client, "approval_write")

    def _decode(self, approval_id: str, raw: bytes | str) -> ApprovalSnapshot:
        return decode_snapshot(approval_id, self.codec.decode_text(raw, approval_place(approval_id)))

    def save(self, snapshot: ApprovalSnapshot) -> None:
        """Create or replace the snapshot, and its place in the pending index, in one script call."""
        key, shard = self.keys.approval(snapshot.id), self.keys.pending_approvals_of(snapshot.id)
        with redis_errors(self.client, f"save approval {snapshot.id!r}"):
            _, acked = self.replica_ack.run(
                self.client, self._write, [key, shard], ["*", "", *self._write_args(snapshot)]
            )
        self.replica_ack.check(self.client, acked, f"the save of approval {snapshot.id!r}")

    def load(self, approval_id: str) -> ApprovalSnapshot | None:
        with redis_errors(self.client, f"load approval {approval_id!r}"):
            raw = cast(bytes | str | None, self.client.get(self.keys.approval(approval_id)))
        return None if raw is None else self._decode(approval_id, raw)

    def decide(
        self,
        approval_id: str,
        approved: bool,
        note: str | None,
        action: InterruptedAction | None = None,
        result: Any = None,
    ) -> ApprovalSnapshot:
        """Move a pending approval to approved/rejected; a second decision raises, whoever made it.
        `action`, `result`: an interrupted call's answer (`decided_update`, issue #17)."""
        parse_decision({"id": approval_id, "approved": approved, "note": note})  # strict, before any write (issue #21)

        def change(snapshot: ApprovalSnapshot) -> ApprovalSnapshot:
            if snapshot.status != "pending":
                raise ApprovalAlreadyResolvedError(
                    f"approval {approval_id!r} was already {snapshot.status} at {snapshot.decided_at}; "
                    "it is not run again"
                )
            return snapshot.model_copy(update=decided_update(snapshot, approved, note, action, result))

        decided = self._update(approval_id, change, action=f"decide approval {approval_id!r}")
        if decided is None:
            raise ApprovalNotFoundError(f"no approval {approval_id!r} in this store; check the id and the store")
        return decided

    def reopen(self, approval_id: str) -> None:
        """Put a decided approval back to pending (its decision could not be applied); unknown ids are ignored."""
        self._update(
            approval_id,
            lambda s: s.model_copy(update=REOPENED),
            action=f"reopen approval {approval_id!r}",
        )

    def delete(self, approval_id: str) -> None:
        """Forget an approval and its pending-index entry (its session was deleted); an unknown id is left alone."""
        with redis_errors(self.client, f"delete approval {approval_id!r}"):
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(self.keys.approval(approval_id))
            pipe.zrem(self.keys.pending_approvals_of(approval_id), approval_id)
            pipe.execute()

    def pending(self, session_id: str | None = None) -> Listing[ApprovalSnapshot]:
        """Approvals waiting for a decision, oldest first (optionally of one session); those that cannot
        be read are named in `skipped` (issue #21: one damaged snapshot must not hide the others)."""
        with redis_errors(self.client, "list pending approvals"):
            ids = self._pending_ids()
            raws: list[tuple[str, bytes | str | None]] = []
            for start in range(0, len(ids), _MGET_CHUNK):  # GETs, not MGET: on a Cluster they span slots
                chunk = ids[start : start + _MGET_CHUNK]
                pipe = self.client.pipeline(transaction=False)
                for approval_id in chunk:
                    pipe.get(self.keys.approval(approval_id))
                values = cast(list[bytes | str | None], pipe.execute())
                raws.extend(zip(chunk, values, strict=True))
        found = [(i, raw) for i, raw in raws if raw is not None]
        return waiting(read_each(found, self._decode, what="approval"), session_id)

    def _pending_ids(self) -> list[str]:
        """Pending approval ids over every shard of the index (one key on one Redis; issue #18), oldest first."""
        pipe = self.client.pipeline(transaction=False)
        for shard in self.keys.shards("approvals:pending"):
            pipe.zrange(shard, 0, -1, withscores=True)
        rows = [row for found in pipe.execute() for row in cast(list[tuple[bytes | str, float]], found)]
        return [text(member) for member, _ in sorted(rows, key=lambda row: (row[1], text(row[0])))]

    def reseal(self, session_ids: Collection[str] | None = None) -> int:
        """Write every approval again (only those of `session_ids` when given), pending or decided, sealed under
        the codec's first key to its place (issue #31, `lousho reseal`); how many. Each one is a compare-and-set
        (`rewrite`): a decision made meanwhile is read again, never overwritten. One that does not open raises,
        and it and those after it are left as they were."""
        start = len(self.keys.approval(""))
        with redis_errors(self.client, "list approvals to re-seal"):
            ids = sorted(text(key)[start:] for key in self.client.scan_iter(match=self.keys.approval("*"), count=1000))
        count = 0
        for approval_id in ids:

            def same(stored: ApprovalSnapshot | None) -> ApprovalSnapshot | None:
                chosen = stored is not None and (session_ids is None or stored.session_id in session_ids)
                return stored if chosen else None

            if self.rewrite(approval_id, same, action=f"re-seal approval {approval_id!r}") is not None:
                count += 1
        return count

    def put_raw(self, approval_id: str, raw: str | bytes) -> None:
        """Store `raw` as a pending approval's snapshot without checking it (tests of corrupt records)."""
        with redis_errors(self.client, f"write a raw approval {approval_id!r}"):
            pipe = self.client.pipeline(transaction=True)
            pipe.set(self.keys.approval(approval_id), raw)
            pipe.zadd(self.keys.pending_approvals_of(approval_id), {approval_id: 0})
            pipe.execute()

    def _update(
        self, approval_id: str, change: Callable[[ApprovalSnapshot], ApprovalSnapshot], *, action: str
    ) -> ApprovalSnapshot | None:
        """Read, change and write one snapshot as an optimistic transaction; retried when it raced."""
        return self.rewrite(approval_id, lambda stored: None if stored is None else change(stored), action=action)

    def rewrite(
        self,
        approval_id: str,
        change: Callable[[ApprovalSnapshot | None], ApprovalSnapshot | None],
        *,
        action: str = "rewrite an approval",
    ) -> ApprovalSnapshot | None:
        """Write `change(stored)` (stored: the snapshot, None when there is none) with its place in the pending
        index, as an optimistic transaction retried when it raced; `change` returning None writes nothing.
        The fleet's repair of a record a Cluster failover lost in part uses it (issue #18)."""
        key, shard = self.keys.approval(approval_id), self.keys.pending_approvals_of(approval_id)
        with redis_errors(self.client, action):
            while True:
                raw = cast(bytes | str | None, self.client.get(key))
                changed = change(None if raw is None else self._decode(approval_id, raw))
                if changed is None:
                    return None
                args = ["0" if raw is None else "1", raw or "", *self._write_args(changed)]
                written, acked = self.replica_ack.run(self.client, self._write, [key, shard], args)
                if int(written):  # else it changed since it was read: read it again
                    self.replica_ack.check(self.client, acked, f"the write of approval {approval_id!r}")
                    return changed

    def _write_args(self, snapshot: ApprovalSnapshot) -> list[Any]:
        """ARGV 3-7 of lua/approval_write.lua for `snapshot`."""
        pending = snapshot.status == "pending"
        encoded = self.codec.encode_json(snapshot.model_dump_json(), approval_place(snapshot.id))
        return [encoded, self.ttl_ms, "1" if pending else "0", snapshot.id, _created_ms(snapshot)]


def _created_ms(snapshot: ApprovalSnapshot) -> int:
    try:
        return int(datetime.fromisoformat(snapshot.created_at).timestamp() * 1000)
    except ValueError:
        return 0
