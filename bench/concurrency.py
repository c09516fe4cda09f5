"""The waiting workload on a fleet (issue #29): N sessions, each a model turn (1 s), a tool call (0.5 s) and a
model turn (1 s), on at most 2 worker processes, against bare Celery tasks with the same sleeps chained the same
way on Celery's threads pool: same broker, same Celery settings, same slots per process, in the same run. A third
side runs the floor's tasks on lousho's pool (`pooled`), so the page tells what the pool costs from what a lousho
step adds.

    python -m bench.concurrency [--quick] [--sizes 100,1000,5000] [--rounds 3] [--model-s 1.0] [--tool-s 0.5] [--out DIR]

Reports, per N and side: the wall time from the first enqueue to the last session's end, the most calls in
flight in one process (counted by each process as its tasks start and end: `task_prerun`/`task_postrun`), and
memory per in-flight session (the growth of each process's RSS over its idle RSS, divided by the calls it held
at that moment, taken at the sample with the most in flight). Each side runs `--rounds` times at each size (default
3), in turn; each figure is its median. Writes DIR/concurrency.md and DIR/concurrency.json
(default docs/bench; `--quick`: docs/bench/quick, N = 100 only). `--model-s` and `--tool-s` set the sleeps (models
that take 10 s are common: then the work in flight beats its leases, which 1 s turns never do; such a run writes
concurrency-<model_s>s.md and .json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from bench.common import ROOT, machine, redis_target, revision
from lousho.fleet.settings import celery_config
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.testing.workers import WorkerProcess, start_worker
from lousho.worker import FleetSettings, broker_url

PROCESSES = 2
SIDES = {
    "lousho": ("bench.waiting_app:app", "lousho"),
    "floor": ("bench.waiting_app:floor", "threads"),
    "pooled": ("bench.waiting_app:pooled", "lousho"),  # the floor's tasks on lousho's pool: the pool's own cost
}
ENQUEUERS = 8
"""Threads sending the sessions, on both sides (a web app's many request handlers)."""


def _hash(client: redis.Redis, key: str) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = client.hgetall(key)  # type: ignore[assignment]
    return found


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_figures(client: redis.Redis) -> tuple[float, int]:
    """Redis's CPU seconds so far, and the commands it has processed (each command inside a script counts too)."""
    info: dict[str, Any] = client.info()  # type: ignore[assignment]
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), int(info["total_commands_processed"])


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Sampler:
    """Samples each worker's RSS and its calls in flight (as the process counts them) every 50 ms."""

    client: redis.Redis
    key: str
    workers: list[WorkerProcess]
    samples: list[tuple[int, int, int]] = field(default_factory=list)
    """(pid, rss kB, calls in flight)"""
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(0.05):
            in_flight = {int(k): int(v) for k, v in _hash(self.client, self.key).items()}
            for worker in self.workers:
                self.samples.append((worker.pid, rss_kb(worker.pid), in_flight.get(worker.pid, 0)))

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Sleeps:
    """How long each model turn and the tool call of a session take (`bench.waiting_app`)."""

    model_s: float = 1.0
    tool_s: float = 0.5


def measure(url: str, side: str, sessions: int, log_dir: str, sleeps: Sleeps = Sleeps()) -> dict[str, Any]:
    app_spec, pool = SIDES[side]
    prefix, queue = f"lousho-bench-{uuid.uuid4().hex[:8]}:", f"lousho-bench-wait-{uuid.uuid4().hex[:8]}"
    env = {"LOUSHO_BENCH_REDIS": url, "LOUSHO_BENCH_PREFIX": prefix, "LOUSHO_BENCH_QUEUE": queue,
           "LOUSHO_BENCH_MODEL_S": str(sleeps.model_s), "LOUSHO_BENCH_TOOL_S": str(sleeps.tool_s),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    slots = math.ceil(sessions / PROCESSES)
    client = redis.Redis.from_url(url)
    with ThreadPoolExecutor(PROCESSES) as pool_of_starts:
        starts = [
            pool_of_starts.submit(
                start_worker,
                app_spec,
                queue=queue,
                name=f"{side}-{n}",
                env=env,
                cwd=str(ROOT),
                pool=pool,
                concurrency=slots,
                log_dir=log_dir,
            )
            for n in range(PROCESSES)
        ]
        workers = [start.result() for start in starts]
    try:
        time.sleep(1.0)  # settled: imports done, connections open
        idle = {w.pid: rss_kb(w.pid) for w in workers}
        cpu_before, (redis_before, commands_before) = sum(cpu_s(w.pid) for w in workers), redis_figures(client)
        send = _sender(url, side, prefix, queue)
        with Sampler(client, f"{prefix}bench:in-flight", workers) as sampler:
            started = time.perf_counter()
            with ThreadPoolExecutor(ENQUEUERS) as senders:
                list(senders.map(send, (f"s{n}" for n in range(sessions))))
            enqueued = time.perf_counter() - started
            done = _wait_done(client, f"{prefix}bench:done", sessions)
            wall = time.perf_counter() - started
        redis_after, commands_after = redis_figures(client)
        worker_cpu, redis_cpu = sum(cpu_s(w.pid) for w in workers) - cpu_before, redis_after - redis_before
        most = {int(k): int(v) for k, v in _hash(client, f"{prefix}bench:most-in-flight").items()}
        return {
            "sessions": sessions, "wall_s": wall, "enqueue_s": enqueued, "finished": done, "slots": slots,
            "most_in_flight": max(most.values(), default=0), "most_in_flight_by_pid": most,
            "kb_per_session": _kb_per_session(sampler.samples, idle), "idle_rss_kb": idle,
            "worker_cpu_ms_per_session": 1000 * worker_cpu / sessions, "redis_cpu_ms_per_session": 1000 * redis_cpu / sessions,
            "redis_commands_per_session": (commands_after - commands_before) / sessions,
        }  # fmt: skip
    finally:
        for worker in workers:
            worker.stop(timeout_s=60)
        _forget(client, prefix, queue)


def _sender(url: str, side: str, prefix: str, queue: str) -> Any:
    if side == "lousho":
        lousho = Client(
            broker=broker_url(url), store=RedisStore(url, prefix=prefix), settings=FleetSettings(queue=queue)
        )
        return lambda session: lousho.enqueue("waiting", "wait for me", session_id=session)
    sender = Celery("lousho-waiting-floor-client", set_as_current=False)
    sender.conf.update(celery_config(broker_url(url), FleetSettings(queue=queue)))
    task = "bench.waiting_step" if side == "floor" else "bench.waiting_pooled_step"
    return lambda session: sender.send_task(  # as bench.waiting_app.send_step
        task, args=[session, 0], task_id=f"{session}/step/0", queue=queue
    )


def _wait_done(client: redis.Redis, key: str, sessions: int) -> int:
    done = 0
    while done < sessions:
        if client.blpop([key], timeout=300) is None:
            break
        done += 1
    return done


def _kb_per_session(samples: list[tuple[int, int, int]], idle: dict[int, int]) -> float | None:
    """Per process, its RSS growth over idle divided by its calls in flight at its busiest sample; their median."""
    figures = []
    for pid, base in idle.items():
        mine = [(rss, held) for p, rss, held in samples if p == pid and held > 0]
        if mine:
            rss, held = max(mine, key=lambda s: (s[1], s[0]))
            figures.append((rss - base) / held)
    return sorted(figures)[len(figures) // 2] if figures else None


def _forget(client: redis.Redis, prefix: str, queue: str) -> None:
    for key in client.scan_iter(f"{prefix}*", count=1000):
        client.delete(key)
    for key in client.scan_iter(f"{queue}*", count=1000):  # the queue, its priority lists, its rejected list
        client.delete(key)
    client.delete(f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")  # kombu's records of its binding
    client.delete(queue)


def markdown(results: dict[str, Any]) -> str:
    machine_ = results["machine"]
    return "\n".join([
        "# The waiting workload: many sessions in flight per process (issue #29)",
        "",
        f"{machine_['nproc']} CPUs ({machine_['cpu']}), {machine_['memory']}; lousho at {results['revision']}; "
        f"`python -m bench.concurrency{' --quick' if results['mode'] == 'quick' else ''}{_sleep_flags(results)}`.",
        "",
        *section(results),
    ]) + "\n"  # fmt: skip


def _sleep_flags(results: dict[str, Any]) -> str:
    sleeps = Sleeps(model_s=results.get("model_s", 1.0), tool_s=results.get("tool_s", 0.5))
    return "" if sleeps == Sleeps() else f" --model-s {sleeps.model_s:g} --tool-s {sleeps.tool_s:g}"


def section(found: dict[str, Any]) -> list[str]:
    """The table, for this file's page and `python -m bench`'s."""
    lines = [
        f"Each session: a model turn ({found.get('model_s', 1.0):g} s), a tool call ({found.get('tool_s', 0.5):g} s), "
        f"a model turn ({found.get('model_s', 1.0):g} s). {found['processes']} worker "
        "processes on each side, each with as many slots as half the sessions. The floor: bare Celery tasks with the "
        "same sleeps, chained the same way, on `-P threads`, same broker and settings. Most in flight: counted by "
        "each process as its tasks start and end. KB per in-flight session: a process's RSS growth over its idle "
        "RSS, divided by the calls it held then, at its busiest moment. CPU and Redis commands a session: the "
        "workers' CPU time and Redis's processed commands (each command inside a script too) over the run, divided by the sessions."
        f"{_rounds_note(found)}",
        "",
        "| sessions | lousho wall | floor wall | ratio (goal <= 1.0) | lousho most in flight / process "
        "| floor most in flight / process | lousho KB / in-flight session | floor KB / in-flight session "
        "| ratio (goal <= 0.5) | finished (lousho / floor) | worker CPU ms / session (lousho / floor) "
        "| Redis commands / session (lousho / floor) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in found["rows"]:
        ours, floor = row["lousho"], row["floor"]
        lines.append(
            f"| {row['sessions']} | {ours['wall_s']:.2f} s | {floor['wall_s']:.2f} s "
            f"| {ours['wall_s'] / floor['wall_s']:.2f} | {ours['most_in_flight']} | {floor['most_in_flight']} "
            f"| {_kb(ours['kb_per_session'])} | {_kb(floor['kb_per_session'])} | {_memory_ratio(row)} "
            f"| {ours['finished']} / {floor['finished']} "
            f"| {ours['worker_cpu_ms_per_session']:.1f} / {floor['worker_cpu_ms_per_session']:.1f} "
            f"| {ours['redis_commands_per_session']:.0f} / {floor['redis_commands_per_session']:.0f} |"
        )
    return [*lines, "", *_pool_alone(found["rows"])]


def _rounds_note(found: dict[str, Any]) -> str:
    rounds = found.get("rounds", 1)
    return f" Each figure: its median over {rounds} rounds of each side, run in turn." if rounds > 1 else ""


def _pool_alone(rows: list[dict[str, Any]]) -> list[str]:
    """The floor's tasks on lousho's pool (`pooled`): what the pool costs, and what a lousho step adds to it."""
    rows = [row for row in rows if "pooled" in row]
    if not rows:
        return []
    lines = [
        "The pool alone: the floor's tasks (the same sleeps, awaited) on lousho's pool, 2 processes, same slots. "
        "What a lousho step adds is lousho's figure less this one.",
        "",
        "| sessions | wall | / floor's | most in flight / process | KB / in-flight session | / floor's "
        "| a lousho step adds, KB | worker CPU ms / session |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        pooled, floor, ours = row["pooled"], row["floor"], row["lousho"]
        kb, floor_kb, ours_kb = pooled["kb_per_session"], floor["kb_per_session"], ours["kb_per_session"]
        lines.append(
            f"| {row['sessions']} | {pooled['wall_s']:.2f} s | {pooled['wall_s'] / floor['wall_s']:.2f} "
            f"| {pooled['most_in_flight']} | {_kb(kb)} | {f'{kb / floor_kb:.2f}' if kb and floor_kb else 'n/a'} "
            f"| {f'{ours_kb - kb:.1f}' if kb and ours_kb else 'n/a'} | {pooled['worker_cpu_ms_per_session']:.1f} |"
        )
    return [*lines, ""]


def _memory_ratio(row: dict[str, Any]) -> str:
    ours, floor = row["lousho"]["kb_per_session"], row["floor"]["kb_per_session"]
    return f"{ours / floor:.2f}" if ours and floor else "n/a"


def _kb(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "n/a"


def run(url: str, sizes: tuple[int, ...], sleeps: Sleeps = Sleeps(), rounds: int = 1) -> dict[str, Any]:
    """Each side at each size, `rounds` times (the sides in turn, the floor first): each figure is its median over
    the rounds, and every round is kept (`rounds`); the section `python -m bench` keeps as "concurrency"."""
    log_dir = tempfile.mkdtemp(prefix="lousho-bench-")
    rows: list[dict[str, Any]] = []
    for sessions in sizes:
        taken: dict[str, list[dict[str, Any]]] = {side: [] for side in ("floor", "pooled", "lousho")}
        for _round in range(rounds):
            for side, runs in taken.items():
                runs.append(measure(url, side, sessions, log_dir, sleeps))
                print(f"{side:6} N={sessions}: {runs[-1]['wall_s']:.2f} s, most in flight "
                      f"{runs[-1]['most_in_flight']}, {_kb(runs[-1]['kb_per_session'])} KB/session", flush=True)  # fmt: skip
        rows.append({"sessions": sessions, **{side: _medians(runs) for side, runs in taken.items()}})
    return {"processes": PROCESSES, "rows": rows, "model_s": sleeps.model_s, "tool_s": sleeps.tool_s, "rounds": rounds}


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's figures over its rounds: the median of each; sessions finished, the fewest of any round. A
    process's busiest moment lands in the first wave of sessions or a later one, and its RSS per session with it
    (the floor's ranged 39-67 KB between identical runs at 1,000; issue #29): one round is one draw."""
    figures: dict[str, Any] = {"rounds": runs, "finished": min(run["finished"] for run in runs)}
    for name in ("wall_s", "enqueue_s", "slots", "most_in_flight", "kb_per_session", "worker_cpu_ms_per_session",
                 "redis_cpu_ms_per_session", "redis_commands_per_session"):  # fmt: skip
        values = [run[name] for run in runs if run[name] is not None]
        figures[name] = statistics.median(values) if values else None
    figures["sessions"] = runs[0]["sessions"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N = 100 only; writes docs/bench/quick")
    parser.add_argument("--sizes", default=None, help="comma-separated session counts (default 100,1000,5000)")
    parser.add_argument("--model-s", type=float, default=1.0, help="each model turn's latency (default 1.0)")
    parser.add_argument("--tool-s", type=float, default=0.5, help="the tool call's sleep (default 0.5)")
    parser.add_argument("--rounds", type=int, default=None, help="runs of each side at each size, figures their "
                        "median (default 3; --quick: 1)")  # fmt: skip
    parser.add_argument("--out", default=None)
    options = parser.parse_args()
    sizes = tuple(int(s) for s in (options.sizes or ("100" if options.quick else "100,1000,5000")).split(","))
    out = Path(options.out or (ROOT / "docs" / "bench" / ("quick" if options.quick else "")))
    out.mkdir(parents=True, exist_ok=True)
    sleeps = Sleeps(model_s=options.model_s, tool_s=options.tool_s)
    with redis_target() as (url, _where):
        section = run(url, sizes, sleeps, options.rounds or (1 if options.quick else 3))
    results = {"mode": "quick" if options.quick else "full", "machine": machine(), "revision": revision(), **section}
    name = "concurrency" if sleeps == Sleeps() else f"concurrency-{sleeps.model_s:g}s"
    (out / f"{name}.json").write_text(json.dumps(results, indent=2))
    (out / f"{name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
