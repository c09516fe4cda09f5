"""What an attacker with write access does to a store's raw values, per backend (issue #31): read and write a
session's message at a position, its head, its history entries and an approval, as the storage holds them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

from lousho.stores.file_folder import file_name
from lousho.stores.mapping_keys import MappingKeys
from lousho.stores.redis_records import chain_step

__all__ = ["Raw", "file_raw", "mapping_raw", "redis_raw", "sql_raw"]


@dataclass
class Raw:
    """A backend's raw values, as `bytes` or `str` the way it keeps them."""

    message: Callable[[str, int], Any]
    set_message: Callable[[str, int, Any], None]
    head: Callable[[str], Any]
    set_head: Callable[[str, Any], None]
    history: Callable[[str], list[Any]]
    """The session's history entries' records, newest first."""
    approval: Callable[[str], Any]
    set_approval: Callable[[str, Any], None]
    dump: Callable[[], Any]
    """Everything stored: compared before and after a refused call."""


def redis_raw(client: redis.Redis, store: Any) -> Raw:
    """RedisStore's keys. A head written, or a message rewritten, gets the head's transcript digest `h`
    recomputed over the list, as an attacker would (it is SHA-1, no key), so the store reads on to the seal."""
    keys, prefix = store.keys, store.prefix

    def set_message(s: str, n: int, raw: Any) -> None:
        client.lset(keys.messages(s), n, raw)
        set_head(s, client.get(keys.head(s)))

    def set_head(s: str, raw: Any) -> None:
        head = json.loads(raw)
        listed = client.lrange(keys.messages(s), 0, -1)
        digest = ""
        for start, count in head["$store"]["s"]:
            for position in range(start, min(start + count, len(listed))):
                digest = chain_step(digest, listed[position])
        head["$store"]["h"] = digest
        client.set(keys.head(s), json.dumps(head, separators=(",", ":")))

    def dump() -> list[tuple[bytes, Any]]:
        out = []
        for key in sorted(client.scan_iter(match=prefix + "*")):
            kind = client.type(key)
            value = client.get(key) if kind == b"string" else client.lrange(key, 0, -1) if kind == b"list" else kind
            out.append((key, value))
        return out

    return Raw(
        message=lambda s, n: client.lindex(keys.messages(s), n),
        set_message=set_message,
        head=lambda s: client.get(keys.head(s)),
        set_head=set_head,
        history=lambda s: list(client.lrange(keys.history(s), 0, -1)),
        approval=lambda a: client.get(keys.approval(a)),
        set_approval=lambda a, raw: client.set(keys.approval(a), raw),
        dump=dump,
    )


def sql_raw(store: Any) -> Raw:
    db = store._db
    messages, checkpoints, history, approvals = db.messages, db.checkpoints, db.history, db.approvals

    def read(query: Any) -> Any:
        with db.engine.connect() as conn:
            return conn.execute(query).scalar()

    def write(statement: Any) -> None:
        with db.engine.begin() as conn:
            conn.execute(statement)

    def dump() -> list[Any]:
        with db.engine.connect() as conn:
            return [sorted(map(tuple, conn.execute(sa.select(t)))) for t in (messages, checkpoints, history, approvals)]

    m, c, a = messages.c, checkpoints.c, approvals.c
    return Raw(
        message=lambda s, n: read(sa.select(m.data).where(m.session_id == s, m.seq == n)),
        set_message=lambda s, n, raw: write(messages.update().where(m.session_id == s, m.seq == n).values(data=raw)),
        head=lambda s: read(sa.select(c.data).where(c.session_id == s)),
        set_head=lambda s, raw: write(checkpoints.update().where(c.session_id == s).values(data=raw)),
        history=lambda s: _sql_history(db, s),
        approval=lambda i: read(sa.select(a.data).where(a.id == i)),
        set_approval=lambda i, raw: write(approvals.update().where(a.id == i).values(data=raw)),
        dump=dump,
    )


def _sql_history(db: Any, session_id: str) -> list[str]:
    history = db.history
    query = sa.select(history.c.data).where(history.c.session_id == session_id).order_by(history.c.id.desc())
    with db.engine.connect() as conn:
        return list(conn.execute(query).scalars())


def file_raw(folder: Path) -> Raw:
    """FileStore's files. A message rewritten to another length moves the lines after it: the head's
    extent (`b` bytes) is patched to match, as an attacker would, so the store reads on to the seal."""

    def lines(s: str) -> list[bytes]:
        return (folder / "messages" / f"{file_name(s)}.jsonl").read_bytes().split(b"\n")[:-1]

    def set_message(s: str, n: int, raw: Any) -> None:
        found = lines(s)
        found[n] = raw.encode() if isinstance(raw, str) else raw
        data = b"".join(line + b"\n" for line in found)
        (folder / "messages" / f"{file_name(s)}.jsonl").write_bytes(data)
        head = json.loads(head_of(s))
        head["$store"]["b"] = len(b"".join(line + b"\n" for line in found[: head["$store"]["n"]]))
        set_head(s, json.dumps(head, separators=(",", ":")))

    def head_of(s: str) -> bytes:
        return (folder / "checkpoints" / f"{file_name(s)}.json").read_bytes()

    def set_head(s: str, raw: Any) -> None:
        (folder / "checkpoints" / f"{file_name(s)}.json").write_bytes(raw.encode() if isinstance(raw, str) else raw)

    def history(s: str) -> list[str]:
        text = (folder / "checkpoint-history" / f"{file_name(s)}.json").read_text()
        return [json.dumps(e["checkpoint"], separators=(",", ":")) for e in json.loads(text)["entries"]]

    def dump() -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and "locks" not in p.parts}

    return Raw(
        message=lambda s, n: lines(s)[n],
        set_message=set_message,
        head=head_of,
        set_head=set_head,
        history=history,
        approval=lambda a: (folder / "approvals" / f"{file_name(a)}.json").read_bytes(),
        set_approval=lambda a, raw: (folder / "approvals" / f"{file_name(a)}.json").write_bytes(
            raw if isinstance(raw, bytes) else raw.encode()
        ),
        dump=dump,
    )


def mapping_raw(store: Any) -> Raw:
    mapping, keys = store.mapping, MappingKeys(store.prefix)

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def history(s: str) -> list[str]:
        raw = text(mapping[keys.history(s)])
        return [json.dumps(json.loads(line)["checkpoint"], separators=(",", ":")) for line in raw.split("\n")]

    def put(key: str, raw: Any) -> None:
        mapping[key] = text(raw)
        getattr(mapping, "sync", lambda: None)()

    return Raw(
        message=lambda s, n: text(mapping[keys.message(s, n)]),
        set_message=lambda s, n, raw: put(keys.message(s, n), raw),
        head=lambda s: text(mapping[keys.head(s)]),
        set_head=lambda s, raw: put(keys.head(s), raw),
        history=history,
        approval=lambda a: text(mapping[keys.approvals + a]),
        set_approval=lambda a, raw: put(keys.approvals + a, raw),
        dump=lambda: {k: text(mapping[k]) for k in sorted(text(k) for k in mapping.keys())},  # noqa: SIM118
    )
