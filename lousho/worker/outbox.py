"""The outbox: a step's next task, pushed onto the broker's queue by the script that ends the step.

Saving the checkpoint, releasing the session's lease and enqueueing what comes next happen in
one Redis script, so no crash can fall between them (a worker that died after its save but
before its send used to leave the session to the reaper), and a hop costs one round trip instead
of Celery's publish path, which is most of a bare Celery hop (issue #9: fleet latency).

The message is the one `app.send_task` would publish: Celery builds it (`amqp.as_task_v2`) and
kombu wraps it for its Redis transport (`prepare_message`, then what `basic_publish` and `_put`
do: the body encoded, the delivery info and tag, the queue's key); the script only LPUSHes it,
as kombu would. `before_task_publish` is sent (a tracer may add its context to the headers);
what is left out: Celery's `task-sent` event (a worker's `task-received` still shows the task in
Flower) and `after_task_publish` (the push happens later, in the script).

It is used only when the broker is the store's Redis (same server, same database) through
kombu's Redis transport without a `global_keyprefix`, and `FleetSettings.outbox` is on;
otherwise `Outbox.direct` is False and the worker sends each task with `dispatch.send` right after
the step's script.

Each message must be the task it means (its name, id, protocol header and arguments): a
`before_task_publish` receiver may alter it, so that is checked for every message, on the headers and
body as built (no decoding). The format is checked once per process, per task name and set of
receivers (issue #30: not once per message): the first such message is read back as a worker's channel
reads an entry (`transport.decode_entry`), since it is assembled here from kombu's internals, which a
kombu upgrade may change. A message that fails either check is never pushed: that task goes through
Celery's own publish instead, with a warning (issue #21). Celery's publish is the reference the outbox
copies, so trusting it keeps the fleet running where raising would fail a step that has a sound way out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from celery import signals
from kombu import serialization
from kombu.exceptions import KombuError
from kombu.utils import json as kombu_json

from lousho.fleet.broker_qos import consumes_here
from lousho.fleet.dispatch import StepTask
from lousho.fleet.protocol import PROTOCOL_HEADER, message_headers
from lousho.fleet.settings import FleetSettings
from lousho.fleet.transport import decode_entry
from lousho.stores.redis import RedisStore

__all__ = ["Outbox"]

log = logging.getLogger("lousho.worker")

# kombu is untyped: its serializer (what Producer.publish encodes a body with, and a worker decodes it
# with) and its JSON (what the Redis transport writes a message with), as callables.
_serialize: Callable[..., tuple[str, str, Any]] = serialization.dumps
_deserialize: Callable[..., Any] = serialization.loads
_accepted: Callable[[Any], set[str]] = serialization.prepare_accept_content
_kombu_dumps: Callable[[Any], str] = kombu_json.dumps


class Outbox:
    """Encodes lousho's task messages for the queue list of a Redis broker (one per worker process)."""

    def __init__(self, app: Any, store: RedisStore, settings: FleetSettings) -> None:
        self.app = app
        self.store = store
        self.settings = settings
        self._channel: Any = None
        self._pid = 0
        self._direct: bool | None = None
        self._reads_where_it_writes = False
        """Whether the worker's consumer reads the broker the outbox writes to (decided with `direct`)."""
        self._formats_read_back: set[tuple[str, tuple[Any, ...]]] = set()
        """(task name, `before_task_publish` receivers) whose message read back right in this process."""

    @property
    def direct(self) -> bool:
        """Whether the step scripts can push to the broker's queue (decided once per process)."""
        if self._direct is None or self._pid != os.getpid():
            self._direct = self._check()
        return self._direct

    @property
    def queue_key(self) -> str:
        """The Redis list of the app's queue (messages of priority 0, as lousho's are)."""
        queue = str(self.app.conf.task_default_queue)
        # kombu names a priority queue only in this private method: the outbox must push where it reads
        return str(self._channel._q_for_pri(queue, 0)) if self.direct else queue  # noqa: SLF001

    def ack_keys(self) -> tuple[str, str] | None:
        """kombu's unacknowledged-messages hash and its index, when a step's end script can acknowledge the message
        the step ran for (end_step.lua, issue #30): the scripts reach the broker's keys (`direct`), the worker reads
        its messages from that broker (no `broker_read_url` of another) and this process's consumer is the one that
        acknowledges its tasks (`consumes_here`). None otherwise: Celery acks as usual."""
        if not (self.direct and self._reads_where_it_writes and consumes_here()):
            return None
        return str(self._channel.unacked_key), str(self._channel.unacked_index_key)

    def close(self) -> None:
        """Release the broker connection `direct` opened (a later use opens another)."""
        if self._channel is not None:
            self._channel.connection.client.release()
        self._channel, self._direct = None, None

    def encode(self, task: StepTask) -> str:
        """The message for `task`, as kombu's Redis transport would LPUSH it onto `queue_key` after
        `app.send_task` (the same headers, properties and body; tests/fleet/test_outbox.py); '' if
        it does not read back as `task` (the step's end then sends `task` through Celery)."""
        app, queue = self.app, self.app.conf.task_default_queue
        headers, properties, body, _ = app.amqp.as_task_v2(
            task.task_id, task.name, args=task.args, kwargs={}, shadow=task.shadow, argsrepr=task.argsrepr,
            kwargsrepr="{}", reply_to=app.thread_oid, ignore_result=None,
        )  # fmt: skip
        properties = {**properties, "argsrepr": task.argsrepr, "delivery_mode": 2}  # as send_task's options do
        headers.update(message_headers())  # the message's protocol, as `dispatch.send` adds it (issue #35)
        if signals.before_task_publish.receivers:  # e.g. a tracer adding its context to the headers
            signals.before_task_publish.send(
                sender=task.name, body=body, exchange="", routing_key=queue, headers=headers,
                properties=properties, declare=[], retry_policy={},
            )  # fmt: skip
        problem = _not_the_task(headers, body, task)
        if not problem:
            content_type, content_encoding, data = _serialize(body, serializer=app.conf.task_serializer)
            channel = self._channel
            message = channel.prepare_message(data, 0, content_type, content_encoding, headers, properties)
            channel._inplace_augment_message(message, "", queue)  # noqa: SLF001 -- what basic_publish does to it
            encoded = _kombu_dumps(message)
            problem = self._format_problem(encoded, task)
        if problem:
            log.warning(
                "lousho: the outbox's message for %s reads back wrong (%s): sent through Celery", task.task_id, problem
            )
            return ""
        return encoded

    def _format_problem(self, encoded: str, task: StepTask) -> str:
        """`_misread`, once per process for each task name and set of `before_task_publish` receivers."""
        receivers = tuple(key for key, _ in signals.before_task_publish.receivers)
        if (task.name, receivers) in self._formats_read_back:
            return ""
        problem = self._misread(encoded, task)
        if not problem:
            self._formats_read_back.add((task.name, receivers))
        return problem

    def _misread(self, encoded: str, task: StepTask) -> str:
        """How the message reads back, as a worker reads it, as other than `task`; '' if it reads as `task`."""
        try:
            payload = decode_entry(encoded)
            headers = payload["headers"]
            raw = self._channel.decode_body(payload["body"], payload["properties"].get("body_encoding"))
            body = _deserialize(
                raw,
                payload["content-type"],
                payload["content-encoding"],
                accept=_accepted(self.app.conf.accept_content),
            )
        except (ValueError, KombuError) as exc:  # not a message at all: what the decoding raised says why
            return f"{type(exc).__name__}: {exc}"
        if (headers.get("task"), headers.get("id")) != (task.name, task.task_id):
            return f"its headers name task {headers.get('task')!r} id {headers.get('id')!r}"
        if headers.get(PROTOCOL_HEADER) != message_headers()[PROTOCOL_HEADER]:
            return f"its protocol header is {headers.get(PROTOCOL_HEADER)!r}"
        if not (isinstance(body, list) and len(body) == 3 and body[:2] == [task.args, {}]):
            return f"its body is {body!r:.200}"
        return ""

    def _check(self) -> bool:
        """Open this process's broker channel and see whether the scripts can push to its queue."""
        self._pid = os.getpid()
        self._formats_read_back = set()
        conf = self.app.conf
        self._reads_where_it_writes = (conf.broker_read_url or conf.broker_url) == (
            conf.broker_write_url or conf.broker_url
        )
        if not self.settings.outbox or conf.task_protocol != 2 or conf.task_compression:
            return False
        if self.store.keys.per_slot:  # a Redis Cluster store: the broker is never that server (issue #18)
            return False  # off, or messages this encoder does not make (protocol 1, compressed bodies)
        try:
            connection = self.app.connection_for_write()
            if connection.transport.driver_type != "redis":
                return False
            options = connection.transport_options or {}
            if options.get("global_keyprefix"):
                return False
            self._channel = connection.default_channel
            same_server = _server_id(self._channel.client) == _server_id(self.store.client)
            same_db = _db(self._channel.client) == _db(self.store.client)
            needed = ("prepare_message", "_inplace_augment_message", "_q_for_pri", "_get_message_priority")
            return same_server and same_db and all(hasattr(self._channel, name) for name in needed)
        except Exception as exc:  # any doubt: send through Celery, as before
            log.warning("lousho: steps are sent through Celery (the outbox is off: %s)", exc)
            return False


def _not_the_task(headers: dict[str, Any], body: Any, task: StepTask) -> str:
    """How the message as built (after the `before_task_publish` receivers) is other than `task`; '' if it
    is `task`: what `Outbox._misread` checks on the decoded message, checked here on every one."""
    if (headers.get("task"), headers.get("id")) != (task.name, task.task_id):
        return f"its headers name task {headers.get('task')!r} id {headers.get('id')!r}"
    if headers.get(PROTOCOL_HEADER) != message_headers()[PROTOCOL_HEADER]:
        return f"its protocol header is {headers.get(PROTOCOL_HEADER)!r}"
    args = body[0] if isinstance(body, (list, tuple)) and len(body) == 3 else None
    if not (isinstance(args, (list, tuple)) and list(args) == task.args and body[1] == {}):
        return f"its body is {body!r:.200}"
    return ""


def _server_id(client: Any) -> str:
    return str(client.info("server").get("run_id", ""))


def _db(client: Any) -> int:
    return int(client.connection_pool.connection_kwargs.get("db", 0) or 0)
