"""The payload codec's cost on RedisStore, against the codec off, measured in the same run (issue #17).

    python -m bench.codec [--quick] [--out docs/bench/codec.md]

1. Redis memory per session: MEMORY USAGE (SAMPLES 0: every element counted) summed over a session's
   keys (head, messages list, history ring of 50) after a run of tool-loop turns, against the bytes of
   its transcript (its messages' JSON), with the codec off, compression only, and compression +
   encryption. Goal with compression: at most 1.0x.
2. Save overhead: the time of a session's saves, one per turn from its first to its last, from Python
   (serialisation, codec and the round trip included), median over sessions; codec on (compression +
   encryption) / off, the two interleaved session by session. Goal: at most 1.20x.

The transcript is text a model would write and tool results it would read (JSON records), drawn
from a seeded vocabulary, not a repeated phrase that any compressor shrinks to nothing.
Uses `REDIS_URL` when set (under a unique key prefix, deleted afterwards), else a private redis-server.
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
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import redis

from bench.redis_store import delete_prefix, target
from lousho.checkpoint import Checkpoint
from lousho.messages import Message, ToolCall
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.redis import RedisStore

HISTORY_LIMIT = 50
KEY = bytes(range(32))
CODECS = {
    "off": PLAIN,
    "compression (zlib)": PayloadCodec(compress=True),
    "zlib + encryption": PayloadCodec(compress=True, keys={"k1": KEY}),
    "compression (zstd)": PayloadCodec(compress="zstd"),
    "zstd + encryption": PayloadCodec(compress="zstd", keys={"k1": KEY}),
    "encryption only": PayloadCodec(keys={"k1": KEY}),
}
TIMED = ("off", "zlib + encryption", "zstd + encryption", "encryption only")


@dataclass(frozen=True)
class Config:
    turns: int
    memory_sessions: int
    timing_sessions: int


QUICK = Config(turns=10, memory_sessions=3, timing_sessions=5)
FULL = Config(turns=40, memory_sessions=20, timing_sessions=80)


class Writer:
    """Text and tool results from a seeded vocabulary: compressible as prose and JSON are, not more."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        syllables = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "in", "qu", "es", "tra", "pol", "an", "ve"]
        self.words = ["".join(self.rng.choices(syllables, k=self.rng.randint(1, 4))) for _ in range(3000)]

    def prose(self, words: int) -> str:
        chosen = self.rng.choices(self.words, k=words)
        return " ".join(chosen).capitalize() + "."

    def records(self, count: int) -> str:
        rows = [
            f'{{"id": "{uuid.UUID(int=self.rng.getrandbits(128)).hex[:12]}", "name": "{self.prose(3)}", '
            f'"price": {self.rng.randint(100, 99999) / 100}, "stock": {self.rng.randint(0, 500)}, '
            f'"note": "{self.prose(12)}"}}'
            for _ in range(count)
        ]
        return "[" + ", ".join(rows) + "]"


def checkpoints(session: str, turns: int, writer: Writer) -> Iterator[Checkpoint]:
    """A tool loop, saved once per turn: an assistant turn with a tool call, then its result."""
    messages = [Message.system(writer.prose(60)), Message.user(writer.prose(40))]
    for turn in range(1, turns + 1):
        call = ToolCall(id=f"call_{turn}", name="search", arguments={"query": writer.prose(6), "limit": 8})
        messages = [*messages, Message.assistant(writer.prose(90), [call])]
        messages = [*messages, Message(role="tool", content=writer.records(8), tool_call_id=call.id, name="search")]
        yield Checkpoint(
            session_id=session, version=turn, step_index=turn, messages=messages, business_state={"turn": turn}
        )


def transcript_bytes(checkpoint: Checkpoint) -> int:
    return sum(len(m.model_dump_json().encode()) for m in checkpoint.messages)


def session_memory(client: redis.Redis, store: RedisStore, session: str) -> int:
    keys = store.keys.session_keys(session)
    return sum(int(client.memory_usage(key, samples=0) or 0) for key in keys)


def memory(client: redis.Redis, prefix: str, config: Config) -> dict[str, float]:
    """Per codec: Redis bytes per transcript byte, over `memory_sessions` sessions (the same transcripts)."""
    result: dict[str, float] = {}
    for name, codec in CODECS.items():
        store = RedisStore(client, prefix=f"{prefix}mem-{len(result)}:", history_limit=HISTORY_LIMIT, codec=codec)
        stored = transcript = 0
        for index in range(config.memory_sessions):
            session = f"s{index}"
            last = None
            for last in checkpoints(session, config.turns, Writer(index)):
                store.checkpoints.save(session, last)
            assert last is not None
            stored += session_memory(client, store, session)
            transcript += transcript_bytes(last)
        result[name] = stored / transcript
        result["transcript_kb"] = transcript / config.memory_sessions / 1000
    return result


def save_times(client: redis.Redis, prefix: str, config: Config) -> dict[str, list[float]]:
    """Per timed codec: each session's total save time in ms. The codecs take turns save by save (each on a
    session of its own with the same checkpoints), so a burst of other work on the machine hits them alike."""
    stores = {
        name: RedisStore(client, prefix=f"{prefix}time-{i}:", history_limit=HISTORY_LIMIT, codec=CODECS[name])
        for i, name in enumerate(TIMED)
    }
    times: dict[str, list[float]] = {name: [] for name in stores}
    for index in range(config.timing_sessions):
        session, spent = f"t{index}", dict.fromkeys(stores, 0.0)
        for turn, checkpoint in enumerate(checkpoints(session, config.turns, Writer(1000 + index))):
            shift = (index + turn) % len(TIMED)
            for name in TIMED[shift:] + TIMED[:shift]:
                started = time.perf_counter()
                stores[name].checkpoints.save(session, checkpoint)
                spent[name] += time.perf_counter() - started
        for name, seconds in spent.items():
            times[name].append(seconds * 1000)
    return times


def report(config: Config, where: str, client: redis.Redis, prefix: str) -> str:
    mem = memory(client, prefix, config)
    delete_prefix(client, prefix)
    times = save_times(client, prefix, config)
    off = statistics.median(times["off"])
    version = client.info("server")["redis_version"]  # type: ignore[index]
    turns = config.turns
    lines = [
        "# Payload codec benchmark (issue #17)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Redis {version} at {where}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs. Sessions of {turns} tool-loop turns (a ~0.6 KB assistant message with a "
        f"tool call, a ~1.5 KB JSON tool result), saved once per turn, history ring of {HISTORY_LIMIT}; "
        f"transcript ~{mem['transcript_kb']:.0f} KB per session.",
        "",
        "## 1. Redis memory per session, against the transcript's bytes",
        "",
        f"MEMORY USAGE summed over each session's keys, {config.memory_sessions} sessions.",
        "",
        "| codec | Redis bytes / transcript bytes (goal with compression: <= 1.0x) |",
        "| - | - |",
        *(f"| {name} | {mem[name]:.2f}x |" for name in CODECS),
        "",
        "## 2. Save overhead, codec on against off",
        "",
        f"Each session's {turns} saves timed from Python, median (min-max) over {config.timing_sessions} sessions "
        "per codec, the codecs taking turns save by save.",
        "",
        "| codec | a session's saves, ms | per save, ms | ratio to off, medians (goal <= 1.20x) | ratio, fastest |",
        "| - | - | - | - | - |",
        *(
            f"| {name} | {statistics.median(times[name]):.1f} ({min(times[name]):.1f}-{max(times[name]):.1f}) | "
            f"{statistics.median(times[name]) / turns:.3f} | {statistics.median(times[name]) / off:.2f}x | "
            f"{min(times[name]) / min(times['off']):.2f}x |"
            for name in TIMED
        ),
        "",
        "The fastest session of each codec is the one least disturbed by other work on the machine; "
        "both ratios come from the same run. A save encodes only what it sends: the new messages, one by one, and the head's sealed part; "
        "messages saved before are never re-encoded. zlib is raw deflate level 1 with a window sized to "
        "the payload, zstd is Zstandard level 1, each payload of 256 bytes or more (kept plain when that "
        "would not shrink it); encryption is AES-GCM with a random 96-bit nonce and a 16-byte tag.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.codec", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few short sessions (a smoke run, seconds)")
    parser.add_argument("--out", default="docs/bench/codec.md", help="where to write the markdown table")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else FULL
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
