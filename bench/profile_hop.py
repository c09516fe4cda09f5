"""Where a fleet hop's time goes (issue #20): `python -m bench.profile_hop [--out FILE] [--quick]`.

One solo worker process runs under cProfile twice, serving a small and then a larger batch of
sessions; the difference between the two profiles, divided by the difference in task hops, is the
steady-state cost of one hop by area: Celery's own machinery (celery, kombu, billiard, vine),
redis-py, waiting on sockets (Redis round trips and the broker's BRPOP), JSON, pydantic, lousho,
asyncio, and the rest. The same is measured for the floor: a chain of bare Celery tasks on the same
broker. Redis commands per hop are counted by MONITOR (commands run inside a Lua script count one
by one, as INFO commandstats counts them). Writes a Markdown table (default: docs/bench/profile.md).

cProfile slows Python code down, and wait time does not slow down, so the areas' shares are a guide
to what to change, not figures to compare with `python -m bench`'s latencies.
"""

from __future__ import annotations

import argparse
import collections
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.common import ROOT, redis_target, revision
from bench.fleet import Fleet


@dataclass(frozen=True, kw_only=True)
class Sizes:
    turns: int = 10
    small: int = 4
    large: int = 24
    """Sessions (or chains) of `turns` turns in the two profiled runs: the difference is 20 x 21 hops."""


QUICK = Sizes(turns=2, small=1, large=2)
"""`--quick`, the CI smoke."""

AREAS = (
    ("celery, kombu, billiard, vine", ("/celery/", "/kombu/", "/billiard/", "/vine/")),
    ("redis-py", ("/redis/",)),
    ("pydantic", ("/pydantic",)),
    ("json", ("/json/",)),
    ("lousho", ("/lousho/",)),
    ("asyncio", ("/asyncio/", "selectors.py")),
)


def area_of(function: tuple[str, int, str]) -> str:
    path, _, name = function
    for area, parts in AREAS:
        if any(part in path for part in parts):
            return area
    if path == "~":  # a C function: name it by what it is
        if any(word in name for word in ("recv", "send", "poll", "select", "socket", "connect")):
            return "waiting on sockets"
        if "json" in name:
            return "json"
        if "pydantic" in name or "validate" in name or "serializ" in name:
            return "pydantic"
    return "the rest (stdlib, builtins)"


def areas(profile: Path) -> dict[str, float]:
    """Own time (seconds) by area over the whole profile."""
    stats: Any = pstats.Stats(str(profile))
    found: collections.Counter[str] = collections.Counter()
    for function, (_, _, own_s, _, _) in stats.stats.items():
        found[area_of(function)] += own_s
    return dict(found)


def profiled_run(fleet: Fleet, sessions: int, turns: int, out: Path) -> None:
    """A solo worker under cProfile serves one warm-up session, then `sessions` at once; SIGTERM ends it."""
    command = [
        sys.executable, "-m", "cProfile", "-o", str(out), "-m", "celery", "-A", {"lousho": "bench.fleet_app", "floor": "bench.floor_app"}[fleet.kind],
        "worker", "-P", "solo", "-Q", fleet.queue, "-n", f"profile-{uuid.uuid4().hex[:6]}@%h",
        "--without-mingle", "--without-gossip", "-l", "INFO",
    ]  # fmt: skip
    log_path = Path(fleet.log_dir) / f"{out.stem}.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(command, env={**os.environ, **fleet.env}, cwd=ROOT, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while " ready." not in log_path.read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the profiled worker did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        fleet.start(f"warm-{uuid.uuid4().hex[:6]}", 2)
        fleet.wait_done(1, timeout_s=120)
        for _ in range(sessions):
            fleet.start(f"s-{uuid.uuid4().hex[:8]}", turns)
        fleet.wait_done(sessions, timeout_s=300)
    finally:
        worker.send_signal(signal.SIGTERM)  # a warm shutdown: cProfile writes its file on the way out
        worker.wait(timeout=120)


def commands_per_hop(fleet: Fleet, url: str, turns: int) -> float:
    """Commands the Redis server runs while one more session of `turns` turns runs (MONITOR), per hop."""
    seen: list[float] = []
    started = threading.Event()
    stop = threading.Event()

    def monitor() -> None:
        with redis.Redis.from_url(url).monitor() as stream:
            started.set()
            for command in stream.listen():
                seen.append(command["time"])
                if stop.is_set():
                    return

    thread = threading.Thread(target=monitor, daemon=True)
    thread.start()
    started.wait(10)
    begin = time.time()
    fleet.start(f"m-{uuid.uuid4().hex[:8]}", turns)
    fleet.wait_done(1, timeout_s=120)
    end = time.time()
    stop.set()
    fleet.client.ping()
    thread.join(timeout=10)
    return sum(1 for t in seen if begin <= t <= end) / (2 * turns + 1)


def profile(kind: str, url: str, folder: Path, sizes: Sizes) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    fleet = Fleet(url, client, f"lousho-profile-{uuid.uuid4().hex[:8]}:", kind, str(folder))
    small, large = folder / f"{kind}-small.prof", folder / f"{kind}-large.prof"
    profiled_run(fleet, sizes.small, sizes.turns, small)
    profiled_run(fleet, sizes.large, sizes.turns, large)
    fleet.scale(1)
    per_hop_commands = commands_per_hop(fleet, url, sizes.turns)
    fleet.close()
    hops = (sizes.large - sizes.small) * (2 * sizes.turns + 1)
    few, many = areas(small), areas(large)
    per_hop = {area: (many.get(area, 0.0) - few.get(area, 0.0)) * 1000 / hops for area in many}
    return {"ms_per_hop": per_hop, "commands_per_hop": per_hop_commands}


def render(results: dict[str, dict[str, Any]], sizes: Sizes) -> str:
    names = sorted(
        {a for r in results.values() for a in r["ms_per_hop"]}, key=lambda a: -results["lousho"]["ms_per_hop"].get(a, 0)
    )
    lines = [
        "# Where a fleet hop's time goes",
        "",
        f"`python -m bench.profile_hop`, lousho at {revision()}: own time per task hop under cProfile, by area, "
        f"steady state (a run of {sizes.large} sessions of {sizes.turns} turns minus a run of {sizes.small}, one solo worker), "
        "against the floor (a chain of bare Celery tasks, same broker and settings). cProfile slows Python "
        "code more than it slows waiting: read the shares, not the totals.",
        "",
        "| area | lousho, ms per hop | floor, ms per hop | lousho - floor |",
        "| - | - | - | - |",
    ]  # fmt: skip
    for name in names:
        ours, floor = results["lousho"]["ms_per_hop"].get(name, 0.0), results["floor"]["ms_per_hop"].get(name, 0.0)
        lines.append(f"| {name} | {ours:.3f} | {floor:.3f} | {ours - floor:+.3f} |")
    totals = {k: sum(r["ms_per_hop"].values()) for k, r in results.items()}
    lines.append(
        f"| **all** | **{totals['lousho']:.3f}** | **{totals['floor']:.3f}** | **{totals['lousho'] - totals['floor']:+.3f}** |"
    )
    lines += [
        "",
        f"Redis commands per hop (MONITOR; commands inside Lua scripts count one by one): lousho "
        f"{results['lousho']['commands_per_hop']:.1f}, floor {results['floor']['commands_per_hop']:.1f}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_hop", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "profile.md")
    parser.add_argument("--quick", action="store_true", help="tiny runs: a smoke test of this script")
    options = parser.parse_args(argv)
    sizes = QUICK if options.quick else Sizes()
    with redis_target() as (url, _), tempfile.TemporaryDirectory(prefix="lousho-profile-") as folder:
        results = {kind: profile(kind, url, Path(folder), sizes) for kind in ("lousho", "floor")}
    options.out.write_text(render(results, sizes))
    print(options.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
