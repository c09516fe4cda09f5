"""The Celery tasks: thin entry points onto `SessionSteps`. Each returns a word saying what it did
(Flower shows it); a typed error is logged and the message acked: bad input never crashes a worker.

A message of a newer protocol than this worker runs, or one whose session a newer lousho wrote, is handed
back unrun for a worker that speaks it (`lousho.fleet.protocol`, issue #35)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from celery.exceptions import Reject

from lousho.checkpoint import validate_session_id
from lousho.errors import (
    AgentDriftError,
    CorruptCheckpointError,
    NewerFormatError,
    ResumeToolMissingError,
    SDKError,
    SessionSupersededError,
    StoreUnavailableError,
)
from lousho.fleet.protocol import HAND_BACK_DELAY_S, message_protocol, too_new
from lousho.fleet.settings import TASK_ADVANCE, TASK_MODEL_TURN, TASK_REAP, TASK_TOOL_CALL
from lousho.formats import MESSAGE_PROTOCOL
from lousho.telemetry.counters import FleetCounters
from lousho.worker.runtime import FleetRuntime, UnknownAgentError
from lousho.worker.steps import SessionSteps
from lousho.worker.tool_task import run_tool_call

__all__ = ["register_tasks"]

log = logging.getLogger("lousho.worker")


# Errors that no retry can fix: the session is parked (listed by `Client.sessions(status="parked")`)
# instead of being requeued by the reaper forever. Others (a store that is down, a lost lease) are
# left to the reaper.
NEEDS_A_HUMAN = (UnknownAgentError, CorruptCheckpointError, ResumeToolMissingError, AgentDriftError)


async def hand_back(runtime: FleetRuntime, request: Any, why: str) -> NoReturn:
    """Put the task's message back on its queue unrun, for a worker that can run it (issue #35): after
    `HAND_BACK_DELAY_S`, so a worker alone with it does not spin; logged and counted."""
    log.warning(
        "lousho: handed back %s %s unrun, for a worker of a later lousho: %s (this worker runs message "
        "protocols up to %d)", request.task, request.id, why, MESSAGE_PROTOCOL,
    )  # fmt: skip
    try:
        FleetCounters.of(runtime.store).add("messages_handed_back")  # lousho_messages_handed_back_total
    except StoreUnavailableError as exc:
        log.warning("could not count a handed-back message: %s", exc)
    await asyncio.sleep(HAND_BACK_DELAY_S)
    raise Reject(why, requeue=True)  # acks_late: the very message goes back on its queue


StepWork = Callable[..., Coroutine[Any, Any, str]]
"""What a task does: `work(steps, *args)`, the session's steps and the message's args after the session id."""


async def _guarded(
    runtime: FleetRuntime, work: StepWork, request: Any, session_id: Any, *args: Any, **kwargs: Any
) -> str:
    """A task's work on session `session_id`, given its request (Celery's `Context`: `task.request`); then its
    events written to the session's stream. One coroutine: a step in flight holds its frame (issue #29)."""
    runtime.name_process()  # lousho's pool awaits this without `FleetRuntime.run`
    protocol = message_protocol(request)
    if too_new(protocol):
        await hand_back(runtime, request, f"its message is of protocol {protocol}")
    try:
        validate_session_id(session_id)
        steps = SessionSteps(runtime, session_id)
        steps.step_end.delivery_tag = _delivery_tag(request)
        try:
            try:
                outcome: str = await work(steps, *args, **kwargs)
            except BaseException as exc:
                _tell_failure(steps, exc)
                raise
            else:
                _tell_outcome(steps, outcome)
            finally:
                steps.events.close()
        except NewerFormatError as exc:  # a session a newer lousho wrote: not damage, never parked
            await hand_back(runtime, request, str(exc))
        except NEEDS_A_HUMAN as exc:
            steps.park(str(exc))
            raise
        if outcome in ENDED:
            runtime.store.checkpoints.forget_transcript(session_id)
        else:  # its next step runs on any process of the fleet: kept only for a moment (issue #29)
            runtime.store.checkpoints.set_aside_transcript(session_id, runtime.settings.transcript_keep_s)
        return outcome
    except SessionSupersededError as exc:  # the session was deleted or made anew meanwhile (issue #21)
        log.warning("session %r: %s", str(session_id)[:200], exc)
        return "superseded"
    except SDKError as exc:
        log.error("session %r: %s", str(session_id)[:200], exc)
        return f"error: {exc.code}"


def _delivery_tag(request: Any) -> str:
    """The delivery tag of the task's message (kombu's, in its properties), '' when it has none (called directly):
    its step's end acknowledges it (`StepEnd.delivery_tag`, issue #30)."""
    properties = getattr(request, "properties", None) or {}
    return str(properties.get("delivery_tag") or "")


def _register(app: Any, runtime: FleetRuntime, name: str, work: StepWork) -> None:
    """Task `name`, whose work is `work(steps, *args)` under `_guarded`: its body runs that to its end on the pool's
    loop or the thread's (`FleetRuntime.run`); lousho's pool awaits `coroutine_body` instead."""
    guarded = functools.partial(_guarded, runtime, work)

    def body(task: Any, *args: Any, **kwargs: Any) -> str:
        outcome: str = runtime.run(guarded(task.request, *args, **kwargs))
        return outcome

    body.__doc__, body.__name__ = work.__doc__, name.rpartition(".")[2]
    # shared=False: Celery's default hands a task to every app made later in the process, so a second
    # app (a test's, a FleetDriver's worker) would run the first app's tasks, on its runtime (issue #14).
    # bind=True: each task reads its message's protocol header (issue #35)
    app.task(name=name, shared=False, bind=True, coroutine_body=staticmethod(guarded))(body)


STOPPED = {"finished": "finished", "aborted": "aborted"}
"""A step's outcome that the session's event stream tells as how the run stopped (issue #34)."""
ENDED = {*STOPPED, "parked"}
"""A step's outcome after which the session's next save is a client's: the process forgets its transcript."""


def _tell_failure(steps: SessionSteps, exc: BaseException) -> None:
    """A task's work raised: its failure in the session's stream (the reaper sends the session again); nothing for a
    session deleted meanwhile, nor for one handed back untouched for a later lousho (issue #35)."""
    if isinstance(exc, (SessionSupersededError, NewerFormatError)):
        steps.events.enabled = False
    else:
        steps.events.add("failed", data={"error": f"{type(exc).__name__}: {exc}"[:2000]})


def _tell_outcome(steps: SessionSteps, outcome: str) -> None:
    """How the run stopped, if it did; a deleted session's stream is not made again."""
    if outcome in STOPPED:
        steps.events.add(STOPPED[outcome])  # type: ignore[arg-type]
    elif outcome == "unknown-session":
        steps.events.enabled = False


def model_turn(steps: SessionSteps, turn: int) -> Coroutine[Any, Any, str]:
    """Ask the model for turn `turn` of the session (a no-op when that turn is recorded)."""
    return steps.advance(expected_turn=int(turn))


def tool_call(steps: SessionSteps, tool_call_id: str, tool_name: str = "", turn: int = 0) -> Coroutine[Any, Any, str]:
    """Run one tool call of model turn `turn` (a no-op when its result is recorded)."""
    return run_tool_call(steps, str(tool_call_id), int(turn))


def advance(steps: SessionSteps, reason: str = "") -> Coroutine[Any, Any, str]:
    """Do what the checkpoint says is next (after an approval, an abort, a requeue)."""
    return steps.advance(redispatch=reason in ("reaper", "resume"), requeue=reason == "reaper", abort=reason == "abort")


def register_tasks(app: Any, runtime: FleetRuntime) -> None:
    """lousho's tasks on `app`. Each gives its work as a coroutine too (`coroutine_body`): lousho's pool awaits it
    (`tracer.py`, no greenlet a call in flight); any other pool runs the task's body, which runs it to its end."""

    for name, work in ((TASK_MODEL_TURN, model_turn), (TASK_TOOL_CALL, tool_call), (TASK_ADVANCE, advance)):
        _register(app, runtime, name, work)

    @app.task(name=TASK_REAP, shared=False)  # type: ignore[untyped-decorator]
    def reap() -> int:
        """One pass of the reaper (installed as a beat entry by `create_app`)."""
        from lousho.scheduler.approval_repair import repair_if_due
        from lousho.scheduler.reaper import reap_once

        # A queue named after this app's agents is no place for another app's session (issue #15).
        settings = runtime.settings if runtime.queue_named else dataclasses.replace(runtime.settings, queue=None)
        repair_if_due(runtime.store, settings)  # approval records a Cluster failover lost in part (issue #18)
        return len(reap_once(runtime.store, runtime.app, settings))
