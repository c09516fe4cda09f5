"""How a fleet step ends: in one Redis script, its last writes and its next tasks.

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
from lousho.worker.leases import Lease
from lousho.worker.runtime import FleetRuntime
from lousho.worker.scripts import Ending, sends

__all__ = ["FencedCheckpoints", "StepEnd"]


@dataclass
class FencedCheckpoints:
    """The store's checkpoints, with every save fenced on this worker's session lease."""

    inner: Any
    lease: Lease
    and_then: AndThen | None = None
    """Set for the step's last save: the step's end runs in that save's round trip."""
    ended: list[Any] | None = None
    """What the end in a save replied (`scripts.sends`); None while no save ended the step."""
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
        self.fenced.and_then = self.runtime.scripts.save_and_end(self.session_id, self.prepare())

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
            to_send = self.runtime.scripts.end_step(self.session_id, lease, ending)
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
