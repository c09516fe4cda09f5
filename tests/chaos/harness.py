"""What every chaos scenario shares: the mode, the fleet with its fault ledger, random jobs, the checks, the table.

Quick mode (the default; CI) runs each scenario small; `LOUSHO_CHAOS=long` (or `python -m chaos --long`)
runs it at full size. Every scenario adds one row to the table printed at the end of the pytest run
(and appended as JSON to `$LOUSHO_CHAOS_REPORT` when set): trials, faults injected, violations found.

The checks read only what the run left behind: each session's transcript and history ring (the
store), the committed results hash, and the fleet app's own counters (tool runs, model asks, the
provider's `violations` list). A fault is accounted for when it is injected: a worker SIGKILLed or
SIGSTOPped while it was running a tool call without a recorded result entitles that call to one
more run, and nothing else may run twice.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from lousho import Message, ToolCall
from lousho.engine import CANCELLED_RESULT
from lousho.errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError, StoreUnavailableError
from lousho.fleet.liveness import HOST, lease_token_prefix
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.testing.workers import WorkerProcess
from lousho.worker import FleetSettings, broker_url
from tests.engine.helpers import assert_valid_transcript
from tests.fleet.conftest import Fleet

MODE = "long" if os.environ.get("LOUSHO_CHAOS", "quick").lower() == "long" else "quick"
LONG = MODE == "long"
SEED = int(os.environ.get("LOUSHO_CHAOS_SEED", "20261202"))


def pick(quick: Any, long: Any) -> Any:
    """The quick-mode or the long-mode value of a parameter."""
    return long if LONG else quick


# -- the table -----------------------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    trials: int
    unit: str
    faults: dict[str, int]
    violations: list[str]
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)


ROWS: list[Row] = []


def record(row: Row) -> Row:
    """Add a scenario's row to the table (and to `$LOUSHO_CHAOS_REPORT`)."""
    ROWS.append(row)
    path = os.environ.get("LOUSHO_CHAOS_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"mode": MODE, **row.__dict__}, default=str) + "\n")
    return row


def _cell(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items() if v is not None and v != "") or "-"


def render_table(rows: list[dict[str, Any]] | list[Row], markdown: bool = False) -> list[str]:
    data = [r.__dict__ if isinstance(r, Row) else r for r in rows]
    header = ["scenario", "trials", "faults injected", "violations", "time", "figures"]
    body = [
        [
            d["scenario"],
            f"{d['trials']} {d['unit']}",
            _cell(d["faults"]),
            str(len(d["violations"])),
            f"{d['seconds']:.1f} s",
            _cell(d.get("figures", {})),
        ]
        for d in data
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
        widths[-1] = 0
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in body]
    for d in data:
        lines += [f"  ! {d['scenario']}: {v}" for v in d["violations"][:20]]
    return lines


# -- the fleet and its fault ledger --------------------------------------------------------


@dataclass
class ChaosFleet(Fleet):
    """A `Fleet` that keeps the ledger of faults it injects."""

    interrupted: Counter[str] = field(default_factory=Counter)
    """call id -> runs that a fault cut short before the call had a recorded result."""
    call_session: dict[str, str] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    dead: list[WorkerProcess] = field(default_factory=list)
    _ledger_lock: threading.Lock = field(default_factory=threading.Lock)
    _counted: dict[tuple[int, str], int] = field(default_factory=dict)
    _started: int = 0
    fault_log: list[str] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)

    def start_worker(
        self, name: str | None = None, *, pool: str | None = None, concurrency: int = 1, **env: str
    ) -> WorkerProcess:
        self._started += 1
        return super().start_worker(name or f"w{self._started}", pool=pool, concurrency=concurrency, **env)

    def results_key(self, session_id: str) -> str:
        return f"{self.prefix}{{{session_id}}}:results"

    def committed(self, session_id: str) -> dict[str, Any]:
        """The session's committed results hash by call id (fields are '<turn>:<call id>'; dropped once
        the turn is complete, when every result is in the checkpoint)."""
        raw = self.redis.hgetall(self.results_key(session_id))
        return {k.decode().split(":", 1)[1]: json.loads(v) for k, v in raw.items()}

    def has_result(self, session_id: str, call_id: str) -> bool:
        """Committed, or recorded in the checkpoint already."""
        if call_id in self.committed(session_id):
            return True
        checkpoint = self.store.checkpoints.load(session_id)
        return checkpoint is not None and any(m.tool_call_id == call_id for m in checkpoint.messages if m.role == "tool")

    def note_interrupted(self, pid: int) -> None:
        """A fault hit `pid`: each run of a call it started (or leased, about to start) that has no recorded
        result yet may be followed by one more run. Each run is counted once, however many faults hit it."""
        with self._ledger_lock:
            calls = {m.decode(): 0 for m in self.redis.smembers(self.key(f"started:{pid}"))}
            pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix) + "{*}:lease:*"
            for lease_key in self.redis.scan_iter(match=pattern, count=1000):
                token = self.redis.get(lease_key)
                if token is not None and token.decode().startswith(lease_token_prefix(f"{HOST}|{pid}")):
                    calls[lease_key.decode().rsplit(":lease:", 1)[1]] = 1  # leased: its run may not have started
            for call, leased in calls.items():
                session = self.call_session.get(call)
                if session is None or self.has_result(session, call):
                    continue
                runs = [r.decode() for r in self.redis.lrange(self.key(f"runlog:{call}"), 0, -1)]
                mine = sum(r.startswith(f"{pid}@") for r in runs)
                if leased and not (runs and runs[-1].startswith(f"{pid}@")):
                    mine += 1  # it holds the call's lease and its run has not started yet: that run counts
                new = mine - self._counted.get((pid, call), 0)
                if new > 0:
                    self._counted[(pid, call)] = mine
                    self.interrupted[call] += new

    def kill(self, worker: WorkerProcess) -> None:
        """SIGKILL (no cleanup, no ack), then account for what it was running."""
        worker.kill(signal.SIGKILL)
        self.fault_log.append(f"SIGKILL {worker.pid}@{time.time():.3f}")
        self.note_interrupted(worker.pid)
        self.faults["worker SIGKILL"] += 1
        self._retire(worker)

    def _retire(self, worker: WorkerProcess) -> None:
        if worker in self.workers:
            self.workers.remove(worker)
            self.dead.append(worker)

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive()]

    def reap_self_killed(self) -> int:
        """Workers that died on a trigger (they SIGKILL themselves). What they were running is
        accounted from the trigger itself (`account_triggers`), not from a snapshot taken now: this
        may run long after the death, when the call's lease has expired and another worker ran it."""
        gone = [w for w in self.workers if not w.alive()]
        for worker in gone:
            worker.process.wait(timeout=10)
            self.fault_log.append(f"self-SIGKILL {worker.pid} seen @{time.time():.3f}")
            self.faults["worker SIGKILL (self, on a trigger)"] += 1
            self._retire(worker)
        return len(gone)

    def kill_on(self, trigger: str) -> None:
        super().kill_on(trigger)
        self.triggers.append(trigger)

    def account_triggers(self) -> int:
        """Each `tool:<call>` trigger that fired killed its worker mid-call: one more run allowed. Returns
        how many triggers never fired."""
        left = {m.decode() for m in self.redis.smembers(self.key("kill"))}
        for trigger in self.triggers:
            if trigger not in left and trigger.startswith("tool:"):
                self.interrupted[trigger[len("tool:") :]] += 1
        self.triggers = [t for t in self.triggers if t in left]
        return len(left)

    def worker_logs(self) -> str:
        return "\n".join(f"--- {w.name} (pid {w.pid}) ---\n{w.log()}" for w in [*self.dead, *self.workers])

    def stop_all(self) -> None:
        super().stop_all()
        for worker in self.workers:
            worker.kill()


def make_fleet(
    redis_url: str, prefix: str, client: redis.Redis, log_dir: Path, *, lease_ttl_s: float = 2.0, **env: str
) -> ChaosFleet:
    queue = f"lousho-chaos-{uuid.uuid4().hex[:12]}"
    full_env = {
        "LOUSHO_TEST_FLEET_REDIS": redis_url,
        "LOUSHO_TEST_FLEET_PREFIX": prefix,
        "LOUSHO_TEST_FLEET_QUEUE": queue,
        "LOUSHO_TEST_LEASE_TTL_S": str(lease_ttl_s),
        "LOUSHO_TEST_TRACK": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        **env,
    }
    store = RedisStore(client, prefix=prefix)
    lousho_client = Client(
        broker=broker_url(redis_url), store=store, settings=FleetSettings(queue=queue, lease_ttl_s=lease_ttl_s)
    )
    return ChaosFleet(
        env=full_env, queue=queue, prefix=prefix, store=store, client=lousho_client, log_dir=str(log_dir)
    )


def drop_queue(client: redis.Redis, queue: str) -> None:
    client.delete(queue, f"{queue}\x06\x163", f"{queue}\x06\x166", f"{queue}\x06\x169", f"_kombu.binding.{queue}")


# -- random jobs -----------------------------------------------------------------------------


def tool_turn(*calls: tuple[str, str, dict[str, Any]]) -> Message:
    return Message.assistant(tool_calls=[ToolCall(id=i, name=n, arguments=a) for i, n, a in calls])


def random_script(rng: random.Random, session: str, *, gates: bool = True, max_turns: int = 3) -> list[Message]:
    """1..max_turns tool turns of 1-4 calls (work of random length; sometimes a charge that needs approval)."""
    turns = []
    for t in range(rng.randint(1, max_turns)):
        calls = []
        for i in range(rng.randint(1, 4)):
            call_id = f"{session}-t{t}-c{i}"
            if gates and rng.random() < 0.15:
                calls.append((call_id, "charge", {"amount": rng.randint(1, 500)}))
            else:
                calls.append((call_id, "work", {"n": rng.randint(0, 99), "sleep_s": rng.choice([0, 0.05, 0.1, 0.3, 0.6])}))
        turns.append(tool_turn(*calls))
    return [*turns, Message.assistant(f"{session} done")]


def install_scripts(fleet: ChaosFleet, rng: random.Random, scripts: dict[str, list[Message]], model_delay: float = 0.3) -> None:
    """Store each session's script, remember which session each call belongs to, slow some model turns down."""
    pipe = fleet.redis.pipeline()
    for session, answers in scripts.items():
        pipe.set(fleet.key(f"script:{session}"), json.dumps([a.model_dump() for a in answers]))
        for turn in range(1, len(answers) + 1):
            if rng.random() < 0.3:
                pipe.set(fleet.key(f"model-delay:{session}:{turn}"), str(round(rng.uniform(0.05, model_delay), 3)))
        for answer in answers:
            for call in answer.tool_calls:
                fleet.call_session[call.id] = session
    pipe.execute()


# -- the helpers a scenario runs beside the fleet --------------------------------------------


class Background:
    """Threads that run until `stop()`: each a loop body called every `interval_s` seconds."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def every(self, interval_s: float, body: Callable[[], None], name: str) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    body()
                except Exception as exc:  # a helper's error is a finding, reported, never swallowed
                    self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                self._stop.wait(interval_s)

        thread = threading.Thread(target=loop, daemon=True, name=name)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


class Approver:
    """A human with a web app: decides each pending approval (seeded), and tries a second decision on some."""

    def __init__(self, fleet: ChaosFleet, seed: int, approve: float = 0.7) -> None:
        self.fleet = fleet
        self.rng = random.Random(seed)
        self.approve = approve
        self.decisions: dict[str, bool] = {}
        self.maybe: dict[str, bool] = {}
        """Decisions whose request failed with a typed error (Redis going down): each may have landed first. One
        that did stands (a pause run again applies it, issue #33); one that did not is shown pending again."""
        self.notes: dict[str, str] = {}
        self.violations: list[str] = []
        self.refused_twice = 0

    def __call__(self) -> None:
        for snapshot in self.fleet.client.approvals():
            call = snapshot.tool_call.id
            if call in self.decisions:
                continue
            approved = self.rng.random() < self.approve
            note = f"decided by the chaos approver ({'yes' if approved else 'no'})"
            try:
                self.fleet.client.resolve_approval(snapshot.id, approved=approved, note=note)
            except ApprovalAlreadyResolvedError:
                self.violations.append(f"approval {snapshot.id} of {call} was decided by someone else")
                continue
            except StoreUnavailableError:
                self.maybe[call] = approved
                raise
            self.decisions[call], self.notes[call] = approved, note
            self.fleet.faults["approvals decided"] += 1
            if self.rng.random() < 0.3:  # a double click: the second decision must be refused
                try:
                    self.fleet.client.resolve_approval(snapshot.id, approved=not approved, note="second decision")
                    self.violations.append(f"a second decision for {snapshot.id} was accepted")
                except ApprovalAlreadyResolvedError:
                    self.refused_twice += 1
            if self.rng.random() < 0.1:
                try:
                    self.fleet.client.resolve_approval(f"{snapshot.id}-nope", approved=True)
                    self.violations.append("a decision for an unknown approval id was accepted")
                except ApprovalNotFoundError:
                    self.refused_twice += 1


def decide_lost_approvals_again(fleet: ChaosFleet, approver: Approver) -> int:
    """Approvals the approver decided that are pending again: the decision was acknowledged by the dead primary
    and never reached its replica. The web app shows them pending again; the human decides them again, the
    same way (the worker may have acted on the first decision before the failover). How many there were."""
    for _ in range(50):
        try:
            return decide_pending_again(fleet, approver)
        except StoreUnavailableError:
            time.sleep(0.2)
    raise AssertionError("the approvals stayed unreadable after the failover")


def decide_pending_again(fleet: ChaosFleet, approver: Approver) -> int:
    """Decide again, the same way, each approval the approver decided that shows as pending (a web app shows
    it so; the human decides it again); how many. Raises `StoreUnavailableError` while a slot has no primary."""
    again = [s for s in fleet.client.approvals() if s.tool_call.id in approver.decisions]
    for snapshot in again:
        fleet.client.resolve_approval(
            snapshot.id, approved=approver.decisions[snapshot.tool_call.id], note=approver.notes[snapshot.tool_call.id]
        )
    return len(again)


class Aborter:
    """A web app that aborts some running sessions at random, waits for the abort to land (every unfinished
    call has a result, the run idle), then redirects the run with new input."""

    def __init__(self, fleet: ChaosFleet, sessions: list[str], seed: int, share: float, every_s: tuple[float, float]) -> None:
        self.fleet = fleet
        self.rng = random.Random(seed)
        self.candidates = [s for s in sessions if self.rng.random() < share]
        self.every_s = every_s
        self.next_at = time.monotonic() + self.rng.uniform(*every_s)
        self.aborted: set[str] = set()
        self.waiting: dict[str, float] = {}
        self.violations: list[str] = []
        self.slowest_s = 0.0

    def __call__(self) -> None:
        client = self.fleet.client
        if self.candidates and time.monotonic() >= self.next_at:
            session = self.candidates.pop()
            checkpoint = client.checkpoint(session)
            running = checkpoint is not None and checkpoint.status == "in-progress" and checkpoint.messages
            if running and client.abort(session):  # False: it finished or paused on an approval meanwhile
                self.aborted.add(session)
                self.waiting[session] = time.monotonic()
                self.fleet.faults["aborts (then new input)"] += 1
            self.next_at = time.monotonic() + self.rng.uniform(*self.every_s)
        for session, since in list(self.waiting.items()):
            checkpoint = client.checkpoint(session)
            if checkpoint is None:
                continue
            if checkpoint.status == "finished":  # the abort came after the last turn
                del self.waiting[session]
            elif checkpoint.status == "in-progress" and not checkpoint.pending_tool_calls():
                self.slowest_s = max(self.slowest_s, time.monotonic() - since)
                client.enqueue("jobs", f"go on, {session}", session_id=session, require_worker=False)  # mid-kill
                del self.waiting[session]
            elif time.monotonic() - since > 60:
                self.violations.append(f"{session}: the abort did not land within 60 s ({checkpoint.status})")
                del self.waiting[session]


class QueueWatch:
    """The broker queue's length against the work live sessions have pending (issue #21): under kills
    and requeues, copies of the same tasks must not pile up. A live (unfinished) session's pending
    work is its next step plus each tool call without a result; the queue must stay under twice that."""

    def __init__(self, fleet: ChaosFleet, sessions: list[str]) -> None:
        self.fleet, self.sessions = fleet, sessions
        self.violations: list[str] = []
        self.longest = 0
        self.worst_ratio = 0.0

    def __call__(self) -> None:
        pending = 0
        for session in self.sessions:
            checkpoint = self.fleet.store.checkpoints.load(session)
            if checkpoint is not None and checkpoint.status != "finished":
                pending += 1 + len(checkpoint.pending_tool_calls())
        length = int(self.fleet.redis.llen(self.fleet.queue))
        self.longest = max(self.longest, length)
        if pending:
            self.worst_ratio = max(self.worst_ratio, length / pending)
        if length >= 2 * max(pending, 1):
            self.violations.append(f"the queue held {length} messages for {pending} pending steps and calls")

    def figures(self) -> dict[str, Any]:
        return {"longest queue": self.longest, "queue / pending work, worst": f"{self.worst_ratio:.2f}"}


def finished_count(fleet: ChaosFleet, sessions: list[str]) -> int:
    finished = set(fleet.store.checkpoints.sessions("finished"))
    return sum(s in finished for s in sessions)


def settled_count(fleet: ChaosFleet, sessions: list[str]) -> int:
    """Sessions finished or parked (a parked one waits for a human: no use waiting for it)."""
    settled = set(fleet.store.checkpoints.sessions("finished")) | set(fleet.client.sessions(status="parked"))
    return sum(s in settled for s in sessions)


# -- the checks ------------------------------------------------------------------------------


def check_sessions(
    fleet: ChaosFleet,
    scripts: dict[str, list[Message]],
    approver: Approver | None = None,
    *,
    max_attempts: int = 3,
    aborter: Aborter | None = None,
) -> tuple[list[str], Counter[str]]:
    """Every guarantee, on every session, from what the run left behind. Returns (violations, figures)."""
    fleet.account_triggers()
    aborted = aborter.aborted if aborter else set()
    violations = [f"provider: {v}" for v in fleet.violations()]
    runs, asked = fleet.counts("runs"), fleet.counts("asked")
    figures: Counter[str] = Counter()
    decisions = {**approver.maybe, **approver.decisions} if approver else {}
    for session, script in scripts.items():
        checkpoint = fleet.store.checkpoints.load(session)
        if checkpoint is None or checkpoint.status != "finished":
            status = fleet.client.status(session)
            violations.append(f"{session}: not finished ({status.status} {status.parked_reason or ''})")
            continue
        messages = checkpoint.messages
        try:
            assert_valid_transcript(messages)
        except AssertionError as exc:
            violations.append(f"{session}: invalid transcript: {exc}")
        assistants = [m for m in messages if m.role == "assistant"]
        if [(m.content, m.tool_calls) for m in assistants] != [(m.content, m.tool_calls) for m in script]:
            violations.append(f"{session}: the model turns in the transcript are not the scripted ones")
        calls = [c for m in assistants for c in m.tool_calls]
        tool_messages = [m for m in messages if m.role == "tool"]
        if [m.tool_call_id for m in tool_messages] != [c.id for c in calls]:
            violations.append(f"{session}: results {[m.tool_call_id for m in tool_messages]} != calls {[c.id for c in calls]}")
            continue
        committed = fleet.committed(session)
        for call, message in zip(calls, tool_messages, strict=True):
            result = message.result()
            if session in aborted and result == CANCELLED_RESULT:
                figures["calls cancelled by an abort"] += 1
                if runs.get(call.id, 0) > 1 + fleet.interrupted[call.id]:
                    violations.append(f"{call.id}: cancelled, yet ran {runs.get(call.id)} time(s)")
                continue
            violations += _check_call(fleet, call, result, runs.get(call.id, 0), decisions, max_attempts, figures)
            if call.id in committed and committed[call.id] != message.result():
                violations.append(f"{call.id}: the transcript's result is not the committed one")
        for turn in range(1, len(assistants) + 1):
            count = asked.get(f"{session}:{turn}", 0)
            if count < 1:
                violations.append(f"{session}: turn {turn} is in the transcript but the model was never asked it")
            figures["model turns asked again (cut short before their save)"] += max(0, count - 1)
        violations += _check_history(fleet, session, checkpoint.version, messages)
    return violations, figures


def _check_call(
    fleet: ChaosFleet, call: ToolCall, result: Any, ran: int, decisions: dict[str, bool], max_attempts: int, figures: Counter[str]
) -> list[str]:
    allowed = 1 + fleet.interrupted[call.id]
    problems = []
    if call.name == "charge" and decisions.get(call.id) is False:
        if ran != 0:
            problems.append(f"{call.id}: rejected, yet it ran {ran} time(s)")
        if not (isinstance(result, dict) and result.get("error") == "rejected"):
            problems.append(f"{call.id}: rejected, but its result is {result!r}")
        return problems
    if call.name == "charge":
        if call.id not in decisions:
            problems.append(f"{call.id}: has a result but was never decided")
        expected: Any = {"charged": call.arguments["amount"], "idempotency_key": call.id}
    else:
        expected = {"n": call.arguments["n"], "square": call.arguments["n"] ** 2}
    if isinstance(result, dict) and result.get("error") == "poison":
        figures["poison results (a call cut short max_attempts times)"] += 1
        if fleet.interrupted[call.id] < max_attempts:
            problems.append(f"{call.id}: poison result after only {fleet.interrupted[call.id]} interruption(s)")
        return problems
    if result != expected:
        problems.append(f"{call.id}: result {result!r}, expected {expected!r}")
    if not 1 <= ran <= allowed:
        runlog = [r.decode() for r in fleet.redis.lrange(fleet.key(f"runlog:{call.id}"), 0, -1)]
        problems.append(
            f"{call.id}: ran {ran} time(s); allowed 1..{allowed} (faults cut {allowed - 1} run(s) short); "
            f"runs {runlog}; faults {fleet.fault_log}; "
            f"worker log: {[line for line in fleet.worker_logs().splitlines() if call.id in line and 'lost' in line]}"
        )
    figures["tool re-runs (each after a fault cut a run short)"] += max(0, ran - 1)
    return problems


def _check_history(fleet: ChaosFleet, session: str, version: int, messages: list[Message]) -> list[str]:
    """Versions contiguous (no save lost or overwritten); each saved transcript a prefix of the final one."""
    history = fleet.store.checkpoints.history(session)
    versions = [entry.checkpoint.version for entry in history]
    problems = []
    if versions != list(range(version, version - len(versions), -1)):
        problems.append(f"{session}: history versions {versions} are not contiguous")
    for entry in history:
        saved = entry.checkpoint.messages
        if messages[: len(saved)] != saved:
            problems.append(f"{session}: the save of version {entry.checkpoint.version} is not a prefix of the final transcript")
    return problems


def save_log(folder: Path) -> Iterator[tuple[str, int, str, int, float]]:
    """Every acknowledged save the workers logged: (session, version, status, pid, unix time)."""
    for path in sorted(folder.glob("saves-*.log")):
        for line in path.read_text().splitlines():
            session, version, status, pid, at = line.split("\t")
            yield session, int(version), status, int(pid), float(at)


def acknowledged_twice(fleet: ChaosFleet, folder: Path) -> set[str]:
    """With asynchronous replication (issue #18): what a failover lost that the workers redid, read off the workers'
    logs, outside Redis. A save version acknowledged twice, or a call's result committed twice (first writer wins:
    a call runs again only when its result is not there), was lost once. The workers follow the new master before
    the test sees it, so a loss may be redone before the test compares the store with the logs: only the logs show
    it then. Each call committed twice may run once more for each extra commit (`fleet.interrupted`); the sessions
    with a version acknowledged twice are returned."""
    commits = Counter(
        line.split("\t")[1].split(":", 1)[1]
        for path in sorted(folder.glob("commits-*.log"))
        for line in path.read_text().splitlines()
    )
    for call_id, count in commits.items():
        fleet.interrupted[call_id] += count - 1
    versions = Counter((session, version) for session, version, *_ in save_log(folder))
    return {session for (session, _), count in versions.items() if count > 1}


def check_each_version_acked_once(folder: Path) -> list[str]:
    """No two acknowledged saves of one (session, version): a stale writer never landed a save."""
    writers: dict[tuple[str, int], list[int]] = {}
    for session, version, _status, pid, _at in save_log(folder):
        writers.setdefault((session, version), []).append(pid)
    return [f"{s}: version {v} acknowledged to {len(p)} writers {p}" for (s, v), p in writers.items() if len(p) > 1]
