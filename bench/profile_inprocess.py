"""Where an in-process step's durability time goes (issue #20):
`python -m bench.profile_inprocess [--out FILE] [--quick]`.

The tool loop of `bench.inprocess` (a scripted model asks for one trivial tool call per turn) runs
with no store, with SqliteStore and with RedisStore, `runs` times each under cProfile. Own time per
step by area, minus the same area with no store, is what durability costs a step, area by area:
SQLAlchemy, the sqlite3 driver (its C calls: execute, commit), redis-py, waiting on sockets,
pydantic, json, lousho's stores, the rest of lousho, asyncio and the rest. The top lines list the
functions whose own time per step grows most with a store. Also measured without the
profiler: the wall time per step of each variant, and the overhead (store minus no store).

cProfile slows Python code more than it slows C calls and waiting: read the shares, not the totals;
the wall figures are the real ones (and `python -m bench --only overhead` the ones to compare).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import os
import pstats
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.common import delete_prefix, quiet_gc, redis_target, revision


@dataclass(frozen=True, kw_only=True)
class Sizes:
    turns: int = 50
    runs: int = 20
    """Profiled runs of `turns` turns per variant (and as many timed ones without the profiler)."""


QUICK = Sizes(turns=5, runs=2)
"""`--quick`, the CI smoke."""

AREAS = (
    ("sqlalchemy", ("/sqlalchemy/",)),
    ("redis-py", ("/redis/",)),
    ("pydantic", ("/pydantic",)),
    ("json", ("/json/",)),
    ("lousho.stores", ("/lousho/stores/",)),
    ("lousho (engine, run, events, fingerprint)", ("/lousho/",)),
    ("asyncio", ("/asyncio/", "selectors.py", "/concurrent/", "threading.py")),
)
VARIANTS = ("none", "sqlite", "redis")


def area_of(function: tuple[str, int, str]) -> str:
    path, _, name = function
    for area, parts in AREAS:
        if any(part in path for part in parts):
            return area
    if path == "~":  # a C function: name it by what it is
        if "sqlite3" in name:
            return "sqlite3 driver (C: execute, commit)"
        if any(word in name for word in ("recv", "send", "poll", "select", "socket", "connect")):
            return "waiting on sockets"
        if "json" in name:
            return "json"
        if "pydantic" in name or "validate" in name or "serializ" in name:
            return "pydantic"
    return "the rest (stdlib, builtins)"


def _by_area(stats: Any) -> dict[str, float]:
    found: collections.Counter[str] = collections.Counter()
    for function, (_, _, own_s, _, _) in stats.stats.items():
        found[area_of(function)] += own_s
    return dict(found)


def _own(stats: Any) -> dict[str, float]:
    """Own time (seconds) per function, named short: `path tail:line name`, or `~ name` for a C function."""
    out: dict[str, float] = {}
    for (path, line, name), (_, _, own_s, _, _) in stats.stats.items():
        short = "~" if path == "~" else ("/".join(path.split("/")[-2:]) + f":{line}")
        out[f"{short} {name}"] = out.get(f"{short} {name}", 0.0) + own_s
    return out


def _runner(turns: int, redis_url: str, folder: str) -> tuple[dict[str, Callable[[], None]], Callable[[], None]]:
    """The loop of `bench.inprocess.run_lousho`, by variant, and what closes its stores."""
    from pydantic import BaseModel

    from lousho import Agent, AgentExecutor, define_tool
    from lousho.providers import ScriptedProvider, tool_calls
    from lousho.stores import RedisStore, SqliteStore

    class Args(BaseModel):
        n: int

    async def noop(args: Args, ctx: Any) -> dict[str, int]:
        return {"n": args.n}

    agent = Agent(
        name="bench",
        model="scripted",
        instructions="You run a benchmark.",
        max_steps=turns + 10,
        tools=[define_tool(name="noop", description="Does nothing", input=Args, execute=noop)],
    )
    answers: list[Any] = [tool_calls((f"call_{i}", "noop", {"n": i})) for i in range(turns)] + ["done"]
    prefix = f"lousho-profile-{uuid.uuid4().hex[:8]}:"
    client = redis.Redis.from_url(redis_url)
    stores: dict[str, Any] = {
        "none": None,
        "sqlite": SqliteStore(os.path.join(folder, "profile.db")).checkpoints,
        "redis": RedisStore(client, prefix=prefix).checkpoints,
    }
    loop = asyncio.new_event_loop()

    def runner(store: Any) -> Callable[[], None]:
        def run() -> None:
            session = f"s-{uuid.uuid4().hex[:12]}" if store is not None else None
            execute = AgentExecutor.execute(
                agent=agent,
                input="go",
                provider=ScriptedProvider(answers, by_turn=True),
                session_id=session,
                checkpoint_store=store,
            )
            result = loop.run_until_complete(execute)
            assert result.finish_reason == "stop" and len(result.messages) == 2 * turns + 3

        return run

    def close() -> None:
        loop.close()
        delete_prefix(client, prefix)
        client.close()

    return {name: runner(store) for name, store in stores.items()}, close


def measure(sizes: Sizes, redis_url: str) -> dict[str, Any]:
    """Wall and CPU ms per step and, under cProfile, own ms per step by area and by function."""
    with tempfile.TemporaryDirectory(prefix="lousho-profile-") as folder:
        variants, close = _runner(sizes.turns, redis_url, folder)
        try:
            for run in variants.values():
                run()  # warm-up: imports, tables, connections
            wall: dict[str, list[float]] = {name: [] for name in variants}
            cpu: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(sizes.runs):
                for name, run in variants.items():
                    with quiet_gc():
                        started, started_cpu = time.perf_counter(), time.process_time()
                        run()
                        cpu[name].append((time.process_time() - started_cpu) * 1000 / sizes.turns)
                        wall[name].append((time.perf_counter() - started) * 1000 / sizes.turns)
            profilers = {name: cProfile.Profile() for name in variants}
            for _ in range(sizes.runs):  # interleaved, as the timed runs: load on the machine hits each alike
                for name, run in variants.items():
                    with quiet_gc():
                        profilers[name].enable()
                        run()
                        profilers[name].disable()
            areas, functions = {}, {}
            steps = sizes.runs * sizes.turns
            for name, profiler in profilers.items():
                stats: Any = pstats.Stats(profiler)
                areas[name] = {k: v * 1000 / steps for k, v in _by_area(stats).items()}
                functions[name] = {k: v * 1000 / steps for k, v in _own(stats).items()}
        finally:
            close()
    return {
        "wall": {k: statistics.median(v) for k, v in wall.items()},
        "cpu": {k: statistics.median(v) for k, v in cpu.items()},
        "areas": areas,
        "functions": functions,
    }


def render(result: dict[str, Any], sizes: Sizes, top: int = 15) -> str:
    wall, cpu, areas, functions = result["wall"], result["cpu"], result["areas"], result["functions"]
    lines = [
        "## Profile",
        "",
        f"`python -m bench.profile_inprocess`, lousho at {revision()}: {sizes.runs} runs of {sizes.turns} turns "
        "per variant (a step: a model turn and its tool call, two saves).",
        "",
        "Without the profiler (median per step), wall time: "
        + ", ".join(f"{name} {wall[name]:.3f} ms" for name in VARIANTS)
        + f" (overhead: SqliteStore {wall['sqlite'] - wall['none']:.3f} ms, RedisStore {wall['redis'] - wall['none']:.3f} ms); "
        "this process's CPU time (steadier on a shared machine, but blind to Redis's own work): "
        + ", ".join(f"{name} {cpu[name]:.3f} ms" for name in VARIANTS)
        + f" (overhead: SqliteStore {cpu['sqlite'] - cpu['none']:.3f} ms, RedisStore {cpu['redis'] - cpu['none']:.3f} ms).",
        "",
        "Own time per step under cProfile, by area, minus the same area with no store (ms):",
        "",
        "| area | SqliteStore | RedisStore |",
        "| - | - | - |",
    ]
    names = sorted({a for v in areas.values() for a in v}, key=lambda a: -areas["sqlite"].get(a, 0.0))
    totals = {"sqlite": 0.0, "redis": 0.0}
    for name in names:
        cells = []
        for variant in ("sqlite", "redis"):
            extra = areas[variant].get(name, 0.0) - areas["none"].get(name, 0.0)
            totals[variant] += extra
            cells.append(f"{extra:+.3f}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    lines.append(f"| **all** | **{totals['sqlite']:+.3f}** | **{totals['redis']:+.3f}** |")
    for variant, label in (("sqlite", "SqliteStore"), ("redis", "RedisStore")):
        grown = {k: v - functions["none"].get(k, 0.0) for k, v in functions[variant].items()}
        lines += [
            "",
            f"Functions whose own time per step grows most with {label} (ms, under cProfile):",
            "",
            "| function | ms per step |",
            "| - | - |",
        ]
        for key, value in sorted(grown.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"| `{key}` | {value:.3f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_inprocess", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown here (default: print only)")
    parser.add_argument("--quick", action="store_true", help="tiny runs: a smoke test of this script")
    parser.add_argument("--top", type=int, default=15, help="functions listed per store")
    options = parser.parse_args(argv)
    sizes = QUICK if options.quick else Sizes()
    with redis_target() as (url, _):
        result = measure(sizes, url)
    text = render(result, sizes, options.top)
    if options.out is not None:
        options.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
