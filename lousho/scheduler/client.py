"""`Client`: what a web app uses to enqueue jobs and look at them, without the agents' code."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Literal, cast

from celery import Celery
from kombu.exceptions import OperationalError
from pydantic import BaseModel

from lousho.approvals import (
    ApprovalSnapshot,
    InterruptedAction,
    approval_chain,
    check_calls_unchanged,
    decide,
    parse_decision,
)
from lousho.checkpoint import Checkpoint, Status, validate_session_id
from lousho.engine import ModelTurn, next_step
from lousho.errors import (
    AgentNotServedError,
    CheckpointConflictError,
    ConfigurationError,
    SDKError,
    SessionAwaitingApprovalError,
    StoreUnavailableError,
)
from lousho.fleet.dispatch import send_advance, send_model_turn, turn_number
from lousho.fleet.events import events_key, open_session_stream, open_stream
from lousho.fleet.inflight import InflightIndex
from lousho.fleet.keys import FleetKeys
from lousho.fleet.registry import WorkerRegistry, agent_of
from lousho.fleet.settings import FleetSettings, celery_config
from lousho.fleet.transport import AMQP
from lousho.inputs import add_input_to_unfinished, continue_finished, validate_input
from lousho.messages import Message
from lousho.redaction import redact_secrets, redact_url, url_secrets
from lousho.scheduler.events import EventFeed
from lousho.scheduler.job_limits import check_input_chars, check_job_size, check_name_lengths
from lousho.stores.listing import Listing
from lousho.stores.redis import RedisStore
from lousho.stores.redis_common import redis_errors, text
from lousho.telemetry.hooks import instrument_fleet

__all__ = ["Client", "SessionStatus"]

ENQUEUE_ATTEMPTS = 5
"""How many times `Client.enqueue` loads and saves when a worker saves the session in between."""

log = logging.getLogger("lousho.client")


class SessionStatus(BaseModel):
    """What `Client.status()` tells about a session."""

    session_id: str
    status: Status | Literal["parked", "unknown"]
    agent_name: str | None = None
    steps: int = 0
    messages: int = 0
    finish_reason: str | None = None
    approval_id: str | None = None
    text: str | None = None
    """The last assistant message's text."""
    parked_reason: str | None = None
    aborted: bool = False


class Client:
    """Enqueue agent jobs on the fleet and follow them. Needs the broker and the store, not the agents."""

    def __init__(self, *, broker: str, store: RedisStore, settings: FleetSettings | None = None) -> None:
        self.settings = settings or FleetSettings()
        # An accepted job whose message is lost is requeued by the reaper after a lease's time.
        self.store = store.with_inflight_deadline(self.settings.lease_ttl_ms)
        if self.settings.min_replicas_acked:  # a job's first save waits for replicas too (issue #18)
            self.store = self.store.with_replica_ack(
                self.settings.min_replicas_acked, self.settings.replica_ack_timeout_ms
            )
        self.inflight = InflightIndex.of(self.store, self.settings.lease_ttl_ms)
        self.keys = FleetKeys(self.store)
        self.registry = WorkerRegistry(self.store)
        # lousho's transport: one redis-py client per connection pool, where kombu made one for every publish (half
        # of `enqueue`'s CPU went to making them under py-spy, issue #29)
        self.app = Celery("lousho-client", set_as_current=False, amqp=AMQP)
        self.app.conf.update(celery_config(broker, self.settings))
        instrument_fleet()  # LOUSHO_TRACES: a job sent in a traced request links its run to it (issue #19)

    def enqueue(
        self,
        agent_name: str,
        input: Any,
        *,
        session_id: str | None = None,
        business_state: Any = None,
        require_worker: bool = True,
    ) -> str:
        """Write the job's checkpoint (an accepted record for a new session) and wake the fleet.

        The record is saved before the message is sent, so a lost message is recovered by the
        reaper. On an existing session the input follows the reference's rules for `execute()`.

        The job goes to a queue on which a live worker serves `agent_name` (the client's `settings.queue`
        when one is named). When none does, `AgentNotServedError` names what is served, and nothing is
        written; `require_worker=False` enqueues ahead of the workers: the message waits on the named
        queue, or, with none named, the session waits until the reaper sees a worker serving its agent
        (issue #15).

        An input over `settings.max_input_chars` (its text) or `max_input_messages`, a business state over
        `max_business_state_chars` (its JSON), an agent name or session id over `max_agent_name_chars` or
        `max_session_id_chars` raises `InputTooLargeError`, which names no part of it (issue #31)."""
        check_name_lengths(self.settings, agent_name, session_id)
        session_id = validate_session_id(f"job-{uuid.uuid4().hex[:16]}" if session_id is None else session_id)
        check_job_size(self.settings, input, business_state)  # before the session's epoch is written
        queue: str | None = None
        for attempt in range(1, ENQUEUE_ATTEMPTS + 1):
            stored = self.store.checkpoints.load(session_id)
            messages = validate_input(input, stored)  # before anything is written (issue #21)
            check_input_chars(self.settings, messages)
            if attempt == 1:
                queue = self._queue_for(agent_name, require_worker)  # before anything is written (issue #15)
            job = self._job_checkpoint(session_id, agent_name, stored, messages, business_state)
            if job is None:
                return session_id
            checkpoint = job
            if stored is None:
                self.keys.new_incarnation(session_id)
            try:
                self.store.checkpoints.save(session_id, job.model_copy(update={"version": job.version + 1}))
                break
            except CheckpointConflictError:
                # A worker saved the session between this load and this save (a step still running, a requeue's,
                # an abort's wake-up): the input goes onto what it saved (a chaos run under load met it).
                if attempt == ENQUEUE_ATTEMPTS:
                    raise
        try:
            self._wake(session_id, checkpoint, queue, new=stored is None)
        except SDKError:
            raise
        except (OperationalError, ValueError) as exc:  # kombu's: a refused message, an unreadable URL
            raise _broker_refused(str(self.app.conf.broker_url), session_id, exc) from None
        return session_id

    @staticmethod
    def _job_checkpoint(
        session_id: str, agent_name: str, stored: Checkpoint | None, messages: list[Message], business_state: Any
    ) -> Checkpoint | None:
        """The checkpoint a job writes: a new session's record, or `stored` with the input added (None: a finished
        session sent its own history again, nothing new to run)."""
        if stored is None:
            return Checkpoint(
                session_id=session_id, agent_name=agent_name, pending_input=messages, business_state=business_state
            )
        if stored.status == "awaiting-approval":
            raise SessionAwaitingApprovalError(session_id, stored.approval_id or "")
        if stored.status == "in-progress":
            return add_input_to_unfinished(stored, messages)
        return continue_finished(stored, messages)

    def _queue_for(self, agent_name: str, require_worker: bool) -> str | None:
        """Where a job of `agent_name` goes (None: nowhere yet, the reaper sends it); `AgentNotServedError`
        when no live worker serves it there and `require_worker` (issue #15)."""
        served = self.registry.live()
        queue = served.route(agent_name, self.settings.queue)
        if require_worker and (queue is None or not served.serves(agent_name, queue)):
            where = f"on queue {self.settings.queue!r}" if self.settings.queue else "on any queue"
            raise AgentNotServedError(
                f"no live worker serves agent {agent_name!r} {where} under prefix {self.store.prefix!r} "
                f"(served: {served.describe()}); nothing was enqueued. Start a worker whose app serves it "
                "(`lousho worker --app module:app`), check the agent's name and the queue, or enqueue ahead "
                "of the workers (`require_worker=False`, `lousho enqueue --no-require-worker`)",
                agent=agent_name,
                queue=self.settings.queue,
                served=served.by_queue(),
            )
        return queue

    def _session_queue(self, session_id: str) -> str | None:
        """Where a step of an existing session goes: a queue serving its agent (issue #15)."""
        return self.registry.live().route(agent_of(self.store, session_id), self.settings.queue)

    def _send_advance(self, session_id: str, reason: str, *, reaper_sends: bool = True) -> None:
        """Wake the session's worker; with no live worker serving it and no queue named, the reaper will.

        A broker that does not take the message while the store is up (RabbitMQ down, issue #18): when the
        caller put the session back in the in-flight index (`reaper_sends`), what was decided is saved and the
        reaper sends the wake-up once the broker is back, so this only logs; else a typed error says so."""
        queue = self._session_queue(session_id)
        if queue is None:
            return
        try:
            send_advance(self.app, session_id, reason, queue)
        except (OperationalError, ValueError) as exc:  # kombu's: a broker that is down, an unreadable URL
            error = _broker_refused(
                str(self.app.conf.broker_url), session_id, exc,
                then="the reaper sends it once the broker takes messages again" if reaper_sends
                else "running tools still stop at their next heartbeat; call abort() again to wake the session",
            )  # fmt: skip
            if not reaper_sends or isinstance(error, ConfigurationError):
                raise error from None
            log.warning("%s", error)

    def _wake(self, session_id: str, checkpoint: Checkpoint, queue: str | None, *, new: bool = False) -> None:
        """Open the session's live-event stream (issue #34) and clear its abort and parked marks, in one round trip
        (issue #30; `new`: a new incarnation did both already, in the same transaction as its epoch), then send its
        step."""
        if not new:
            with redis_errors(self.store.client, f"open the event stream and clear the marks of {session_id!r}"):
                pipe = self.store.client.pipeline(transaction=True)
                open_stream(pipe, events_key(self.store, session_id), self.store.ttl_s)
                pipe.delete(self.keys.abort(session_id))
                pipe.hdel(self.keys.parked_of(session_id), session_id)
                replies = pipe.execute(raise_on_error=False)  # the XADD's refusal of a stream that exists is the point
                for reply in replies[-2:]:
                    if isinstance(reply, Exception):
                        raise reply
        if queue is None:  # ahead of the workers, with no queue named: the reaper sends it (issue #15)
            return
        if not checkpoint.messages or isinstance(next_step(checkpoint, 10**9), ModelTurn):
            send_model_turn(self.app, session_id, turn_number(checkpoint), queue)
        else:
            send_advance(self.app, session_id, "enqueue", queue)

    def status(self, session_id: str) -> SessionStatus:
        checkpoint = self.store.checkpoints.load(validate_session_id(session_id))
        if checkpoint is None:
            return SessionStatus(session_id=session_id, status="unknown")
        with redis_errors(self.store.client, f"read the marks of {session_id!r}"):
            parked = self.store.client.hget(self.keys.parked_of(session_id), session_id)
            aborted = bool(self.store.client.exists(self.keys.abort(session_id)))
        text = next((m.content for m in reversed(checkpoint.messages) if m.role == "assistant"), None)
        return SessionStatus(
            session_id=session_id,
            status="parked" if parked else checkpoint.status,
            agent_name=checkpoint.agent_name,
            steps=checkpoint.step_index,
            messages=len(checkpoint.messages),
            finish_reason=checkpoint.finish_reason,
            approval_id=checkpoint.approval_id,
            text=text,
            parked_reason=parked.decode() if isinstance(parked, bytes) else parked,
            aborted=aborted and checkpoint.status != "finished",
        )

    def checkpoint(self, session_id: str) -> Checkpoint | None:
        return self.store.checkpoints.load(validate_session_id(session_id))

    def resolve_approval(
        self,
        approval_id: str,
        *,
        approved: bool,
        note: str | None = None,
        action: InterruptedAction | None = None,
        result: Any = None,
    ) -> ApprovalSnapshot:
        """Record the decision (once: a second one raises) and let the fleet continue the run.

        A malformed decision (an id that is not a string, `approved` not a boolean, a `note` that is
        not text) raises `InvalidDecisionError` and records nothing, as `resume_after_approval` does.
        An interrupted-call approval also takes `action` ('rerun', 'record' with `result`, 'fail'; issue #17)."""
        decision = parse_decision(
            {"id": approval_id, "approved": approved, "note": note, "action": action, "result": result}
        )
        shown = self.store.approvals.load(decision.id)
        if shown is not None:  # the call it would run is the one shown, or nothing is decided (issue #17)
            check_calls_unchanged(shown, self.store.checkpoints.load)
        snapshot: ApprovalSnapshot = decide(self.store.approvals, decision)
        if snapshot.kind == "interrupted" and snapshot.session_id is not None:
            # A pause an abort left (issue #17): the human's decision continues the run, as in process.
            with redis_errors(self.store.client, f"clear the abort flag of {snapshot.session_id!r}"):
                self.store.client.delete(self.keys.abort(snapshot.session_id))
        if snapshot.session_id is not None:
            # Back in the in-flight index first: if the message below is lost (or its worker dies),
            # the reaper requeues the session; a paused session is otherwise out of the index for good.
            self.inflight.touch(snapshot.session_id)
            self._send_advance(snapshot.session_id, "approval")
        return snapshot

    def approvals(self, session_id: str | None = None) -> Listing[ApprovalSnapshot]:
        """Pending approvals (of one session, or all); `.skipped` names the unreadable ones (issue #21). A
        sub-agent's session's are those stored under its outermost parent whose chain holds it (issue #14)."""
        listed = self.store.approvals.pending(session_id)
        root = self._outermost_parent(session_id) if session_id is not None and not listed else None
        if root is None:
            return listed
        outer = self.store.approvals.pending(root)
        mine = [a for a in outer if any(part.session_id == session_id for part in approval_chain(a))]
        return Listing(mine, skipped=outer.skipped)

    def _outermost_parent(self, session_id: str) -> str | None:
        """The session at the top of a sub-agent's chain of parents; None for a session that is no sub-agent."""
        parent, seen = None, {session_id}
        checkpoint = self.store.checkpoints.load(validate_session_id(session_id))
        while checkpoint is not None and checkpoint.parent_session_id and checkpoint.parent_session_id not in seen:
            parent = checkpoint.parent_session_id
            seen.add(parent)
            checkpoint = self.store.checkpoints.load(parent)
        return parent

    def abort(self, session_id: str) -> bool:
        """Stop the run: running tools see their `ctx.signal`; unfinished calls get 'cancelled'.
        The session stays 'in-progress' and idle until new input (`enqueue`) or `resume`.

        False, and nothing written, when there is no run to stop: the session is finished or
        unknown (a flag left on a finished session would mark its next run aborted: issue #21), or
        it waits on an approval (nothing runs: reject the approval to stop it; issue #15)."""
        if not self._in_progress(session_id):
            return False
        flag = self.keys.abort(session_id)
        with redis_errors(self.store.client, f"set the abort flag of {session_id!r}"):
            # With the store's TTL from the moment it is set, as every key of the session (issue #16).
            self.store.client.set(flag, "1", px=self.store.checkpoints.ttl_ms or None)
        if not self._in_progress(session_id):  # it finished meanwhile: take the flag back
            with redis_errors(self.store.client, f"clear the abort flag of {session_id!r}"):
                self.store.client.delete(flag)
            return False
        self._send_advance(session_id, "abort", reaper_sends=False)  # the reaper leaves aborted sessions alone
        return True

    def _in_progress(self, session_id: str) -> bool:
        checkpoint = self.store.checkpoints.load(validate_session_id(session_id))
        return checkpoint is not None and checkpoint.status == "in-progress"

    def resume(self, session_id: str) -> None:
        """Continue a parked or aborted session by hand (its poison counters start over; a call that began
        stays begun, so that one of a tool that is not `on_interrupted="rerun"` meets its policy: issue #17)."""
        validate_session_id(session_id)
        client, attempts = self.store.client, self.keys.attempts(session_id)
        with redis_errors(client, f"clear the abort, parked and poison marks of {session_id!r}"):
            counts = {text(k): text(v) for k, v in cast(dict[bytes, bytes], client.hgetall(attempts)).items()}
            kept = {k: "1" if k.startswith("call:") else v for k, v in counts.items() if k.startswith(_KEPT_ON_RESUME)}
            pipe = client.pipeline(transaction=True)
            pipe.delete(self.keys.abort(session_id), attempts)
            if kept:
                pipe.hset(attempts, mapping=kept)
            pipe.hdel(self.keys.parked_of(session_id), session_id)
            pipe.execute()
        if self.store.checkpoints.load(session_id) is not None:  # a fork run on the fleet has none yet (issue #34)
            open_session_stream(self.store, session_id)
        self.inflight.touch(session_id)
        self._send_advance(session_id, "resume")

    def sessions(self, status: str | None = None) -> Listing[str]:
        """Session ids, optionally of one status ('in-progress', 'awaiting-approval', 'finished', 'parked');
        `.skipped` names the unreadable ones (issue #21)."""
        if status == "parked":
            return Listing(sorted(self.keys.parked_sessions()))
        return self.store.checkpoints.sessions(status)

    def events(
        self, session_id: str, after: str | None = None, *, block_s: float = 1.0, timeout_s: float | None = None
    ) -> EventFeed:
        """The session's live events, as the workers write them (issue #34): `for event in client.events(id)`
        (Flask, Django) or `async for ...` (FastAPI). From the stream's start, or after event id `after` (an
        event's `.id`, a browser's `Last-Event-ID`): none missed, none twice. Each read blocks up to `block_s`;
        the feed ends when the run pauses or finishes (or saw nothing for `timeout_s`). The checkpoint stays
        the truth: a `turn-started` of a later attempt means the turn's partial text is dropped."""
        validate_session_id(session_id)

        def idle() -> bool:
            status = self.status(session_id)
            return status.status != "in-progress" or status.aborted

        return EventFeed(self.store, session_id, idle=idle, after=after, block_s=block_s, timeout_s=timeout_s)


_KEPT_ON_RESUME = ("call:", "interrupted:")
"""What `resume` keeps of the attempts hash: which calls began (as one start each) and the interrupted marks."""


def _broker_refused(
    broker: str,
    session_id: str,
    exc: Exception,
    then: str = "the reaper sends it to the fleet once the broker takes messages again",
) -> SDKError:
    """The error of a message the broker did not take (a wrong password, a URL kombu cannot read, a broker
    that is down): kombu's own says neither which broker nor what became of the job, and may quote a piece of
    the password (issue #21). `then`: what becomes of the session. Raised `from None`: the chained original
    would show that piece in a logged traceback."""
    detail = redact_secrets(str(exc), *url_secrets(broker)).rstrip(". ")
    error = ConfigurationError if isinstance(exc, ValueError) else StoreUnavailableError
    return error(
        f"the broker at {redact_url(broker)} did not take the message of session {session_id!r}: {detail}. "
        f"The session is saved: {then} (check the broker's URL, address and password)"
    )
