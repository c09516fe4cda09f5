"""End: how a fleet step ends, in one Redis script: its last writes and its next tasks (issue #30).

A step collects what its end must do (the tool calls to mark and send, a completed turn's state
to drop, the next model turn to ask for) and does it in end_step.lua, with the session's lease
released in the same script. When the step's last save is known in advance (a model answer whose
calls are all simply sent, a tool turn's last result), that save carries the end (save_end.lua,
via `FencedCheckpoints.and_then`): one round trip per hop less (issue #9). The next tasks are
pushed by the same script (`Outbox`), or, when the outbox is off, sent through Celery right after.
Sent while the lease is held, the next model turn would be taken by an idle worker at once,
which would find the lease busy and drop it: tasks always go out after the release.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lousho.checkpoint import Checkpoint
from lousho.fleet.broker_qos import removed_with_step
from lousho.fleet.dispatch import model_turn_task, send, tool_call_task
from lousho.fleet.keys import result_field
from lousho.messages import ToolCall
from lousho.stores.redis_checkpoints import AndThen
from lousho.stores.redis_common import redis_errors
from lousho.worker.leases import Lease
from lousho.worker.runtime import FleetRuntime
from lousho.worker.scripts import FleetScripts

__all__ = ["Ending", "FencedCheckpoints", "StepEnd", "end_step", "queue_key", "save_and_end", "sends"]


@dataclass(frozen=True)
class Ending:
    """A step's end as end_step.lua takes it: the turn's state to drop, the calls to mark and send,
    the next model turn's message. A message is '' when the worker sends that task itself."""

    queue_key: str
    """The broker's queue list the messages go to (`Outbox.encode`)."""
    epoch: str
    """The incarnation the step worked for: if the session is another one now, the end only releases."""
    turn_complete: bool = False
    redispatch: bool = False
    calls: Sequence[tuple[str, str]] = ()
    """Per call: its field (`result_field`) and its message."""
    next_message: str = ""
    ack: tuple[str, str, str] | None = None
    """kombu's unacked hash, its index and the delivery tag of the message the step ran for: acknowledged with the
    end (end_step.lua; `Outbox.ack_keys`). None: Celery acknowledges it as the task returns."""


def end_step(scripts: FleetScripts, session_id: str, lease: Lease, ending: Ending) -> list[bool]:
    """Mark the calls, drop a completed turn's state, release the lease, push the messages
    (close_step.lua); per call, whether it is to be sent."""
    keys, args = _end_parts(scripts, session_id, ending)
    with redis_errors(scripts.client, f"release the lease of session {session_id!r}"):
        reply = scripts.close_step(keys=[lease.key, *keys], args=[lease.token, *args])
    lease.held = False
    return sends(reply)


def save_and_end(scripts: FleetScripts, session_id: str, ending: Ending) -> AndThen:
    """`end_step` in the round trip of the step's last save (`RedisCheckpointStore.save(and_then=...)`,
    save_end.lua); its reply goes through `sends`."""
    keys, args = _end_parts(scripts, session_id, ending)
    return AndThen(script=scripts.save_end, keys=keys, args=args)


def sends(reply: list[Any]) -> list[bool]:
    """end_step.lua's reply: per call, whether it is to be sent (pushed already if it had a message)."""
    return [bool(flag) for flag in reply[1:]]


def queue_key(scripts: FleetScripts, session_id: str, ending: Ending) -> str:
    """The broker's queue for the outbox's pushes; on a Redis Cluster store (issue #18) the outbox is off
    (the broker is another server: no message to push, nor a mark holding one), and a key of the session's
    own slot stands in, never read or written, so the script still touches one slot."""
    store = scripts.store
    return store.keys.session_key(session_id, "outbox") if store.keys.per_slot else ending.queue_key


def _end_parts(scripts: FleetScripts, session_id: str, ending: Ending) -> tuple[list[str], list[str | int]]:
    """end_step.lua's keys after the lease (dispatched, results, attempts, the queue, the epoch, a
    call lease per call, kombu's unacked hash and index with an ack) and its args after the token (the epoch,
    clear, redispatch, the next message, the delivery tag or '', per call its field and message)."""
    keys = [
        scripts.keys.dispatched(session_id),
        scripts.keys.results(session_id),
        scripts.keys.attempts(session_id),
        queue_key(scripts, session_id, ending),
        scripts.keys.epoch(session_id),
        *(scripts.keys.call_lease(session_id, field.split(":", 1)[1]) for field, _ in ending.calls),
        *(ending.ack[:2] if ending.ack else ()),
    ]
    args: list[str | int] = [
        ending.epoch,
        "1" if ending.turn_complete else "0",
        "1" if ending.redispatch else "0",
        ending.next_message,
        ending.ack[2] if ending.ack else "",
        *(part for call in ending.calls for part in call),
    ]
    return keys, args


@dataclass
class FencedCheckpoints:
    """The store's checkpoints, with every save fenced on this worker's session lease."""

    inner: Any
    lease: Lease
    and_then: AndThen | None = None
    """Set for the step's last save: the step's end runs in that save's round trip."""
    ended: list[Any] | None = None
    """What the end in a save replied (`sends`); None while no save ended the step."""
    before: Callable[[], Awaitable[Callable[[Any], int] | None]] | None = None
    """What each save carries ahead of it (`EventWriter.ride_with_save`: the step's pending events)."""

    async def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        before = await self.before() if self.before is not None else None  # the step's pending events (issue #34)
        and_then, self.and_then = self.and_then, None
        fence = (self.lease.key, self.lease.token)
        reply = self.inner.save(session_id, checkpoint, fence=fence, and_then=and_then, before=before)
        if and_then is not None:
            self.ended, self.lease.held = reply, False

    def load(self, session_id: str) -> Checkpoint | None:
        loaded: Checkpoint | None = self.inner.load(session_id)
        return loaded

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        self.inner.delete(session_id, keep_history=keep_history)


class StepEnd:
    """What one step's end must do, and doing it."""

    def __init__(self, runtime: FleetRuntime, session_id: str) -> None:
        self.runtime = runtime
        self.session_id = session_id
        self.calls: list[tuple[int, ToolCall]] = []
        """(turn, call) of each tool call to mark and send."""
        self.next_turn: int | None = None
        self.redispatch = False
        """Send calls again that were marked before but whose lease nobody holds (reaper, resume)."""
        self.turn_complete = False
        """The checkpoint the step leaves has no pending call: drop the turn's results and marks."""
        self.fenced: FencedCheckpoints | None = None
        """The step's checkpoint store (the run's), whose next save may carry the end."""
        self.epoch = ""
        """The session's incarnation the step works for (lua/lib/epoch.lua)."""
        self.delivery_tag = ""
        """The delivery tag of the message the step runs for: acknowledged by the end's script when it can be
        (`Outbox.ack_keys`, issue #30); '' for none (a step run without a message, as in tests)."""
        self._ending: Ending | None = None

    @property
    def done(self) -> bool:
        """A save ended the step already: nothing may be written after it."""
        return self.fenced is not None and self.fenced.ended is not None

    def send_calls(self, turn: int, calls: Sequence[ToolCall], redispatch: bool = False) -> None:
        self.calls += [(turn, call) for call in calls]
        self.redispatch = self.redispatch or redispatch

    def complete_turn(self, next_turn: int | None) -> None:
        """The turn's results are all recorded (or the run finished): ask for `next_turn`, if any."""
        self.turn_complete, self.next_turn = True, next_turn

    def in_next_save(self) -> None:
        """Make the step's next save its last: the end runs in that save's round trip. Only for a
        save after which the step writes nothing else."""
        assert self.fenced is not None
        self.fenced.and_then = save_and_end(self.runtime.scripts, self.session_id, self.prepare())

    def prepare(self) -> Ending:
        """The end, for a script that runs it with the step's last save."""
        self._ending = self.ending()
        return self._ending

    def forget(self) -> None:
        """The step failed: nothing it meant to send goes out, no turn state is dropped. (Once a save
        ended the step, its outcome is stored and marked: what it meant to send still goes out.)"""
        if self.done:
            return
        self.calls, self.next_turn, self.turn_complete, self._ending = [], None, False, None
        if self.fenced is not None:
            self.fenced.and_then = None

    def ending(self) -> Ending:
        """The end as end_step.lua takes it, with the messages to push when the outbox is on."""
        outbox = self.runtime.outbox
        direct = outbox.direct
        calls = [
            (
                result_field(turn, call.id),
                outbox.encode(tool_call_task(self.session_id, call.id, call.name, turn)) if direct else "",
            )
            for turn, call in self.calls
        ]
        next_message = ""
        if direct and self.next_turn is not None:
            next_message = outbox.encode(model_turn_task(self.session_id, self.next_turn))
        ack_keys = outbox.ack_keys() if self.delivery_tag else None
        ack = (*ack_keys, self.delivery_tag) if ack_keys else None
        return Ending(outbox.queue_key, self.epoch, self.turn_complete, self.redispatch, calls, next_message, ack)

    def finish(self, lease: Lease) -> None:
        """End the step (unless its last save did), then send what the script did not push."""
        if self.done:
            assert self.fenced is not None and self.fenced.ended is not None and self._ending is not None
            ending, to_send = self._ending, sends(self.fenced.ended)
        else:
            ending = self.ending()
            to_send = end_step(self.runtime.scripts, self.session_id, lease, ending)
        if ending.ack is not None:  # the script removed the message's record: Celery's ack has nothing to write
            removed_with_step(ending.ack[2])
            self.delivery_tag = ""  # one end acknowledges it
        app = self.runtime.app
        for (turn, call), (_, message), send_it in zip(self.calls, ending.calls, to_send, strict=True):
            if send_it and not message:
                send(app, tool_call_task(self.session_id, call.id, call.name, turn))
        if self.next_turn is not None and not ending.next_message:
            send(app, model_turn_task(self.session_id, self.next_turn))
        self.calls, self.next_turn = [], None
