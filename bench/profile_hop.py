"""Where a fleet hop's time goes (issue #20): `python -m bench.profile_hop [--out FILE] [--quick]`.

One solo worker process serves a batch of sessions queued at once, under cProfile from just after
it started serving them until they are done (started and stopped by signals: no worker start, no idle
wait in the profile); its own time by area, divided by the task hops, is the steady-state cost of one
hop by area: Celery's own machinery (celery, kombu, billiard, vine),
redis-py, waiting on sockets (Redis replies, the broker), JSON, pydantic, lousho, asyncio, and the
rest. The profile counts wall time, so on a busy machine every area grows. The same is measured for the
floor, a chain of bare Celery tasks on the same broker, the two taking turns (`Sizes.rounds` runs each,
the median of each figure). Redis commands per hop are counted by MONITOR (commands run inside a Lua script count one
by one, as INFO commandstats counts them), by command name. Writes a Markdown page (default:
docs/bench/profile.md): each area as ms per hop and as a share of the hop, the functions whose own
time per hop exceeds the floor's most, and the Redis commands.

cProfile slows Python code down and waiting not, so the areas' shares are a guide to what to change,
not figures to compare with `python -m bench`'s latencies.
"""

from __future__ import annotations

import argparse
import collections
import os
import pstats
import signal
import statistics
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
    sessions: int = 48
    """Sessions (or chains) of `turns` turns in the profiled run: 48 x 21 hops (about 1,000: a single hop's
    noise, a GC pause or a context switch, weighs little)."""
    rounds: int = 5
    """Profiled runs of each, lousho and the floor taking turns; each figure is the median of its rounds, so
    a burst of other work on a shared machine during one run moves it little."""


QUICK = Sizes(turns=2, sessions=3, rounds=1)
"""`--quick`, the CI smoke."""

KINDS = ("lousho", "floor")

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


def functions(profile: Path) -> dict[str, float]:
    """Own time (seconds) per function, named short: `package/module.py:line name`, or `~ name` for a C function."""
    stats: Any = pstats.Stats(str(profile))
    found: collections.Counter[str] = collections.Counter()
    for (path, line, name), (_, _, own_s, _, _) in stats.stats.items():
        short = "~" if path == "~" else "/".join(path.split("/")[-2:]) + f":{line}"
        found[f"{short} {name}"] += own_s
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


def commands_per_hop(fleet: Fleet, url: str, turns: int) -> dict[str, dict[str, float]]:
    """Commands the Redis server runs while one more session of `turns` turns runs (MONITOR), per hop, by name:
    `{"all": {name: n}, "lua": {name: n}}`, the second those a Lua script ran (MONITOR names its client `lua`)."""
    seen: list[tuple[float, str, bool]] = []
    started = threading.Event()
    stop = threading.Event()

    def monitor() -> None:
        with redis.Redis.from_url(url).monitor() as stream:  # type: ignore[no-untyped-call]
            started.set()
            for command in stream.listen():
                name = str(command["command"]).split(" ", 1)[0].lower()
                seen.append((command["time"], name, command.get("client_type") == "lua"))
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
    hops = 2 * turns + 1
    counted = collections.Counter(name for t, name, _ in seen if begin <= t <= end)
    in_lua = collections.Counter(name for t, name, lua in seen if lua and begin <= t <= end)
    return {
        "all": {name: count / hops for name, count in counted.most_common()},
        "lua": {name: count / hops for name, count in in_lua.items()},
    }


def one_round(fleet: Fleet, folder: Path, sizes: Sizes, index: int) -> dict[str, dict[str, float]]:
    """One profiled run of `fleet`: ms per hop by area and by function."""
    out = folder / f"{fleet.kind}-{index}.prof"
    elapsed_s = profiled_run(fleet, sizes.sessions, sizes.turns, out)
    hops = sizes.sessions * (2 * sizes.turns + 1)
    per_hop = {area: own_s * 1000 / hops for area, own_s in areas(out).items()}
    per_hop["not in the profile (the worker loop between tasks)"] = elapsed_s * 1000 / hops - sum(per_hop.values())
    return {"ms_per_hop": per_hop, "functions_ms_per_hop": {k: v * 1000 / hops for k, v in functions(out).items()}}


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each key's median over the rounds (0 in a round that lacks it)."""
    keys = {k for r in rounds for k in r}
    return {k: statistics.median(r.get(k, 0.0) for r in rounds) for k in keys}


def profile(url: str, folder: Path, sizes: Sizes) -> dict[str, dict[str, Any]]:
    """Per kind (lousho, the floor): the median of `sizes.rounds` profiled runs, the two kinds taking turns, and
    the Redis commands of one more session."""
    client = redis.Redis.from_url(url)
    fleets = {kind: Fleet(url, client, f"lousho-profile-{uuid.uuid4().hex[:8]}:", kind, str(folder)) for kind in KINDS}
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {kind: [] for kind in KINDS}
    try:
        for index in range(sizes.rounds):
            for kind, fleet in fleets.items():
                rounds[kind].append(one_round(fleet, folder, sizes, index))
        results: dict[str, dict[str, Any]] = {}
        for kind, fleet in fleets.items():
            fleet.scale(1)
            results[kind] = {
                name: medians([r[name] for r in rounds[kind]]) for name in ("ms_per_hop", "functions_ms_per_hop")
            }
            results[kind]["commands_per_hop"] = commands_per_hop(fleet, url, sizes.turns)
    finally:
        for fleet in fleets.values():
            fleet.close()
    return results


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"


def render(results: dict[str, dict[str, Any]], sizes: Sizes, top: int = 15) -> str:
    ours, floor = results["lousho"], results["floor"]
    names = sorted({a for r in results.values() for a in r["ms_per_hop"]}, key=lambda a: -ours["ms_per_hop"].get(a, 0))
    totals = {kind: sum(r["ms_per_hop"].values()) for kind, r in results.items()}
    lines = [
        "# Where a fleet hop's time goes",
        "",
        f"`python -m bench.profile_hop`, lousho at {revision()}: wall time per task hop under cProfile, by area, "
        f"steady state ({sizes.sessions} sessions of {sizes.turns} turns, {sizes.sessions * (2 * sizes.turns + 1)} "
        "hops, queued at once on one solo worker, profiled only while it serves them), against the floor (as many "
        f"chains of bare Celery tasks, same broker and settings); each figure the median of {sizes.rounds} such "
        "runs, lousho and the floor taking turns. cProfile slows Python code more than it slows "
        "waiting: read the shares, not the totals. The profile counts wall time: on a shared machine, time the "
        "worker lost to other processes lands in whatever area it was in, so every area grows with the load (load "
        f"average {os.getloadavg()[0]:.1f} at the end of this run); lousho and the floor taking turns meet the same "
        "load, so compare them within one page, not across runs.",
        "",
        "| area | lousho, ms per hop | share of lousho's hop | floor, ms per hop | share of the floor's hop | "
        "lousho - floor, ms |",
        "| - | - | - | - | - | - |",
    ]  # fmt: skip
    for name in names:
        mine, theirs = ours["ms_per_hop"].get(name, 0.0), floor["ms_per_hop"].get(name, 0.0)
        lines.append(
            f"| {name} | {mine:.3f} | {_share(mine, totals['lousho'])} | {theirs:.3f} | "
            f"{_share(theirs, totals['floor'])} | {mine - theirs:+.3f} |"
        )
    lines.append(
        f"| **all** | **{totals['lousho']:.3f}** | 100 % | **{totals['floor']:.3f}** | 100 % | "
        f"**{totals['lousho'] - totals['floor']:+.3f}** |"
    )
    extra = {k: v - floor["functions_ms_per_hop"].get(k, 0.0) for k, v in ours["functions_ms_per_hop"].items()}
    lines += [
        "",
        f"The {top} functions whose own time per hop exceeds the floor's most (ms per hop, under cProfile; "
        "`~` is a C function):",
        "",
        "| function | lousho | floor | lousho - floor |",
        "| - | - | - | - |",
    ]
    for key, value in sorted(extra.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(
            f"| `{key}` | {ours['functions_ms_per_hop'][key]:.3f} | "
            f"{floor['functions_ms_per_hop'].get(key, 0.0):.3f} | {value:+.3f} |"
        )
    commands = {kind: r["commands_per_hop"]["all"] for kind, r in results.items()}
    in_lua = {kind: r["commands_per_hop"]["lua"] for kind, r in results.items()}
    count = {kind: sum(c.values()) for kind, c in commands.items()}
    lines += [
        "",
        f"Redis commands per hop (MONITOR over one more session or chain of {sizes.turns} turns; commands inside Lua "
        f"scripts count one by one): lousho {count['lousho']:.1f} ({sum(in_lua['lousho'].values()):.1f} of them run "
        f"by its scripts), floor {count['floor']:.1f}.",
        "",
        "| command | lousho, per hop | of which inside a Lua script | floor, per hop |",
        "| - | - | - | - |",
    ]
    for name in sorted(set(commands["lousho"]) | set(commands["floor"]), key=lambda n: -commands["lousho"].get(n, 0)):
        lines.append(
            f"| {name} | {commands['lousho'].get(name, 0.0):.2f} | {in_lua['lousho'].get(name, 0.0):.2f} | "
            f"{commands['floor'].get(name, 0.0):.2f} |"
        )
    lines.append("")
    return "\n".join(lines)


KEPT = "<!-- Above: written by `python -m bench.profile_hop`. Below: notes kept as written when it runs again. -->"


def with_kept_notes(table: str, out: Path) -> str:
    """The new table, then whatever the page held below KEPT (what a reader made of an earlier run, dated there)."""
    old = out.read_text(encoding="utf-8") if out.exists() else ""
    return table + ("\n" + KEPT + old.split(KEPT, 1)[1] if KEPT in old else "")  # a blank line ends the table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_hop", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "profile.md")
    parser.add_argument("--quick", action="store_true", help="tiny runs: a smoke test of this script")
    options = parser.parse_args(argv)
    sizes = QUICK if options.quick else Sizes()
    with redis_target() as (url, _), tempfile.TemporaryDirectory(prefix="lousho-profile-") as folder:
        results = profile(url, Path(folder), sizes)
    options.out.write_text(with_kept_notes(render(results, sizes), options.out), encoding="utf-8")
    print(options.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
