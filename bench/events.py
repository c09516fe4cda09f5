"""7. The cost of the live event stream (issue #34): the fleet's hop with events on and off.

Two fleets of one worker process each (solo pool), on the same Redis and broker, serving the same agent whose every
model turn streams a text of 500 tokens in 50 deltas (`bench.fleet_app` with `LOUSHO_BENCH_STREAM_DELTAS=50`), one
with the agent's events on (the default: turn starts, deltas, tool calls, saves written to the session's stream),
one with `stream_events=False`. Both stream from the provider (the app's `on_event` hook listens): the difference is
what the stream costs. A session of `turns` tool turns (2 x turns + 1 hops), from `Client.enqueue` to its finished
save, divided by its hops; repeats alternate between the two. The goal: events on <= 1.10x events off.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from typing import Any

import redis

from bench.common import delete_prefix, stats
from bench.fleet import Fleet
from lousho.fleet.events import events_key

DELTAS = 50
GOAL = 1.10


def run(url: str, turns: int, repeats: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    prefix = f"lousho-bench-events-{uuid.uuid4().hex[:8]}:"
    fleets: dict[str, Fleet] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="lousho-bench-events-") as log_dir:
            for label, on in (("events on", "1"), ("events off", "0")):
                env = {"LOUSHO_BENCH_STREAM_DELTAS": str(DELTAS), "LOUSHO_BENCH_EVENTS": on}
                fleets[label] = Fleet(url, client, prefix, "lousho", log_dir, extra_env=env, label=label)
                fleets[label].scale(1)
            return {"events": measure(fleets, turns, repeats)}
    finally:
        for fleet in fleets.values():
            fleet.close()
        delete_prefix(client, prefix)
        client.close()


def measure(fleets: dict[str, Fleet], turns: int, repeats: int) -> dict[str, Any]:
    hops = 2 * turns + 1
    per_hop: dict[str, list[float]] = {label: [] for label in fleets}
    entries: list[int] = []
    order = list(fleets.items())
    for repeat in range(repeats + 1):  # the first round warms both up: not counted
        for label, fleet in order[repeat % 2 :] + order[: repeat % 2]:  # each goes first in turn
            session = f"events-{label.split()[1]}-{repeat}-{uuid.uuid4().hex[:6]}"
            started = time.time()
            fleet.start(session, turns)
            (done,) = fleet.wait_done(1, timeout_s=60 + hops)
            if repeat:
                per_hop[label].append((done["t"] - started) * 1000 / hops)
                if label == "events on":
                    entries.append(int(fleet.client.xlen(events_key(fleet.store, session))))
    ratios = [on / off for on, off in zip(per_hop["events on"], per_hop["events off"], strict=True)]
    return {
        "turns": turns,
        "hops": hops,
        "repeats": repeats,
        "deltas_per_turn": DELTAS,
        "tokens_per_turn": 500,
        "per_hop_ms": {label: stats(values) for label, values in per_hop.items()},
        "ratio": stats(ratios),
        "stream_entries_per_session": stats([float(n) for n in entries]),
        "goal": GOAL,
    }


def section(result: dict[str, Any]) -> list[str]:
    """The report's table (bench/report.py)."""
    on, off = result["per_hop_ms"]["events on"], result["per_hop_ms"]["events off"]
    return [
        f"A session of {result['turns']} tool turns ({result['hops']} hops), each model turn streaming "
        f"{result['tokens_per_turn']} tokens in {result['deltas_per_turn']} deltas; median of {result['repeats']} "
        "alternating repeats per side, one worker process each (solo pool).",
        "",
        "| | per hop, ms (median) | min | max |",
        "| - | - | - | - |",
        f"| events on (the session's stream written) | {on['median']:.2f} | {on['min']:.2f} | {on['max']:.2f} |",
        f"| events off (`Agent(stream_events=False)`) | {off['median']:.2f} | {off['min']:.2f} | {off['max']:.2f} |",
        f"| ratio on / off (per repeat pair) | {result['ratio']['median']:.3f} | {result['ratio']['min']:.3f} | "
        f"{result['ratio']['max']:.3f} |",
        "",
        f"Stream entries per session (events on): {result['stream_entries_per_session']['median']:.0f} "
        "(deltas that arrive within `events_flush_interval_s` of each other are written as one entry).",
        "",
    ]
