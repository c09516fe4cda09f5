"""lousho's pool traces a task whose work is a coroutine itself (lousho/worker/tracer.py, issue #29): the work is
awaited on the pool's loop with no greenlet held while it waits, each gets its own request, and the outcome and the
signals are the ones Celery's own tracer gives, for each kind of outcome. In process: a Celery app, the pool's
loops, no worker (tests/fleet/test_many_in_flight.py runs lousho's tasks so on real workers)."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from billiard.einfo import ExceptionInfo  # type: ignore[import-untyped]
from celery import Celery, Task, signals
from celery import _state as celery_state
from celery.app.task import Context
from celery.app.trace import trace_task_ret
from celery.exceptions import Ignore, Reject, Retry

from lousho.worker.pool import AsyncioPool, _StepGreenlet, await_on_loop, on_pool_loop
from lousho.worker.tracer import _context, apply_coroutine, coroutine_args

app = Celery("lousho-test-tracer", set_as_current=False)
app.conf.update(task_acks_late=True, task_ignore_result=True, broker_url="memory://")  # a callback's publish


def act(kind: str) -> str:
    """What a task's work does, by `kind`: each outcome Celery's tracer tells apart."""
    if kind == "reject":
        raise Reject("not for this worker", requeue=True)
    if kind == "ignore":
        raise Ignore()
    if kind == "retry":
        raise Retry("again later")
    if kind == "fail":
        raise ValueError("the work failed")
    return f"done {kind}"


async def act_later(request: Any, kind: str) -> str:
    await asyncio.sleep(0)
    return act(kind)


@app.task(name="t.act", bind=True, shared=False, coroutine_body=staticmethod(act_later))  # type: ignore[untyped-decorator]
def act_task(task: Any, kind: str) -> str:
    return act(kind)


class Seen:
    """What two coroutine tasks saw while they ran side by side on one loop."""

    def __init__(self) -> None:
        self.requests: dict[str, tuple[str, Any]] = {}
        self.on_pool_loop: list[bool] = []
        self.greenlets: list[int] = []
        self.release = threading.Event()


SEEN = Seen()


async def look_around(request: Any, name: str) -> str:
    SEEN.on_pool_loop.append(on_pool_loop())
    SEEN.greenlets.append(sum(isinstance(o, _StepGreenlet) for o in gc.get_objects()))
    while not SEEN.release.is_set():  # noqa: ASYNC110 -- as a step waits on its model; set from the test's thread
        await asyncio.sleep(0.01)
    SEEN.requests[name] = (request.id, app.tasks["t.look"].request.id)
    return name


@app.task(name="t.internal", bind=True, shared=False, coroutine_body=staticmethod(act_later))  # type: ignore[untyped-decorator]
def internal_task(task: Any, kind: str) -> str:
    """Traced only by `test_a_failure_of_the_tracer_itself_is_reported_as_celerys_tracer_reports_it`, with a broken
    loader (Celery's tracer takes the loader's hooks when it is first built for a task)."""
    return act(kind)


@app.task(name="t.look", bind=True, shared=False, coroutine_body=staticmethod(look_around))  # type: ignore[untyped-decorator]
def look_task(task: Any, name: str) -> str:
    raise AssertionError("lousho's pool awaits the coroutine")


@app.task(name="t.plain", bind=True, shared=False)  # type: ignore[untyped-decorator]
def plain_task(task: Any) -> bool:
    async def nothing() -> None:
        await asyncio.sleep(0)

    await_on_loop(nothing())
    return on_pool_loop()


def message(name: str, *args: Any) -> tuple[Any, ...]:
    """What Celery's consumer hands its pool for a message of task `name` (`Request.execute_using_pool`)."""
    task_id = uuid.uuid4().hex
    request = {"id": task_id, "task": name, "root_id": task_id, "delivery_info": {"routing_key": "q"}}
    return (name, task_id, request, (list(args), {}, {}), None, None)


@pytest.fixture
def signals_sent() -> Iterator[list[tuple[str, str, Any]]]:
    """(signal, task id as `task.request` says while it is sent, state or result)."""
    sent: list[tuple[str, str, Any]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any = None, **kwargs: Any) -> None:
            sent.append((name, sender.request.id, kwargs.get("state", kwargs.get("result"))))

        return receive

    receivers = {
        signal: receiver(name)
        for name, signal in (("prerun", signals.task_prerun), ("postrun", signals.task_postrun),
                             ("success", signals.task_success), ("failure", signals.task_failure),
                             ("retry", signals.task_retry))
    }  # fmt: skip
    for signal, receive in receivers.items():
        signal.connect(receive, weak=False)
    yield sent
    for signal, receive in receivers.items():
        signal.disconnect(receive)


def shape(outcome: tuple[int, Any, Any]) -> tuple[int, Any]:
    """Whether it failed, and its result's repr or its exception's type (unwrapped as Celery's request unwraps it)."""
    failed, result, _runtime = outcome
    if not isinstance(result, ExceptionInfo):
        return (failed, result)
    return (failed, type(getattr(result.exception, "exc", result.exception)))


@pytest.mark.parametrize("kind", ["return", "reject", "ignore", "retry", "fail"])
def test_a_coroutine_task_ends_as_celerys_tracer_ends_it(kind: str, signals_sent: list[tuple[str, str, Any]]) -> None:
    by_celery = trace_task_ret(*message("t.act", kind), app=app)
    celerys_signals = [(name, state) for name, _id, state in signals_sent]
    signals_sent.clear()

    trace_args = message("t.act", kind)
    task_id, body = trace_args[1], trace_args[3]
    ours = asyncio.run(apply_coroutine(app, app.tasks["t.act"], trace_args, body, None, None))

    assert shape(ours) == shape(by_celery)
    assert [(signal, state) for signal, _id, state in signals_sent] == celerys_signals
    assert {sent_for for _signal, sent_for, _state in signals_sent} == {task_id}, "task.request is the task's own"
    assert app.tasks["t.act"].request.id is None, "no request is left current after the trace"


def test_a_failure_of_the_tracer_itself_is_reported_as_celerys_tracer_reports_it(
    signals_sent: list[tuple[str, str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("the loader failed")

    monkeypatch.setattr(app.loader, "on_task_init", broken)
    internal: list[type[BaseException]] = []

    def told(sender: Any = None, **kwargs: Any) -> None:
        internal.append(type(kwargs["exception"]))

    signals.task_internal_error.connect(told, weak=False)
    try:
        with pytest.warns(RuntimeWarning, match="outside body"):  # Celery's report_internal_error warns
            by_celery = trace_task_ret(*message("t.internal", "return"), app=app)
        celerys_signals = [(name, state) for name, _id, state in signals_sent]
        signals_sent.clear()
        trace_args = message("t.internal", "return")
        with pytest.warns(RuntimeWarning, match="outside body"):
            ours = asyncio.run(apply_coroutine(app, app.tasks["t.internal"], trace_args, trace_args[3], None, None))
    finally:
        signals.task_internal_error.disconnect(told)

    assert ours[0] == 1 and shape(ours) == shape(by_celery)
    assert [signal for signal, _id, _state in signals_sent] == ["prerun", "postrun", "failure"]
    assert [(signal, state) for signal, _id, state in signals_sent] == celerys_signals
    assert internal == [RuntimeError, RuntimeError]


@pytest.mark.parametrize("timelimit", [[30, 20], [None, None], None])
def test_the_request_a_coroutine_task_gets_is_celerys_context_of_its_message(timelimit: Any) -> None:
    _name, task_id, request, *_ = message("t.act", "return")
    request.update(lousho_protocol=2, retries=1, args=["x"], kwargs={}, hostname="h", is_eager=False)
    if timelimit is not None:
        request["timelimit"] = timelimit

    made = _context(dict(request))

    assert vars(made) == vars(Context(dict(request), called_directly=False))
    assert made.headers == {"lousho_protocol": 2} and made.id == task_id


@pytest.fixture
def pool() -> Iterator[AsyncioPool]:
    pool = AsyncioPool(limit=4, app=app)
    pool.on_start()
    yield pool
    pool.on_stop()


def test_coroutine_tasks_wait_on_the_pools_loop_holding_no_greenlet_each_with_its_own_request(
    pool: AsyncioPool,
) -> None:
    outcomes: list[Any] = []
    accepted = threading.Semaphore(0)
    SEEN.__init__()  # type: ignore[misc]
    sent = [message("t.look", "first"), message("t.look", "second")]
    applied = [
        pool.on_apply(
            trace_task_ret, args=args, callback=outcomes.append, accept_callback=lambda *_: accepted.release()
        )
        for args in sent
    ]
    assert accepted.acquire(timeout=30) and accepted.acquire(timeout=30)
    while len(SEEN.greenlets) < 2:
        threading.Event().wait(0.01)
    SEEN.release.set()
    for outcome in applied:
        outcome.get(timeout=30)

    assert SEEN.on_pool_loop == [False, False], "the work runs on the loop itself, not in a greenlet"
    assert SEEN.greenlets == [0, 0]
    assert SEEN.requests == {"first": (sent[0][1], None), "second": (sent[1][1], None)}, (
        "each sees its own request, and no other task's as Celery's current one"
    )
    assert sorted(outcome[:2] for outcome in outcomes) == [(0, "'first'"), (0, "'second'")]


def test_a_task_with_no_coroutine_runs_through_celerys_tracer_in_a_greenlet(pool: AsyncioPool) -> None:
    outcomes: list[Any] = []
    applied = pool.on_apply(trace_task_ret, args=message("t.plain"), kwargs={"app": app}, callback=outcomes.append)
    applied.get(timeout=30)

    assert [outcome[:2] for outcome in outcomes] == [(0, "True")]


async def say_coroutine(request: Any) -> str:
    await asyncio.sleep(0)
    return "coroutine"


@app.task(name="t.both", bind=True, shared=False, coroutine_body=staticmethod(say_coroutine))  # type: ignore[untyped-decorator]
def both_task(task: Any) -> str:
    return "by celery"


@app.task(name="t.noted", shared=False)  # type: ignore[untyped-decorator]
def noted_task(*_: Any) -> None:
    """A callback: linked to a message, sent when that task succeeds."""


@pytest.fixture
def current() -> Iterator[None]:
    """This module's app as Celery's current one, as in a worker (Celery's tracer finds the task by name in it)."""
    before = celery_state.default_app
    app.set_default()  # the pool's loop threads see it (the current app is per thread)
    yield
    celery_state.default_app = before


@pytest.mark.usefixtures("current")
def test_a_message_with_callbacks_goes_through_celerys_tracer(pool: AsyncioPool) -> None:
    plain, linked = message("t.both"), message("t.both")
    linked = (*linked[:3], ([], {}, {"callbacks": [noted_task.s()], "chain": None}), None, None)
    outcomes: list[Any] = []
    for args in (plain, linked):
        pool.on_apply(trace_task_ret, args=args, callback=outcomes.append).get(timeout=30)

    assert [outcome[:2] for outcome in outcomes] == [(0, "'coroutine'"), (0, "'by celery'")]


@pytest.mark.parametrize(
    ("task_options", "body", "content_type", "traced_as_coroutine"),
    [
        ({}, ([], {}, {}), None, True),
        ({}, b'[[], {}, {"callbacks": null, "chain": null}]', "application/json", True),
        ({"track_started": True, "ignore_result": False}, ([], {}, {}), None, False),  # a backend told it started
        ({}, ([], {}, {"chain": [{"task": "t.noted"}]}), None, False),
        ({}, b"not json", "application/json", False),  # Celery's tracer reports it
        ({}, ["not", "a body"], None, False),
    ],
)
def test_celerys_tracer_runs_what_the_coroutine_tracer_does_not_do(
    task_options: dict[str, Any], body: Any, content_type: str | None, traced_as_coroutine: bool
) -> None:
    task = app.tasks["t.both"]
    saved = {name: getattr(task, name) for name in task_options}
    for name, value in task_options.items():
        setattr(task, name, value)
    try:
        name, task_id, request, *_ = message("t.both")
        decoded = coroutine_args(app, task, (name, task_id, request, body, content_type, "utf-8"))
    finally:
        for name, value in saved.items():
            setattr(task, name, value)

    assert (decoded is not None) == traced_as_coroutine


@pytest.mark.parametrize("as_buffer", [False, True])
def test_a_body_that_embeds_nothing_is_not_decoded_again(as_buffer: bool) -> None:
    name, task_id, request, *_ = message("t.both")
    request.update(args=["s1", 2], kwargs={})  # as Celery's request decoded them
    nothing = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    body = json.dumps([["s1", 2], {}, nothing]).encode()  # as kombu writes a lousho message
    linked = json.dumps([["s1", 2], {}, {**nothing, "chain": [{"task": "t.noted"}]}]).encode()

    def read(raw: bytes) -> Any:
        return coroutine_args(app, app.tasks["t.both"], (name, task_id, request, memoryview(raw) if as_buffer else raw,
                                                         "application/json", "utf-8"))  # fmt: skip

    decoded = read(body)
    assert decoded is not None and decoded[0] is request["args"] and decoded[1] is request["kwargs"]
    assert read(linked) is None, "a body that embeds a chain is read, and left to Celery's tracer"


class Hooked(Task):  # type: ignore[misc]
    """A task class with a hook of its own, which only Celery's tracer calls."""

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        return None


@app.task(name="t.hooked", bind=True, shared=False, base=Hooked, coroutine_body=staticmethod(say_coroutine))  # type: ignore[untyped-decorator]
def hooked_task(task: Any) -> str:
    return "by celery"


def test_a_task_with_hooks_of_its_own_goes_through_celerys_tracer() -> None:
    assert coroutine_args(app, app.tasks["t.hooked"], message("t.hooked")) is None
    assert coroutine_args(app, app.tasks["t.both"], message("t.both")) is not None
