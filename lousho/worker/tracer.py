"""Celery's task tracer for a task whose work is a coroutine, awaited on lousho's pool (issue #29).

Celery runs every task through its tracer (`celery.app.trace.build_tracer`): the `task_prerun` signal, the body,
the outcome (`Reject`, `Ignore`, `Retry` and failures, through Celery's own `TraceInfo`), `task_success`, the
`task_postrun` signal. The pool then calls the request's callback, which sends `task-succeeded` or `task-failed`
and acknowledges the message (acks_late). That tracer is synchronous: on lousho's pool a step waiting on its
model held a greenlet for the tracer's frames, about 6 KB of a process's memory per call in flight (Python 3.11
gives each greenlet a stack of its own for its frames, a page at least; docs/fleet.md).

lousho's tasks give their work as a coroutine too (`coroutine_body`, `tasks.py`); `apply_coroutine` does what
Celery's tracer does for them, in the same order and with Celery's own pieces, awaiting the coroutine where the
tracer calls the body. Celery's stack of requests (`task.request`) and current task are per thread: they are
set around each synchronous part (the signals, the outcome's handling), not across an await, so the coroutine
gets its request as an argument. What a lousho task never has goes through Celery's tracer, in a greenlet, as
before (`coroutine_args`): callbacks or a chain in its message, `on_success`/`after_return`/`before_start` of its
own, a result backend told it started, a worker that deduplicates successful tasks.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from billiard.einfo import ExceptionInfo  # type: ignore[import-untyped]
from celery import signals, states
from celery._state import _task_stack
from celery.app.task import Context, get_actual_ignore_result
from celery.app.trace import LOG_SUCCESS, TraceInfo, _signal_internal_error, report_internal_error, task_has_custom
from celery.app.trace import logger as celery_trace_log
from celery.exceptions import Ignore, Reject, Retry
from celery.utils.nodenames import gethostname
from celery.utils.saferepr import saferepr
from kombu import serialization

__all__ = ["CoroutineBody", "Decoded", "apply_coroutine", "coroutine_args"]

# kombu's serialization is untyped: how Celery's tracer decodes a message's body.
_loads: Callable[..., tuple[list[Any], dict[str, Any], dict[str, Any] | None]] = serialization.loads
_accepted: Callable[[Any], set[str]] = functools.cache(serialization.prepare_accept_content)
"""The content types an app accepts, as kombu's `loads` takes them: made once per app's setting, not per message."""

CoroutineBody = Callable[..., Coroutine[Any, Any, Any]]
"""A task's work as a coroutine: called with the task's request (Celery's `Context`) and the message's args."""


Decoded = tuple[list[Any], dict[str, Any], dict[str, Any] | None]
"""A message's body as Celery's tracer reads it: args, kwargs, and what it embeds (callbacks, chain, chord)."""


def coroutine_args(app: Any, task: Any, trace_args: tuple[Any, ...]) -> Decoded | None:
    """The message's decoded body when `apply_coroutine` does all Celery's tracer would do for this task and
    message; None when Celery's tracer must run it: no `coroutine_body`, hooks of the task's own, a result backend
    told it started (`track_started`), callbacks or a chain to send after it, a worker that deduplicates
    successful tasks, or a body that does not decode (Celery's tracer reports that)."""
    _name, _task_id, request, body, content_type, content_encoding = trace_args
    if getattr(task, "coroutine_body", None) is None or app.conf.worker_deduplicate_successful_tasks:
        return None
    if _has_hooks(task):
        return None
    ignore_result = request.get("ignore_result")
    if task.track_started and not (task.ignore_result if ignore_result is None else ignore_result):
        return None
    if content_type == "application/json" and _embeds_nothing(body):
        args, kwargs = request.get("args"), request.get("kwargs")
        if isinstance(args, list) and isinstance(kwargs, dict):
            return (args, kwargs, None)  # as Celery's request decoded them: one copy a step in flight, not two
    decoded: Decoded = body
    if content_type:
        try:
            decoded = _loads(body, content_type, content_encoding, accept=_accepted(tuple(app.conf.accept_content)))
        except Exception:  # whatever it is, Celery's tracer raises and reports it as for any task
            return None
    if not (isinstance(decoded, (list, tuple)) and len(decoded) == 3 and isinstance(decoded[2] or {}, dict)):
        return None  # not a body of Celery's protocol 2: Celery's tracer says so
    embed = decoded[2] or {}
    return None if embed.get("callbacks") or embed.get("chain") else decoded


_NO_EMBED = b', {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'
"""How a body of Celery's protocol 2 that embeds nothing ends, as kombu's JSON writes it (every lousho message)."""


def _embeds_nothing(body: Any) -> bool:
    """Whether the JSON body's last element is an embed of nothing: its args and kwargs are then all it holds,
    and Celery's request has them decoded (issue #29: the tracer decoded every body a second time)."""
    if isinstance(body, str):
        return body.endswith(_NO_EMBED.decode())
    try:
        return memoryview(body)[-len(_NO_EMBED) :] == _NO_EMBED
    except TypeError:  # not bytes-like: Celery's tracer reads it
        return False


_HOOKED: dict[type, bool] = {}
"""Task class -> whether it has hooks of its own that Celery's tracer calls (looked up once per task, not per message)."""


def _has_hooks(task: Any) -> bool:
    kind = type(task)
    if kind not in _HOOKED:
        _HOOKED[kind] = any(task_has_custom(task, hook) for hook in ("on_success", "after_return", "before_start"))
    return _HOOKED[kind]


async def apply_coroutine(
    app: Any,
    task: Any,
    trace_args: tuple[Any, ...],
    decoded: Decoded,
    callback: Callable[[Any], Any] | None,
    accept_callback: Callable[[int, float], Any] | None,
) -> tuple[int, Any, float | None]:
    """What Celery's `apply_target` does with its tracer (`trace_task_ret`), for a coroutine task: the request
    accepted (task-started), prerun, the work awaited, its outcome, postrun (Celery's `trace_task`, in its order),
    then the callback with `(failed, result or its repr, runtime)` (the ack). `trace_args`: what the pool was given
    for Celery's tracer (task name, id, request, body, content type, content encoding); `decoded`:
    `coroutine_args`'. One coroutine, its synchronous parts in functions: a step in flight holds its frame for
    minutes, hundreds a process (issue #29)."""
    if accept_callback:
        accept_callback(os.getpid(), time.monotonic())
    task_id, request = trace_args[1], _task_request(trace_args[2], decoded)
    args, kwargs = request.args, request.kwargs
    retval = state = None
    started = time.monotonic()
    try:
        try:
            _prerun(task, task_id, request)
            try:
                retval = await task.coroutine_body(request, *args, **kwargs)
            except Exception as exc:  # Reject, Ignore and Retry too: what Celery's tracer catches of a body
                with _current(task, request):
                    info, result = _failed(task, request, exc)
                state, retval = info.state, info.retval
                outcome: tuple[int, Any, float | None] = (1, result, None)
            else:
                with _current(task, request):
                    result = _succeeded(task, task_id, request, retval, started, args, kwargs)
                state, outcome = states.SUCCESS, (0, result, time.monotonic() - started)
        finally:
            _postrun(task, task_id, request, retval, state)
    except Reject:
        raise
    except Exception as exc:  # Celery's tracer's own failure (the loader's, a backend's): as it reports it
        outcome = (1, _internal_error(task, task_id, request, exc), None)
    if callback:
        callback(outcome)
    return outcome


def _task_request(request: dict[str, Any], decoded: Decoded) -> Context:
    """The task's request (`task.request`) as Celery's tracer makes it from the message's request and body."""
    args, kwargs, embed = decoded
    request.update({"args": args, "kwargs": kwargs, "hostname": gethostname(), "is_eager": False}, **(embed or {}))
    return _context(request)


def _prerun(task: Any, task_id: str, request: Context) -> None:
    """`task_prerun` and the loader's task init, with the task's request current."""
    with _current(task, request):
        if signals.task_prerun.receivers:
            signals.task_prerun.send(sender=task, task_id=task_id, task=task, args=request.args, kwargs=request.kwargs)
        task.app.loader.on_task_init(task_id, task)


def _postrun(task: Any, task_id: str, request: Context, retval: Any, state: str | None) -> None:
    """`task_postrun`, then the backend's and the loader's cleanup (whose failure Celery logs, not reports)."""
    try:
        with _current(task, request):
            if signals.task_postrun.receivers:
                signals.task_postrun.send(
                    sender=task, task_id=task_id, task=task, args=request.args, kwargs=request.kwargs,
                    retval=retval, state=state,
                )  # fmt: skip
    finally:
        try:
            task.backend.process_cleanup()
            task.app.loader.on_process_cleanup()
        except Exception as exc:
            celery_trace_log.error("Process cleanup failed: %r", exc, exc_info=True)


def _internal_error(task: Any, task_id: str, request: Context, exc: Exception) -> Any:
    """Celery's tracer's report of its own failure (called in its `except`: Celery reads `sys.exc_info()`)."""
    _signal_internal_error(task, task_id, request.args, request.kwargs, vars(request), exc)
    result = report_internal_error(task, exc)
    with _current(task, request):
        TraceInfo(states.FAILURE, exc).handle_error_state(task, request, eager=False, call_errbacks=True)
    return result


def _failed(task: Any, request: Context, exc: BaseException) -> tuple[TraceInfo, Any]:
    """What the tracer makes of an exception of the work (called in its `except`: Celery reads `sys.exc_info()`)."""
    if isinstance(exc, (Reject, Ignore)):
        info = TraceInfo(states.REJECTED if isinstance(exc, Reject) else states.IGNORED, exc)
        result = ExceptionInfo(internal=True)
        (info.handle_reject if isinstance(exc, Reject) else info.handle_ignore)(task, request)
        return info, result
    info = TraceInfo(states.RETRY if isinstance(exc, Retry) else states.FAILURE, exc)
    return info, info.handle_error_state(task, request, eager=False, call_errbacks=not isinstance(exc, Retry))


def _succeeded(
    task: Any, task_id: str, request: Context, retval: Any, started: float, args: list[Any], kwargs: dict[str, Any]
) -> str:
    """The result stored (if the task keeps results), `task_success` sent, Celery's success log line: the result's repr."""
    task.backend.mark_as_done(task_id, retval, request, not get_actual_ignore_result(task, request))
    shown: str = saferepr(retval, task.resultrepr_maxsize)
    runtime = time.monotonic() - started
    if signals.task_success.receivers:
        signals.task_success.send(sender=task, result=retval, runtime=runtime)
    celery_trace_log.info(
        LOG_SUCCESS,
        {
            "id": task_id, "name": request.get("shadow") or task.name, "return_value": shown, "runtime": runtime,
            "args": request.get("argsrepr") or saferepr(args), "kwargs": request.get("kwargsrepr") or saferepr(kwargs),
        },
    )  # fmt: skip
    return shown


_CELERY_KEYS = frozenset({*Context.__dict__, "lang", "task", "argsrepr", "kwargsrepr", "compression"})
"""What `Context` does not count among a message's custom headers (`Context._get_custom_headers`)."""


def _context(request: dict[str, Any]) -> Context:
    """Celery's `Context(request, called_directly=False)`, made on the request's own dict instead of a copy (Celery's
    request holds that dict for the task's life anyway), its custom headers in a dict of their own size (Celery
    copies every header, then drops its own): 1.6 KB less a call in flight (issue #29)."""
    request["called_directly"] = False
    context = Context.__new__(Context)
    context.__dict__ = request
    timelimit = request.get("timelimit")
    if isinstance(timelimit, (list, tuple)) and len(timelimit) >= 2:  # as `Context.update`
        context.time_limit, context.soft_time_limit = timelimit[0], timelimit[1]
    if context.headers is None:
        context.headers = {name: value for name, value in request.items() if name not in _CELERY_KEYS} or None
    return context


@contextmanager
def _current(task: Any, request: Context) -> Iterator[None]:
    """The task and its request as Celery's current ones, for a synchronous part of its trace."""
    _task_stack.push(task)
    task.request_stack.push(request)
    try:
        yield
    finally:
        task.request_stack.pop()
        _task_stack.pop()
