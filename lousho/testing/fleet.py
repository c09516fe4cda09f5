"""`FleetDriver`: the fleet's steps run in this process, with the broker hop in the test's hands.

A fleet test with real worker processes is the only way to test a crash, but a slow and coarse
way to test a rule: "a tool call delivered twice runs once" needs a worker to receive the same
message twice at the right moment (issue #14). The driver runs the real task bodies (what
`create_app` registers), the real Lua scripts and the real Redis; only the broker hop is replaced:

- what a step sends lands, as on a real fleet, on the queue's Redis list (pushed by the step's
  script, the outbox, or published by Celery), and waits there: `pending()` reads it, oldest
  first, each message decoded into a `SentTask`; `sent` is every message ever seen there;
- `deliver(task)` takes the message off the list, as a worker's BRPOP would, and runs its task in
  a worker of the driver, returning the task's outcome word ("tools-dispatched", "recorded", ...);
  delivering it again is a duplicate delivery, delivering pending messages out of order is a
  reordering, `drop(task)` is a lost message, `run_until_idle()` is a fleet that keeps up;
- `expire_lease(session)` (or a call's) is that lease's TTL passing.

Each named worker is its own Celery app, runtime, store object and event loop, on a thread of
its own, as a worker process would have them: a provider or a tool that blocks (waits on
something, or delivers a message to another worker and waits for it) freezes its worker's
whole loop, heartbeats included, as SIGSTOP freezes a process. The workers share this process:
their entries in the fleet's running index (`<host>|<pid>|...`) are alike, so a rule about runs
that died together on one host is tested with real workers (`lousho.testing.workers`). Its first task names
this process's Redis connections as a worker process's (`FleetRuntime.run`), so a `lousho reaper` on the same
Redis never takes the driver's running calls for a dead process's (issue #20, `lousho.fleet.liveness`).

```python
with FleetDriver(agents=[agent], redis_url=url, provider=provider) as driver:
    driver.client.enqueue("jobs", "go", session_id="s")
    first_turn = driver.pending()[0]                    # lousho.model_turn, as a worker receives it
    driver.deliver(first_turn)
    driver.deliver(first_turn)                          # a duplicate: the model is asked once
    driver.run_until_idle()                             # the tool calls and the next turns, in order
```
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lousho.errors import ConfigurationError
from lousho.fleet.keys import FleetKeys
from lousho.fleet.limits import FleetLimits
from lousho.fleet.settings import FleetSettings, broker_url
from lousho.fleet.transport import decode_entry
from lousho.providers.base import LLMProvider
from lousho.scheduler.client import Client
from lousho.stores.redis import RedisStore
from lousho.worker.app import create_app
from lousho.worker.registry import Presence

__all__ = ["FleetDriver", "SentTask"]


class SentTask(BaseModel):
    """One task message on the driver's queue, as a worker would receive it."""

    model_config = ConfigDict(frozen=True)

    name: str
    """The task's name: `lousho.model_turn`, `lousho.tool_call`, `lousho.advance`."""
    args: list[Any]
    task_id: str
    """Its Celery task id (`<session>/turn/<n>`, `<session>/turn/<n>/tool/<call id>`, ...)."""
    delivery_tag: str = Field(repr=False)
    """kombu's tag: two sends of the same task are two messages with the same `task_id`."""
    entry: bytes | str = Field(repr=False)
    """The queue entry as Redis holds it."""

    @property
    def session_id(self) -> str:
        return str(self.args[0])

    @classmethod
    def read(cls, entry: bytes | str) -> SentTask:
        """Decode a queue entry as a worker's channel does (lousho's messages are JSON, base64-wrapped)."""
        payload = decode_entry(entry)
        body = payload["body"]
        if payload["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, _kwargs, _embed = json.loads(body)
        headers = payload["headers"]
        return cls(
            name=headers["task"],
            args=args,
            task_id=headers["id"],
            delivery_tag=payload["properties"]["delivery_tag"],
            entry=entry,
        )


class _Worker:
    """One worker of the driver: its own app (runtime, store object, event loop) and thread."""

    def __init__(self, name: str, app: Any) -> None:
        self.name = name
        self.app = app
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lousho-driver-{name}")
        self.ident: int | None = None
        self.presence: Presence | None = None

    def run(self, task: SentTask) -> str:
        self.ident = threading.get_ident()
        return str(self.app.tasks[task.name](*task.args))


class FleetDriver:
    """The fleet's steps in this process, on a real Redis, with the broker hop in the test's hands.

    `agents`, `provider`, `settings`, `on_event` and `limits` are what `create_app` takes; `store` defaults to
    `RedisStore(redis_url)` (pass one for its prefix and options). The queue is the driver's own
    (`settings.queue` is replaced by a fresh name), so no real worker takes its messages; its workers publish that
    they serve the agents there, so `client.enqueue` finds them served (issue #15).
    `client` is a web app's `Client` on the same store and queue."""

    def __init__(
        self,
        *,
        agents: Sequence[Any],
        redis_url: str,
        store: RedisStore | None = None,
        provider: LLMProvider | None = None,
        settings: FleetSettings | None = None,
        on_event: Any = None,
        limits: FleetLimits | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.store = store or RedisStore(redis_url)
        self.queue = f"lousho-driver-{uuid.uuid4().hex[:12]}"
        self.settings = replace(settings or FleetSettings(), queue=self.queue)
        self.timeout_s = timeout_s
        self._broker = broker_url(redis_url)
        self._app_options: dict[str, Any] = {"agents": agents, "provider": provider, "on_event": on_event}
        self._app_options["limits"] = limits  # a model turn waiting for a slot is sent again (issue #29)
        self._workers: dict[str, _Worker] = {}
        self._sent: list[SentTask] = []
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.client = Client(broker=self._broker, store=self.store, settings=self.settings)
        self.worker("w1")  # a configuration error shows here, as create_app would raise it

    # -- what was sent ---------------------------------------------------------------------

    def pending(self) -> list[SentTask]:
        """The messages waiting on the queue, oldest first."""
        with self._lock:
            entries: list[bytes] = self.store.client.lrange(self.queue, 0, -1)  # type: ignore[assignment]
            waiting = [SentTask.read(entry) for entry in reversed(entries)]  # LPUSHed: the newest first
            for task in waiting:
                if task.delivery_tag not in self._seen:
                    self._seen.add(task.delivery_tag)
                    self._sent.append(task)
            return waiting

    @property
    def sent(self) -> list[SentTask]:
        """Every message seen on the queue so far (delivered, dropped or waiting), in the order sent."""
        self.pending()
        with self._lock:
            return list(self._sent)

    def drop(self, task: SentTask) -> bool:
        """Take `task`'s message off the queue unrun (a lost message); whether it was there."""
        self.pending()  # seen before it goes
        return bool(self.store.client.lrem(self.queue, 1, task.entry))  # type: ignore[arg-type]  # typed str, takes bytes

    # -- delivering ------------------------------------------------------------------------

    def worker(self, name: str) -> Any:
        """The Celery app of worker `name` (made on first use); `app.lousho_runtime` is its runtime."""
        if name not in self._workers:
            store = RedisStore(
                self.store.client, prefix=self.store.prefix, history_limit=self.store.history_limit,
                ttl_s=self.store.ttl_s,
            )  # fmt: skip
            app = create_app(store=store, broker=self._broker, settings=self.settings, **self._app_options)
            self._workers[name] = _Worker(name, app)
            # It serves its agents on the driver's queue, as a real worker says it does (issue #15).
            presence = Presence(app.lousho_runtime, [self.queue], f"driver|{self.queue}|{name}")
            self._workers[name].presence = presence.start()
        return self._workers[name].app

    def deliver(self, task: SentTask, *, worker: str = "w1") -> str:
        """Take `task`'s message off the queue (if it is there: else this is a duplicate delivery) and
        run its task on `worker`, until it returns; its outcome word. A task's error is raised here."""
        self.drop(task)
        self.worker(worker)
        runner = self._workers[worker]
        if runner.ident == threading.get_ident():
            raise ConfigurationError(
                f"worker {worker!r} is running the task that delivers {task.task_id!r}: deliver it to another worker"
            )
        return runner.thread.submit(runner.run, task).result(timeout=self.timeout_s)

    def run_until_idle(self, *, worker: str = "w1", max_deliveries: int = 200) -> list[tuple[SentTask, str]]:
        """Deliver the oldest pending message to `worker`, again and again, until the queue is empty;
        each task delivered with its outcome."""
        delivered: list[tuple[SentTask, str]] = []
        while pending := self.pending():
            if len(delivered) >= max_deliveries:
                raise AssertionError(f"still not idle after {max_deliveries} deliveries: {pending[:5]}")
            delivered.append((pending[0], self.deliver(pending[0], worker=worker)))
        return delivered

    def expire_lease(self, session_id: str, call_id: str | None = None) -> bool:
        """Let the session's lease (or tool call `call_id`'s) expire now, as its TTL would: its holder
        is a zombie from here on. Whether it was held."""
        keys = FleetKeys(self.store)
        key = keys.lease(session_id) if call_id is None else keys.call_lease(session_id, call_id)
        return bool(self.store.client.delete(key))

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the workers' threads and drop the queue (the store's keys stay: they are the test's)."""
        for runner in self._workers.values():
            if runner.presence is not None:
                runner.presence.stop()
            runner.thread.shutdown(wait=True)
            runner.app.lousho_runtime.close()
            runner.app.close()
        self.client.app.close()
        self.store.client.delete(self.queue)

    def __enter__(self) -> FleetDriver:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
