"""The fleet demo (`lousho demo`): three trip planners on two Celery workers, one killed mid-tool.

What it does, with real parts only: a Redis (`REDIS_URL`, or the local store every `lousho`
command shares, `lousho.local_redis`), two `celery worker` processes serving
`lousho.demo.fleet_app`, and the reaper (`reap_once`, in a thread of this process). It enqueues
the trip planners through `Client`, kills the worker that runs the first `find_restaurants` call
with SIGKILL, starts a replacement, approves each booking through `Client.resolve_approval`, and
shows it all live. Every process it starts, it ends (by pid), whatever happens.

The sessions stay in the store under the configured prefix, so `lousho sessions` and
`lousho show trip-lisbon` find them afterwards with nothing to type but that (issue #15); a run
of the demo first forgets the previous run's sessions of the same names.

Ctrl-C (issue #15): nothing here blocks the main thread for long (workers are spawned, and their
readiness is polled, in the main thread), so the KeyboardInterrupt lands at once; the cleanup then
ignores a second Ctrl-C, stops the workers (SIGTERM, SIGKILL after a second) and returns in well
under three seconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape

from lousho.cli.render import console as default_console
from lousho.demo import fleet_view
from lousho.demo.fleet_view import text_of
from lousho.demo.tracking import asked_key, running_key, runs_key
from lousho.demo.trip import TRIP_REQUESTS
from lousho.local_redis import local_redis
from lousho.operations.text import short
from lousho.redaction import redact_url
from lousho.scheduler import Client, SessionStatus, run_reaper
from lousho.settings import LoushoSettings
from lousho.testing.workers import WorkerProcess, spawn_worker

__all__ = ["DemoOutcome", "run_fleet_demo"]

APP_MODULE = "lousho.demo.fleet_app"
AGENT = "trip_planner"
TOOL_TO_KILL = "find_restaurants"
APPROVE_AFTER_S = 0.6
"""How long a 'human' looks at a pending booking before approving it."""
QUICK_STOP_S = 1.0
"""After Ctrl-C: how long a worker gets for its warm shutdown before SIGKILL (issue #15: out within 3 s)."""


@dataclass
class Kill:
    """The worker the demo killed, and what it was doing."""

    worker: str
    pid: int
    session: str
    call_id: str
    tool: str
    at: float
    replacement: WorkerProcess | None = None
    replacement_ready: bool = False
    requeued_after_s: float | None = None
    requeued_by: str | None = None
    """'the death sweep' or 'a reaper pass' (this demo's reaper); None when another reaper requeued it."""
    recovered_after_s: float | None = None
    """When another worker began the killed call again, seconds after the kill (whichever reaper requeued it)."""


@dataclass
class DemoOutcome:
    ok: bool
    finished: list[str] = field(default_factory=list)
    kill: Kill | None = None
    elapsed_s: float = 0.0


class FleetDemo:
    def __init__(self, console: Console, base: LoushoSettings, *, sessions: dict[str, str], log_dir: str) -> None:
        run_id = uuid.uuid4().hex[:8]
        self.console = console
        self.local = not base.redis_url  # no Redis configured: the local store (issue #15)
        self.sessions = sessions
        self.log_dir = log_dir
        self.queue = f"lousho-demo-{run_id}"  # the demo's own queue: only its workers consume it
        self.settings = LoushoSettings(
            redis_url=base.require_redis_url(),
            store_url=None,
            prefix=base.prefix,  # the configured prefix: `lousho show trip-lisbon` finds it as it is
            queue=self.queue,
            lease_ttl_s=2.5,
            reaper_interval_s=0.5,
            requeue_backoff_s=5.0,
        )
        self.client: Client = self.settings.client()
        self.redis = self.client.store.client
        self.workers: list[WorkerProcess] = []
        self.start = time.monotonic()
        self.kill: Kill | None = None
        self.approved: dict[str, float] = {}
        self.pending_since: dict[str, float] = {}
        self.statuses: dict[str, SessionStatus] = {}
        self.running: dict[str, dict[str, Any]] = {}
        self.requeues: list[tuple[float, list[str], str]] = []
        self._requeues_shown = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- processes -------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.start

    def log(self, text: str) -> None:
        self.console.print(f"[dim]{self.now():5.1f}s[/]  {text}")

    def spawn_worker(self, name: str) -> WorkerProcess:
        """Start a worker without waiting for it: the main thread stays free for Ctrl-C (issue #15)."""
        env = {**self.settings.env(), "PYTHONUNBUFFERED": "1"}
        with _ctrl_c_deferred():  # a worker is never started without being recorded, so the cleanup ends it
            worker = spawn_worker(APP_MODULE, queue=self.queue, name=name, env=env, log_dir=self.log_dir)
            with self._lock:
                self.workers.append(worker)
        return worker

    def start_workers(self, names: list[str], timeout_s: float = 60.0) -> None:
        workers = [self.spawn_worker(name) for name in names]
        deadline = time.monotonic() + timeout_s
        while not all(w.ready() for w in workers):
            dead = [w.name for w in workers if not w.alive()]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"worker(s) {', '.join(dead or names)} did not start; see {self.log_dir}")
            time.sleep(0.05)

    def forget_earlier_runs(self) -> None:
        """An earlier run's sessions of the same names go (their pending approvals are rejected first), and so
        does the demo's ledger, so this run tells its own story on a store that lasts (issue #15)."""
        store = self.client.store
        for session in self.sessions:
            for snapshot in store.approvals.pending(session):
                store.approvals.decide(snapshot.id, False, "a new run of the demo replaced this session")
            store.checkpoints.delete(session)
        prefix = self.settings.prefix
        self.redis.delete(running_key(prefix), runs_key(prefix), asked_key(prefix))

    def start_reaper(self) -> None:
        """`lousho reaper`'s loop in a thread: passes, and the death sweep that requeues a SIGKILLed worker's session
        as soon as its connections close, not after the lease's TTL (issue #32). Each requeue is told with how it
        came (the sweep's first: every session the sweep requeued is in the pass's list too)."""
        settings = self.client.settings
        swept: set[str] = set()

        def on_swept(sessions: list[str]) -> None:
            swept.update(sessions)

        def on_requeued(sessions: list[str]) -> None:
            with self._lock:
                for session in sessions:
                    how = "the death sweep" if session in swept else "a reaper pass"
                    self.requeues.append((self.now(), [session], how))
                swept.difference_update(sessions)

        def loop() -> None:
            run_reaper(self.client.store, self.client.app, settings, stop=self._stop, on_requeued=on_requeued,
                       on_swept=on_swept)  # fmt: skip

        thread = threading.Thread(target=loop, name="lousho-demo-reaper", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop_everything(self, *, quick: bool = False) -> None:
        """End the reaper and every worker, by pid: a warm shutdown (SIGTERM), then SIGKILL after 10 s, or after
        `QUICK_STOP_S` when the demo was interrupted (issue #15: Ctrl-C ends it within 3 s)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=1.0)  # the reaper's pass is short; it is a daemon thread anyway
        with self._lock:
            workers = list(self.workers)
        for worker in workers:
            if worker.alive():
                os.kill(worker.pid, signal.SIGTERM)
        deadline = time.monotonic() + (QUICK_STOP_S if quick else 10.0)
        for worker in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            worker.kill()  # SIGKILL, or a no-op for a worker that ended
        queue = self.queue  # nothing consumes it after the demo
        self.redis.delete(
            queue,
            *(f"{queue}\x06\x16{p}" for p in (3, 6, 9)),
            f"_kombu.binding.{queue}",
            f"_kombu.binding_permanent.{queue}",
        )
        raw = cast(dict[bytes, bytes], self.redis.hgetall("unacked"))
        for tag, message in raw.items():  # the killed worker's message (kombu would restore it in an hour)
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                if json.loads(message)[0]["properties"]["delivery_info"]["routing_key"] == queue:
                    self.redis.hdel("unacked", text_of(tag))
                    self.redis.zrem("unacked_index", text_of(tag))

    def worker_named(self, pid: int) -> WorkerProcess | None:
        with self._lock:
            return next((w for w in self.workers if w.pid == pid), None)

    # -- one look at the fleet ---------------------------------------------------------

    def tick(self) -> None:
        for session in self.sessions:
            status = self.client.status(session)
            old = self.statuses.get(session)
            if old is None or old.status != status.status:
                self.on_status(session, status)
            self.statuses[session] = status
        raw = cast(dict[bytes, bytes], self.redis.hgetall(running_key(self.settings.prefix)))
        self.running = {text_of(k): json.loads(v) for k, v in raw.items()}
        self.maybe_kill()
        self.maybe_announce_replacement()
        self.maybe_approve()
        with self._lock:
            fresh = self.requeues[self._requeues_shown :]
            self._requeues_shown = len(self.requeues)
        for at, sessions, how in fresh:
            for session in sessions:
                if self.kill is not None and session == self.kill.session and self.kill.requeued_after_s is None:
                    self.kill.requeued_after_s, self.kill.requeued_by = at - self.kill.at, how
                    why = (
                        f"pid {self.kill.pid}'s connections to Redis closed, so it did not wait for the lease's "
                        f"{self.client.settings.lease_ttl_s}s"
                        if how == "the death sweep"
                        else "its deadline passed with no lease held"
                    )
                    self.log(
                        f"[bold green]{how} requeued {session}[/] {self.kill.requeued_after_s:.2f}s after the kill: "
                        f"{why}; a live worker runs {self.kill.call_id} again, same tool_call_id"
                    )
                else:
                    self.log(
                        f"{how} requeued {session}: no worker had advanced it for a lease's time "
                        "(a requeue of a live session is harmless)"
                    )
        self.maybe_announce_recovery()

    def on_status(self, session: str, status: SessionStatus) -> None:
        if status.status == "awaiting-approval":
            self.log(f"{session}: paused, book_table needs a human's approval ({status.approval_id})")
        elif status.status == "finished":
            self.log(f"[green]{session}: finished[/]: {escape(short(status.text or '', 90))}")
        elif status.status == "in-progress" and session not in self.statuses:
            self.log(f"{session}: enqueued")

    def maybe_kill(self) -> None:
        if self.kill is not None:
            return
        for call_id, entry in self.running.items():
            worker = self.worker_named(int(entry["pid"]))
            if entry["tool"] != TOOL_TO_KILL or worker is None or not worker.alive():
                continue
            killed_at = self.now()  # before the signal: the death sweep may see the worker gone before kill() returns
            worker.kill(signal.SIGKILL)
            self.kill = Kill(
                worker=worker.name,
                pid=worker.pid,
                session=entry["session"],
                call_id=call_id,
                tool=entry["tool"],
                at=killed_at,
            )
            self.log(
                f"[bold red]SIGKILL -> {worker.name} (pid {worker.pid})[/] while it ran {entry['tool']} "
                f"(call {call_id}) of {entry['session']}: no cleanup, no ack, like the OOM killer"
            )
            self.kill.replacement = self.spawn_worker(f"w{len(self.workers) + 1}")
            return

    def maybe_announce_replacement(self) -> None:
        kill = self.kill
        if kill is None or kill.replacement is None or kill.replacement_ready or not kill.replacement.ready():
            return
        kill.replacement_ready = True
        self.log(f"replacement worker {kill.replacement.name} (pid {kill.replacement.pid}) is ready")

    def maybe_announce_recovery(self) -> None:
        """The killed call running again on another worker, seen in the demo's ledger: recovered, whichever reaper
        requeued it (another `lousho reaper` on the same Redis may take the requeue: issue #32)."""
        kill = self.kill
        if kill is None or kill.recovered_after_s is not None:
            return
        entry = self.running.get(kill.call_id)
        if entry is None or int(entry["pid"]) == kill.pid:
            return
        kill.recovered_after_s = self.now() - kill.at
        worker = self.worker_named(int(entry["pid"]))
        where = worker.name if worker is not None else f"pid {entry['pid']}"
        self.log(
            f"[bold green]recovered[/]: {where} runs {kill.call_id} again, {kill.recovered_after_s:.2f}s after the kill"
        )

    def maybe_approve(self) -> None:
        for session, status in self.statuses.items():
            approval = status.approval_id
            if status.status != "awaiting-approval" or approval is None or approval in self.approved:
                continue
            first_seen = self.pending_since.setdefault(approval, self.now())
            if self.now() - first_seen < APPROVE_AFTER_S:
                continue
            self.client.resolve_approval(approval, approved=True, note="approved by the demo's human")
            self.approved[approval] = self.now()
            self.log(f"{session}: a human approved {approval} (Client.resolve_approval); the fleet books the table")

    def workers_now(self) -> list[WorkerProcess]:
        with self._lock:
            return list(self.workers)

    def render(self) -> Group:
        return fleet_view.render(self)

    # -- the story ---------------------------------------------------------------------

    def run(self, timeout_s: float) -> DemoOutcome:
        console = self.console
        where = (
            f"the local store ({local_redis().data_dir}; no REDIS_URL set)"
            if self.local
            else f"Redis at {redact_url(str(self.settings.redis_url))}"
        )
        console.print(f"[bold]lousho fleet demo[/] on {escape(where)}, key prefix {escape(self.settings.prefix)}")
        self.forget_earlier_runs()
        self.start_workers(["w1", "w2"])
        self.log(
            "workers "
            + ", ".join(f"{w.name} (pid {w.pid})" for w in self.workers)
            + " are ready; the reaper runs every "
            f"{self.client.settings.reaper_interval_s}s (lease TTL {self.client.settings.lease_ttl_s}s) and looks for "
            f"dead workers every {self.client.settings.death_check_interval_s}s"
        )
        self.start_reaper()
        for session, request in self.sessions.items():
            self.client.enqueue(AGENT, request, session_id=session)
        deadline = time.monotonic() + timeout_s
        with Live(self.render(), console=console, refresh_per_second=8, transient=False) as live:
            while time.monotonic() < deadline:
                self.tick()
                live.update(self.render())
                if all(s.status == "finished" for s in self.statuses.values()) and len(self.statuses) == len(
                    self.sessions
                ):
                    break
                time.sleep(0.05)
        console.line()
        finished = [s for s, st in self.statuses.items() if st.status == "finished"]
        outcome = DemoOutcome(
            ok=len(finished) == len(self.sessions), finished=finished, kill=self.kill, elapsed_s=self.now()
        )
        self.report(outcome)
        return outcome

    def report(self, outcome: DemoOutcome) -> None:
        fleet_view.report(self, outcome)


def run_fleet_demo(
    console: Console | None = None, *, timeout_s: float = 45.0, sessions: dict[str, str] | None = None
) -> DemoOutcome:
    """Run the fleet demo and return what happened; every process it starts is ended before it returns."""
    console = console or default_console()
    os.environ.setdefault("LOUSHO_DEMO_TOOL_DELAY_S", "0.4")
    logging.getLogger("lousho.reaper").setLevel(logging.ERROR)  # the demo tells of requeues itself
    with tempfile.TemporaryDirectory(prefix="lousho-demo-") as log_dir:
        demo = FleetDemo(console, LoushoSettings(), sessions=sessions or dict(TRIP_REQUESTS), log_dir=log_dir)
        interrupted = True
        try:
            outcome = demo.run(timeout_s)
            interrupted = False
            return outcome
        finally:
            with _second_ctrl_c_ignored():
                demo.stop_everything(quick=interrupted)


@contextlib.contextmanager
def _second_ctrl_c_ignored() -> Iterator[None]:
    """While the demo ends what it started, Ctrl-C again changes nothing: no traceback from the middle of the
    cleanup, no process left behind (issue #15). Only the main thread may set a signal handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Ctrl-C in the block takes effect when it ends (issue #15: one that landed between a worker's start and its
    recording left that worker running). Only the main thread may set a signal handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, None)  # the default handler: KeyboardInterrupt, now
