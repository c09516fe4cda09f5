"""Where a fleet hop's time goes (issue #20): `python -m bench.profile_hop [--out FILE] [--quick]`.

One solo worker process serves a batch of sessions queued at once, under cProfile from just after
it started serving them until they are done (started and stopped by signals: no worker start, no idle
wait in the profile); its own time by area, divided by the task hops, is the steady-state cost of one
hop by area: Celery's own machinery (celery, kombu, billiard, vine),
redis-py, waiting on sockets (Redis replies, the broker), JSON, pydantic, lousho, asyncio, and the
rest. The profile counts wall time, so on a busy machine every area grows a little and the waiting most. The same is measured for the floor: a chain of bare Celery tasks on the same
broker. Redis commands per hop are counted by MONITOR (commands run inside a Lua script count one
by one, as INFO commandstats counts them). Writes a Markdown table (default: docs/bench/profile.md).

cProfile slows Python code down and waiting not, so the areas' shares are a guide to what to change,
not figures to compare with `python -m bench`'s latencies.
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

from bench.common import PROFILE_START, PROFILE_STOP, ROOT, redis_target, revision
from bench.fleet import Fleet


@dataclass(frozen=True, kw_only=True)
class Sizes:
    turns: int = 10
    sessions: int = 24
    """Sessions (or chains) of `turns` turns in the profiled run: 24 x 21 hops."""


QUICK = Sizes(turns=2, sessions=3)
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


def profiled_run(fleet: Fleet, sessions: int, turns: int, out: Path) -> float:
    """A solo worker serves one warm-up session; then cProfile runs in it (`bench.common.profile_between_signals`)
    while it serves `sessions` sessions enqueued at once, so the queue is never empty and the profile holds
    neither the worker's start nor idle waits; SIGTERM ends it."""
    command = [
        sys.executable, "-m", "celery", "-A", {"lousho": "bench.fleet_app", "floor": "bench.floor_app"}[fleet.kind],
        "worker", "-P", "solo", "-Q", fleet.queue, "-n", f"profile-{uuid.uuid4().hex[:6]}@%h",
        "--without-mingle", "--without-gossip", "-l", "INFO",
    ]  # fmt: skip
    log_path = Path(fleet.log_dir) / f"{out.stem}.log"
    env = {**os.environ, **fleet.env, "LOUSHO_BENCH_PROFILE": str(out)}
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while " ready." not in log_path.read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the profiled worker did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        fleet.start(f"warm-{uuid.uuid4().hex[:6]}", 2)
        fleet.wait_done(1, timeout_s=120)
        names = [f"s-{uuid.uuid4().hex[:8]}" for _ in range(sessions)]
        for name in names[:2]:  # queued before the profile starts: the worker never waits inside it
            fleet.start(name, turns)
        worker.send_signal(PROFILE_START)
        started = time.monotonic()
        for name in names[2:]:
            fleet.start(name, turns)
        fleet.wait_done(sessions, timeout_s=300)
        elapsed_s = time.monotonic() - started
        worker.send_signal(PROFILE_STOP)
        while not out.exists() and worker.poll() is None:
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=120)
    return elapsed_s


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
    out = folder / f"{kind}.prof"
    elapsed_s = profiled_run(fleet, sizes.sessions, sizes.turns, out)
    fleet.scale(1)
    per_hop_commands = commands_per_hop(fleet, url, sizes.turns)
    fleet.close()
    hops = sizes.sessions * (2 * sizes.turns + 1)
    per_hop = {area: own_s * 1000 / hops for area, own_s in areas(out).items()}
    per_hop["not in the profile (the worker loop between tasks)"] = elapsed_s * 1000 / hops - sum(per_hop.values())
    return {"ms_per_hop": per_hop, "commands_per_hop": per_hop_commands}


def render(results: dict[str, dict[str, Any]], sizes: Sizes) -> str:
    names = sorted(
        {a for r in results.values() for a in r["ms_per_hop"]}, key=lambda a: -results["lousho"]["ms_per_hop"].get(a, 0)
    )
    lines = [
        "# Where a fleet hop's time goes",
        "",
        f"`python -m bench.profile_hop`, lousho at {revision()}: wall time per task hop under cProfile, by area, "
        f"steady state ({sizes.sessions} sessions of {sizes.turns} turns queued at once on one solo worker, profiled only "
        "while it serves them), "
        "against the floor (a chain of bare Celery tasks, same broker and settings). cProfile slows Python "
        "code more than it slows waiting: read the shares, not the totals. Waiting on sockets grows with the "
        f"machine's load (load average {os.getloadavg()[0]:.1f} at the end of this run); the CPU areas hold still "
        "from run to run.",
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
