"""2, 3 and 5: the fleet on real Celery worker processes (solo pool) and Redis.

2. Per-step latency: one session of `turns` tool turns through the fleet, from
   `Client.enqueue` to its finished save, divided by its task hops (2 x turns + 1: each
   model turn and each tool call is a task); against the floor, a bare Celery task that
   enqueues the next one (`bench.floor_app`: same broker, same settings), a chain of the
   same number of hops. Repeats alternate between the two; each is a fresh session.
3. Throughput: `sessions` sessions enqueued at once, with 1, 2 and 4 worker processes;
   sessions/s and steps/s (task hops/s) from the first enqueue to the last finished save;
   and the floor's chains on as many floor workers.
4. (growth.py)
5. Recovery: a session whose first tool call runs long; its worker is SIGKILLed mid call (at
   a random point of the heartbeat period); measured from the kill to the session's next
   task starting on another worker (the reaper's `advance`) and to the killed call starting
   again. Reaper: `run_reaper` in a thread, as `lousho reaper` runs it: a pass every
   `reaper_interval_s` and a sweep for dead worker processes every `death_check_interval_s`.
   With `FleetSettings()` (lease 6 s, reaper 2 s, death check 0.25 s) and tuned (lease 1 s, reaper 0.5 s).

Worker processes are started by `lousho.testing.workers.start_worker` and all ended (by pid)
when the section ends; every key and queue the benchmark made is deleted.
"""

from __future__ import annotations

import json
import random
import signal
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery

from bench.common import ROOT, delete_prefix, stats
from lousho.fleet.settings import celery_config
from lousho.scheduler import Client, run_reaper
from lousho.stores.redis import RedisStore
from lousho.testing.workers import WorkerProcess, start_worker
from lousho.worker import FleetSettings, broker_url

APPS = {"lousho": "bench.fleet_app", "floor": "bench.floor_app"}
OUTBOX_OFF = "lousho, outbox off"


@dataclass
class Fleet:
    """Workers of one app on one queue, and the means to feed and watch them."""

    url: str
    client: redis.Redis
    prefix: str
    kind: str
    log_dir: str
    extra_env: dict[str, str] = field(default_factory=dict)
    label: str = ""
    """How the results name this fleet (default: its kind)."""
    settings: FleetSettings = field(default_factory=FleetSettings)
    workers: list[WorkerProcess] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    """Sessions the reaper requeued (a lousho fleet always runs one, as a deployment runs beat)."""

    def __post_init__(self) -> None:
        self.label = self.label or self.kind
        self.queue = f"lousho-bench-{self.kind}-{uuid.uuid4().hex[:8]}"
        self.settings = FleetSettings(
            lease_ttl_s=self.settings.lease_ttl_s, reaper_interval_s=self.settings.reaper_interval_s, queue=self.queue
        )
        self.store = RedisStore(self.client, prefix=self.prefix)
        if self.kind == "lousho":
            self.lousho = Client(broker=broker_url(self.url), store=self.store, settings=self.settings)
            self.app: Celery = self.lousho.app
        else:
            self.app = Celery("lousho-floor-client", set_as_current=False)
            self.app.conf.update(celery_config(broker_url(self.url), self.settings))

    @property
    def env(self) -> dict[str, str]:
        return {
            "LOUSHO_BENCH_REDIS": self.url,
            "LOUSHO_BENCH_PREFIX": self.prefix,
            "LOUSHO_BENCH_QUEUE": self.queue,
            "PYTHONPATH": str(ROOT),
            **self.extra_env,
        }

    def scale(self, count: int) -> None:
        """Exactly `count` live workers (new ones started in parallel, waited for until ready)."""
        self.workers = [w for w in self.workers if w.alive()]
        while len(self.workers) > count:
            self.workers.pop().stop()
        missing = count - len(self.workers)
        if missing > 0:
            with ThreadPoolExecutor(missing) as pool:
                names = [f"{self.kind}-{uuid.uuid4().hex[:6]}" for _ in range(missing)]
                self.workers += list(pool.map(self._start, names))

    def _start(self, name: str) -> WorkerProcess:
        return start_worker(
            APPS[self.kind], queue=self.queue, name=name, env=self.env, cwd=str(ROOT), log_dir=self.log_dir
        )

    def key(self, name: str) -> str:
        return f"{self.prefix}bench:{name}"

    def start(self, name: str, turns: int, sleep_s: float = 0.0) -> None:
        """Start session (or chain) `name`: `turns` tool turns = 2 x turns + 1 task hops."""
        if self.kind == "lousho":
            spec = f"turns={turns}" + (f" sleep={sleep_s}" if sleep_s else "")
            self.lousho.enqueue("bench", spec, session_id=name)
        else:
            hops = 2 * turns + 1  # as bench.floor_app.send_hop
            self.app.send_task("bench.hop", args=[name, hops], task_id=f"{name}/hop/{hops}", queue=self.queue)

    def wait_done(self, count: int, timeout_s: float) -> list[dict[str, Any]]:
        """The next `count` 'done' records (session or chain, and the worker's time.time())."""
        done_key = self.key("done" if self.kind == "lousho" else "floor-done")
        found = []
        deadline = time.monotonic() + timeout_s
        while len(found) < count:
            left = deadline - time.monotonic()
            popped = self.client.blpop([done_key], timeout=max(0.1, min(left, 5.0))) if left > 0 else None
            if popped is None:
                if left <= 0:
                    raise TimeoutError(
                        f"{self.kind}: {len(found)} of {count} done after {timeout_s:.0f} s; "
                        f"worker log tail:\n{self.log_tail()}"
                    )
                continue
            found.append(json.loads(popped[1]))
        return found

    def log_tail(self) -> str:
        return "\n".join(f"--- {w.name} ---\n{w.log()[-1500:]}" for w in self.workers)

    def start_reaper(self) -> None:
        """`lousho reaper`'s loop (`run_reaper`) in a thread of this process: a pass every `reaper_interval_s`,
        a sweep for dead worker processes every `death_check_interval_s`."""
        self._stop = threading.Event()

        def loop() -> None:
            run_reaper(self.store, self.app, self.settings, stop=self._stop, on_requeued=self.requeued.extend)

        self._reaper = threading.Thread(target=loop, name=f"bench-reaper-{self.queue}", daemon=True)
        self._reaper.start()

    def close(self) -> None:
        if getattr(self, "_reaper", None) is not None:
            self._stop.set()
            self._reaper.join(timeout=10)
            self._reaper = None
        for worker in self.workers:
            worker.stop(timeout_s=10)
        self.workers = []
        forget_queue(self.client, self.queue)


def forget_queue(client: redis.Redis, queue: str) -> None:
    """Delete a queue's keys, kombu's binding for it, and its messages left unacked by killed workers."""
    client.delete(queue, *(f"{queue}\x06\x16{p}" for p in (1, 2, 3, 4, 5, 6, 7, 8, 9)), f"_kombu.binding.{queue}")
    for tag, raw in client.hscan_iter("unacked"):
        if queue.encode() in raw:
            client.hdel("unacked", tag)
            client.zrem("unacked_index", tag)


# -- 2. latency --------------------------------------------------------------------------------


def latency(ours: Fleet, floor: Fleet, sent: Fleet, turns: int, repeats: int) -> dict[str, Any]:
    """`sent`: lousho with `FleetSettings(outbox=False)`, every step through `app.send_task` as the
    floor's hops are: a reference row, so the table shows what the outbox is worth."""
    fleets = [ours, floor, sent]
    for fleet in fleets:
        fleet.scale(1)
    per_hop: dict[str, list[float]] = {fleet.label: [] for fleet in fleets}
    hops = 2 * turns + 1
    for repeat in range(repeats + 1):  # the first is a warm-up
        for fleet in fleets[repeat % 3 :] + fleets[: repeat % 3]:  # each goes first in turn
            name = f"lat-{uuid.uuid4().hex[:10]}"
            started = time.time()
            fleet.start(name, turns)
            (done,) = fleet.wait_done(1, timeout_s=60 + hops)
            if repeat:
                per_hop[fleet.label].append((done["t"] - started) * 1000 / hops)
    ratios = [o / f for o, f in zip(per_hop["lousho"], per_hop["floor"], strict=True)]
    sent_ratios = [o / f for o, f in zip(per_hop[sent.label], per_hop["floor"], strict=True)]
    return {
        "turns": turns,
        "hops": hops,
        "repeats": repeats,
        "per_hop_ms": {k: stats(v) for k, v in per_hop.items()},
        "ratio": stats(ratios),
        "ratio_outbox_off": stats(sent_ratios),
        "redis_commands_per_hop": {f.kind: commands_per_hop(f, turns) for f in (ours, floor)},
        "reaper_requeues": len(ours.requeued),
    }


def commands_per_hop(fleet: Fleet, turns: int) -> dict[str, Any]:
    """Redis commands per task hop in one more (untimed) session: INFO commandstats before and after; and round
    trips per hop: the server's read events (INFO stats `total_reads_processed`: a command, a pipeline or a script
    sent at once is read in one, as a client waits for its reply before it sends more). On a shared REDIS_URL server
    this counts other clients' commands too."""

    def calls() -> dict[str, int]:
        found = fleet.client.info("commandstats")
        counted = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in found.items()}  # type: ignore[index]
        return {**counted, READS: int(fleet.client.info("stats")["total_reads_processed"])}

    before = calls()
    fleet.start(f"cmd-{uuid.uuid4().hex[:10]}", turns)
    fleet.wait_done(1, timeout_s=120)
    after = calls()
    hops = 2 * turns + 1
    # less this function's own two reads (INFO stats after INFO commandstats)
    round_trips = (after.pop(READS) - before.pop(READS) - 2) / hops
    delta = {name: (after[name] - before.get(name, 0)) / hops for name in after if after[name] > before.get(name, 0)}
    top = dict(sorted(delta.items(), key=lambda item: -item[1])[:8])
    return {
        "total": sum(delta.values()),
        "top": {name: round(value, 2) for name, value in top.items()},
        "round_trips": round_trips,
    }


READS = "~reads"
"""`commands_per_hop`'s key for the server's read events (no command is named so)."""


# -- 3. throughput -----------------------------------------------------------------------------


def throughput(
    ours: Fleet, floor: Fleet, worker_counts: list[int], sessions: int, turns: int, repeats: int
) -> dict[str, Any]:
    hops = sessions * (2 * turns + 1)
    result: dict[str, Any] = {"sessions": sessions, "turns": turns, "hops": hops, "repeats": repeats, "by_workers": {}}
    for count in worker_counts:
        ours.scale(count)
        floor.scale(count)
        elapsed: dict[str, list[float]] = {"lousho": [], "floor": []}
        requeued_before = len(ours.requeued)
        for repeat in range(repeats):
            for fleet in (floor, ours) if repeat % 2 else (ours, floor):
                started = time.time()
                for index in range(sessions):
                    fleet.start(f"tp-{count}-{repeat}-{index}-{uuid.uuid4().hex[:6]}", turns)
                done = fleet.wait_done(sessions, timeout_s=120 + hops / 20)
                elapsed[fleet.kind].append(max(d["t"] for d in done) - started)
        result["by_workers"][str(count)] = {
            kind: {
                "sessions_per_s": stats([sessions / s for s in seconds]),
                "steps_per_s": stats([hops / s for s in seconds]),
                "seconds": stats(seconds),
            }
            for kind, seconds in elapsed.items()
        }
        result["by_workers"][str(count)]["reaper_requeues"] = len(ours.requeued) - requeued_before
    return result


# -- 5. recovery -------------------------------------------------------------------------------


def recovery(
    url: str,
    client: redis.Redis,
    prefix: str,
    log_dir: str,
    name: str,
    settings: FleetSettings,
    repeats: int,
    seed: int = 7,
) -> dict[str, Any]:
    """SIGKILL the worker running a tool call; time until the session's next task and the call restart."""
    env = {
        "LOUSHO_BENCH_LEASE_TTL_S": str(settings.lease_ttl_s),
        "LOUSHO_BENCH_REAPER_S": str(settings.reaper_interval_s),
        "LOUSHO_BENCH_TRACE": "1",
    }
    fleet = Fleet(url, client, prefix, "lousho", log_dir, extra_env=env, settings=settings)
    rng = random.Random(seed)
    next_task: list[float] = []
    call_again: list[float] = []
    try:
        fleet.scale(2)
        fleet.start_reaper()
        for _ in range(repeats):
            session = f"rec-{uuid.uuid4().hex[:10]}"
            fleet.start(session, turns=1, sleep_s=300)
            popped = client.blpop([fleet.key(f"starts:{session}")], timeout=60)
            if popped is None:
                raise TimeoutError(f"the tool call never started:\n{fleet.log_tail()}")
            victim = next(w for w in fleet.workers if w.pid == json.loads(popped[1])["pid"])
            time.sleep(0.1 + rng.uniform(0, fleet.settings.heartbeat_s))  # anywhere in the heartbeat period
            killed = time.time()
            victim.kill(signal.SIGKILL)
            limit = settings.lease_ttl_s + settings.reaper_interval_s + 60
            again = client.blpop([fleet.key(f"starts:{session}")], timeout=limit)
            if again is None:
                raise TimeoutError(f"the killed call did not start again within {limit:.0f} s:\n{fleet.log_tail()}")
            call_again.append(json.loads(again[1])["t"] - killed)
            tasks = [json.loads(raw) for raw in client.lrange(fleet.key(f"tasks:{session}"), 0, -1)]
            next_task.append(min(t["t"] for t in tasks if t["t"] > killed) - killed)
            fleet.wait_done(1, timeout_s=60)
            fleet.scale(2)  # a new worker in place of the dead one (outside the timing)
    finally:
        fleet.close()
    bound = settings.lease_ttl_s + settings.reaper_interval_s
    return {
        "name": name,
        "lease_ttl_s": settings.lease_ttl_s,
        "reaper_interval_s": settings.reaper_interval_s,
        "heartbeat_s": settings.heartbeat_s,
        "bound_s": bound,
        "repeats": repeats,
        "next_task_s": stats(next_task),
        "call_again_s": stats(call_again),
    }


# -- the sections ------------------------------------------------------------------------------


def run(url: str, parts: set[str], config: Any) -> dict[str, Any]:
    """The fleet sections among `parts` ('latency', 'throughput', 'recovery')."""
    client = redis.Redis.from_url(url)
    prefix = f"lousho-bench-{uuid.uuid4().hex[:8]}:"
    result: dict[str, Any] = {}
    log_dir = tempfile.TemporaryDirectory(prefix="lousho-bench-workers-")
    ours = Fleet(url, client, prefix, "lousho", log_dir.name)
    floor = Fleet(url, client, prefix, "floor", log_dir.name)
    sent = Fleet(
        url, client, f"{prefix}sent:", "lousho", log_dir.name, label=OUTBOX_OFF, extra_env={"LOUSHO_BENCH_OUTBOX": "0"}
    )
    try:
        ours.start_reaper()
        sent.start_reaper()
        if "latency" in parts:
            result["latency"] = latency(ours, floor, sent, config.latency_turns, config.latency_repeats)
        sent.close()
        if "throughput" in parts:
            result["throughput"] = throughput(
                ours,
                floor,
                config.worker_counts,
                config.throughput_sessions,
                config.throughput_turns,
                config.throughput_repeats,
            )
        ours.close()
        floor.close()
        if "recovery" in parts:
            result["recovery"] = [
                recovery(
                    url,
                    client,
                    prefix,
                    log_dir.name,
                    "default: FleetSettings()",
                    FleetSettings(),
                    config.recovery_repeats[0],
                ),
                recovery(
                    url,
                    client,
                    prefix,
                    log_dir.name,
                    "tuned",
                    FleetSettings(lease_ttl_s=1.0, reaper_interval_s=0.5),
                    config.recovery_repeats[1],
                ),
            ]
    finally:
        ours.close()
        floor.close()
        sent.close()
        delete_prefix(client, prefix)
        client.close()
        log_dir.cleanup()
    return result
