"""4. Cost growth: checkpoint save time and bytes stored per session at steps 10, 100 and 500.

The transcript is `bench.redis_store`'s: a system and a user message, then one ~1 KB message
per step (an assistant turn asking for a tool, then its result, alternating); each save is
one message longer. Every store keeps its default history ring (50 entries).

- Save time at step N: each repeat is a fresh session saved step by step, its saves at steps
  N-5..N+5 timed (a single save is at the mercy of one Lua GC step or one fsync). Reported: the
  median of every timed save of every repeat, with the min-max of the repeats' own medians; the
  growth ratio is taken from those pooled medians. The Python garbage collector is collected 10
  saves before a window and paused inside it: collected right before, the fresh memory it hands
  out afterwards made the next saves ~60% slower (step 10's window came right after one).
- A store whose saves around step 100 take over SLOW_MS (FileStore while it rewrites its whole
  history file, 50 whole checkpoints, on every save: 500 steps one by one would write ~6 GB) is
  brought from step 102 to step 497 in one go (its latest file and history file written with
  exactly what its own saves would have left), then saved step by step again.
- Bytes per session: what the store holds for the session right after the save of step N:
  memory store: the Python heap it retains (tracemalloc, in a separate untimed run); SQLite:
  pages in use ((page_count - freelist_count) x page_size, one database file per session, WAL
  checkpointed); FileStore: the files in its folder (one folder per session); Redis: the sum
  of MEMORY USAGE of the session's keys.
- Naive baselines: the whole checkpoint JSON to SQLite (upsert latest + insert history row +
  trim the ring, one transaction) and to Redis (SET + LPUSH + LTRIM, MULTI).
- LangGraph SqliteSaver: a graph that appends the same messages (a model node, then a tool
  node, one message per super-step), run to N super-steps on a fresh file; its pages in use,
  and the time per super-step around N (durability="sync", so the save is inside the step).
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import statistics
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import redis

from bench.common import delete_prefix, isolated, stats, why_not
from bench.redis_store import HISTORY_LIMIT, Naive, checkpoints, message
from lousho.approvals import utc_now
from lousho.checkpoint import Checkpoint
from lousho.stores import FileStore, RedisStore, SqliteStore, memory_store

STEPS = (10, 100, 500)
SIZE = 1000
WINDOW = 5  # saves timed: N-5..N+5 (a sub-millisecond save varies by ±50% from one to the next)
# Untimed saves between a full collection and a window: right after gc.collect() the allocator
# hands out fresh memory for a while, which made the next saves ~60% slower and step 10's window
# (collected right before) look like growth that the saves do not have.
SETTLE = 10
SLOW_MS = 20.0  # a store slower than this per save around step 100 is brought forward to step 500 in one go


def sqlite_bytes(path: str | Path) -> int:
    """Bytes of pages in use in a SQLite file, after moving its WAL into it."""
    connection = sqlite3.connect(str(path))
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages, free, size = (
            connection.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_count", "freelist_count", "page_size")
        )
        return int((pages - free) * size)
    finally:
        connection.close()


def redis_bytes(client: redis.Redis, pattern: str) -> int:
    return sum(int(client.memory_usage(key, samples=0) or 0) for key in client.scan_iter(match=pattern, count=1000))


class NaiveSqlite:
    """The baseline on SQLite: the whole checkpoint JSON as the latest row and as a history row."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.connection = sqlite3.connect(path, isolation_level=None)
        self.connection.execute("PRAGMA journal_mode = WAL")
        self.connection.execute("CREATE TABLE latest (session TEXT PRIMARY KEY, version INT, data TEXT)")
        self.connection.execute("CREATE TABLE history (id INTEGER PRIMARY KEY, session TEXT, data TEXT)")
        self.connection.execute("CREATE INDEX history_session ON history (session, id)")

    def save(self, session: str, checkpoint: Checkpoint) -> None:
        raw = checkpoint.model_dump_json()
        run = self.connection.execute
        run("BEGIN IMMEDIATE")
        run("INSERT OR REPLACE INTO latest VALUES (?, ?, ?)", (session, checkpoint.version, raw))
        run("INSERT INTO history (session, data) VALUES (?, ?)", (session, raw))
        run(
            "DELETE FROM history WHERE session = ? AND id NOT IN "
            "(SELECT id FROM history WHERE session = ? ORDER BY id DESC LIMIT ?)",
            (session, session, HISTORY_LIMIT),
        )
        run("COMMIT")

    def close(self) -> None:
        self.connection.close()


class Target:
    """One store under test: a fresh session per repeat, its saves, and its bytes for that session."""

    def __init__(self, name: str, folder: Path, client: redis.Redis, prefix: str) -> None:
        self.name, self.folder, self.client, self.prefix = name, folder, client, prefix
        self.store: Any = None
        self.where = folder
        self.skipped = False
        """Whether the session was brought forward (not saved step by step) to the last window."""

    def open(self, session: str) -> None:
        self.where = where = self.folder / f"{self.name}-{session}"
        if self.name == "memory":
            self.store = memory_store().checkpoints
        elif self.name == "SqliteStore":
            self.store = SqliteStore(f"{where}.db")
        elif self.name == "FileStore":
            self.store = FileStore(where).checkpoints
        elif self.name == "RedisStore":
            self.store = RedisStore(self.client, prefix=f"{self.prefix}ours:").checkpoints
        elif self.name == "naive SQLite":
            self.store = NaiveSqlite(f"{where}.db")
        elif self.name == "naive Redis":
            self.store = Naive(self.client, self.prefix)

    def save(self, session: str, checkpoint: Checkpoint) -> None:
        target = self.store.checkpoints if self.name == "SqliteStore" else self.store
        target.save(session, checkpoint)

    def forget(self, session: str) -> None:
        """Delete a session (its SQLite pages go to the free list, not counted as in use)."""
        if self.name == "SqliteStore":
            self.store.checkpoints.delete(session)
        elif self.name == "naive SQLite":
            for table in ("latest", "history"):
                self.store.connection.execute(f"DELETE FROM {table} WHERE session = ?", (session,))
        elif self.name == "naive Redis":
            self.client.delete(f"{self.prefix}naive:{session}:cp", f"{self.prefix}naive:{session}:hist")
        else:
            self.store.delete(session)

    def fast_forward(self, session: str, previous: list[Checkpoint]) -> None:
        """FileStore only: write the two files its saves of `previous` (oldest first) would have left,
        in its documented layout (`checkpoints/<session>.json`, `checkpoint-history/<session>.json`)."""
        if self.name != "FileStore":
            raise RuntimeError(f"{self.name} is too slow to save 500 steps one by one, and cannot be brought forward")
        newest = previous[-HISTORY_LIMIT:][::-1]
        entries = [{"saved_at": utc_now(), "checkpoint": json.loads(c.model_dump_json())} for c in newest]
        (self.where / "checkpoints" / f"{session}.json").write_text(previous[-1].model_dump_json())
        (self.where / "checkpoint-history" / f"{session}.json").write_text(json.dumps({"entries": entries}))
        history = self.store.history(session)
        if self.store.load(session) != previous[-1] or [e.step for e in history] != [c.step_index for c in newest]:
            raise RuntimeError("FileStore's layout changed: bench.growth cannot bring a session forward in one go")

    def bytes(self, session: str) -> int:
        if self.name == "memory":
            return -1  # measured apart, by `memory_bytes` (tracemalloc would slow the timed saves)
        if self.name in ("SqliteStore", "naive SQLite"):
            return sqlite_bytes(self.store.path)
        if self.name == "FileStore":  # the folder holds this session only (the warm-up one is deleted)
            return sum(path.stat().st_size for path in self.where.rglob("*") if path.is_file())
        if self.name == "RedisStore":
            return redis_bytes(self.client, f"{self.prefix}ours:{{{session}}}:*")
        return redis_bytes(self.client, f"{self.prefix}naive:{session}:*")

    def close(self) -> None:
        if self.name in ("SqliteStore", "naive SQLite"):
            self.store.close()


TARGETS = ["memory", "SqliteStore", "FileStore", "RedisStore", "naive SQLite", "naive Redis"]


def memory_bytes(step: int) -> int:
    """Python heap bytes a memory store retains for one session saved up to `step` (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store = memory_store().checkpoints
        for checkpoint in checkpoints("m", step, SIZE):
            store.save("m", checkpoint)
        del checkpoint
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
        assert store.load("m") is not None  # the store lived until here
        return retained
    finally:
        tracemalloc.stop()


def one_session(target: Target, session: str) -> tuple[dict[int, list[float]], dict[int, int]]:
    """One repeat: the save times (ms) around each step of STEPS, and the bytes at each step.

    A store whose saves around step 100 take over SLOW_MS (FileStore while it rewrites its whole
    history file) is brought from there to just before the last window in one go (`fast_forward`)."""
    times: dict[int, list[float]] = {step: [] for step in STEPS}
    sizes: dict[int, int] = {}
    target.open(session)
    try:
        for checkpoint in checkpoints(f"{session}-warm", 2 * WINDOW + 1, SIZE):  # untimed: warm the code paths
            target.save(f"{session}-warm", checkpoint)
        target.forget(f"{session}-warm")
        run = list(checkpoints(session, max(STEPS) + WINDOW, SIZE))  # run[i] is step i + 1
        index = 0
        while index < len(run):
            checkpoint = run[index]
            step = checkpoint.version
            index += 1
            if any(step == max(1, s - WINDOW - SETTLE) for s in STEPS):
                gc.collect()  # the harness's garbage is not the store's cost...
            near = next((s for s in STEPS if abs(step - s) <= WINDOW), None)
            if near is None:
                target.save(session, checkpoint)
                continue
            gc.disable()  # ...nor a collection that its garbage sets off inside the window
            try:
                started = time.perf_counter()
                target.save(session, checkpoint)
                times[near].append((time.perf_counter() - started) * 1000)
            finally:
                gc.enable()
            if step == near:
                sizes[step] = target.bytes(session)
            if step == near + WINDOW and near != max(STEPS) and statistics.median(times[near]) > SLOW_MS:
                target.fast_forward(session, run[: max(STEPS) - WINDOW - 1])
                target.skipped = True
                index = max(STEPS) - WINDOW - 1
        return times, sizes
    finally:
        target.close()


def langgraph_growth(steps: list[int]) -> dict[str, Any]:
    """In a child process: LangGraph's SqliteSaver on the same transcript, a fresh file per N."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    def as_langchain(step: int) -> Any:
        ours = message(step, SIZE)
        if ours.role == "assistant":
            call = ours.tool_calls[0]
            return AIMessage(
                content=ours.content, tool_calls=[{"id": call.id, "name": call.name, "args": call.arguments}]
            )
        return ToolMessage(content=ours.content, tool_call_id=ours.tool_call_id, name=ours.name)

    result: dict[str, Any] = {"bytes": {}, "step_ms": {}}
    with tempfile.TemporaryDirectory(prefix="lousho-bench-") as folder:
        for last in steps:

            def node(state: MessagesState) -> dict[str, Any]:
                return {"messages": [as_langchain(len(state["messages"]) - 1)]}

            def route(state: MessagesState, last: int = last, after: str = "") -> str:
                return END if len(state["messages"]) - 2 >= last else after

            graph = StateGraph(MessagesState)
            graph.add_node("model", node)
            graph.add_node("tools", node)
            graph.add_edge(START, "model")
            graph.add_conditional_edges("model", lambda s: route(s, after="tools"), ["tools", END])
            graph.add_conditional_edges("tools", lambda s: route(s, after="model"), ["model", END])
            path = os.path.join(folder, f"lg-{last}.db")
            connection = sqlite3.connect(path, check_same_thread=False)
            app = graph.compile(checkpointer=SqliteSaver(connection))
            start = [SystemMessage("You are a careful research assistant."), HumanMessage("Find it.")]
            config = {"configurable": {"thread_id": "t"}, "recursion_limit": last + 10}
            gaps, before = [], time.perf_counter()
            for _ in app.stream({"messages": start}, config, stream_mode="updates", durability="sync"):
                now = time.perf_counter()
                gaps.append((now - before) * 1000)
                before = now
            connection.close()
            assert len(gaps) == last, len(gaps)
            result["bytes"][str(last)] = sqlite_bytes(path)
            # the gap before update k holds super-step k and the save of super-step k-1
            result["step_ms"][str(last)] = statistics.median(gaps[max(0, last - 1 - 2 * WINDOW) :])
    return result


def run(repeats: int, client: redis.Redis) -> dict[str, Any]:
    prefix = f"lousho-bench-{uuid.uuid4().hex[:8]}:"
    result: dict[str, Any] = {"steps": list(STEPS), "repeats": repeats, "message_bytes": SIZE, "stores": {}}
    with tempfile.TemporaryDirectory(prefix="lousho-bench-") as folder:
        try:
            for name in TARGETS:
                target = Target(name, Path(folder), client, prefix)
                per_step: dict[int, list[float]] = {s: [] for s in STEPS}  # each session's median
                pooled: dict[int, list[float]] = {s: [] for s in STEPS}  # every timed save
                sizes: dict[int, int] = {}
                try:
                    for repeat in range(repeats):
                        times, sizes = one_session(target, f"g{repeat}")
                        for step, ms in times.items():
                            per_step[step].append(statistics.median(ms))
                            pooled[step] += ms
                except Exception as exc:
                    result["stores"][name] = {"error": f"failed: {type(exc).__name__}: {exc}"}
                    continue
                finally:
                    delete_prefix(client, prefix)
                if name == "memory":
                    sizes = {step: memory_bytes(step) for step in STEPS}
                result["stores"][name] = {
                    "save_ms": {str(s): stats(v) for s, v in per_step.items()},
                    "bytes": {str(s): b for s, b in sizes.items()},
                    "ratio": statistics.median(pooled[max(STEPS)]) / statistics.median(pooled[min(STEPS)]),
                    "pooled_ms": {str(s): statistics.median(v) for s, v in pooled.items()},
                    "brought_forward": target.skipped,
                }
        finally:
            delete_prefix(client, prefix)
    try:
        result["langgraph"] = isolated("bench.growth:langgraph_growth", steps=list(STEPS))
    except RuntimeError as exc:
        result["langgraph"] = {"error": why_not(exc)}
    return result
