"""The fleet's broker transport, for workers and clients alike: a worker survives any bytes on its queue, what is
not a task message is moved aside (issue #21); each makes one redis-py client per connection pool (issue #30).

kombu's Redis transport decodes each entry it pops from a queue with no guard (`Channel._brpop_read`:
JSON, then kombu's `Message`, then Celery's handler, all in the worker's event loop). One entry
that was not JSON stopped the worker (`Unrecoverable error: JSONDecodeError`); a JSON value that was
not kombu's envelope, or an envelope whose headers Celery cannot read (no task id), stopped it too,
or sent it round a reconnect loop (kombu counts a `KeyError` as a lost connection and puts the
unacknowledged message back on the queue).

Here, an entry is delivered only if it is what kombu's Redis transport writes (`KombuEnvelope`); one
that is not, and one that Celery's handler raises on, is logged and moved to the list
`<queue>:lousho-rejected` beside the queue (the newest `REJECTED_KEPT` are kept), and the worker
takes the next entry. An entry Celery reads and refuses itself (an unregistered task, a body of a
content type it does not accept) is logged and dropped by Celery, as before.

`AMQP` is the Celery app's broker class that gives every connection of a lousho app this transport
wherever kombu would pick its Redis one, whatever the URL's form (`redis://`, `rediss://`,
`redis+socket://`); Celery's `broker_transport` setting cannot: a `redis+socket://` URL names kombu's
transport itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from queue import Empty
from sys import intern
from typing import Any, Literal

from celery.app import amqp
from kombu import connection as kombu_connection
from kombu.connection import Connection as KombuConnection
from kombu.transport import redis
from kombu.transport.virtual.base import Base64
from kombu.utils import encoding
from kombu.utils import json as kombu_json
from kombu.utils.collections import HashedSeq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lousho.fleet.broker_qos import TAKEN_AT_ONCE, BatchedQoS
from lousho.stores.redis_common import load_script

__all__ = ["AMQP", "REJECTED_KEPT", "KombuEnvelope", "decode_entry", "rejected_key"]

log = logging.getLogger("lousho.worker")

REJECTED_KEPT = 1000
"""How many entries a queue's rejected list keeps (the newest): a flood of junk cannot fill Redis."""
_LOGGED_BYTES = 200
"""How much of a rejected entry its log line shows."""

# kombu's helpers are untyped: how its Redis transport reads an entry (text, then JSON) and decodes a body.
_bytes_to_str: Callable[[bytes | str], str] = encoding.bytes_to_str
_loads: Callable[[str], Any] = kombu_json.loads
_base64_decode: Callable[[str], bytes] = Base64().decode

# What a failure to take in a delivered message may be that is the broker's, not the message's: it goes
# on up (the consumer reconnects). kombu lists KeyError among its connection errors (a stale socket's),
# but a message missing a header Celery needs raises KeyError too, and is the message's.
_BROKER_ERRORS: tuple[type[BaseException], ...] = tuple(
    error for error in (*redis.Transport.connection_errors, *redis.Transport.channel_errors) if error is not KeyError
)


def rejected_key(queue: str) -> str:
    """The list beside `queue` that the entries a worker could not take in are moved to."""
    return f"{queue}:lousho-rejected"


class _DeliveryInfo(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    exchange: str
    routing_key: str


class _Properties(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    delivery_tag: str
    delivery_info: _DeliveryInfo
    body_encoding: Literal["base64"] | None = None


class KombuEnvelope(BaseModel):
    """A message as kombu's Redis transport writes it onto a queue (`prepare_message`, then what
    `basic_publish` adds), with what reading it back needs: the body decodes, kombu's `QoS` finds
    the delivery tag and info, the headers are a mapping."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)

    body: str
    content_type: str = Field(alias="content-type")
    content_encoding: str = Field(alias="content-encoding")
    headers: dict[str, Any]
    properties: _Properties

    @model_validator(mode="after")
    def _body_decodes(self) -> KombuEnvelope:
        if self.properties.body_encoding == "base64":
            _base64_decode(self.body)  # binascii.Error is a ValueError: reported as a validation error
        return self


def decode_entry(entry: bytes | str) -> dict[str, Any]:
    """The message kombu makes of a queue entry (decoded as kombu's Redis transport does), if the
    entry is a `KombuEnvelope`; else ValueError saying why not. It never reaches a caller: the
    worker's channel and the outbox act on it."""
    try:
        payload = _read_json(_bytes_to_str(entry))
    except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        raise ValueError(f"not JSON ({type(exc).__name__}: {exc})") from None
    try:
        KombuEnvelope.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the entry"
        raise ValueError(f"not a kombu message ({where}: {first['msg']})") from None
    assert isinstance(payload, dict)  # a KombuEnvelope is an object
    return _with_shared_strings(payload)


def _read_json(text: str) -> Any:
    """JSON as kombu reads it. kombu's `loads` hands every object to a hook of its own that turns its tagged values
    (`{"__type__": ..., "__value__": ...}`) back into what they were: 8 % of a busy worker's consumer thread (issue
    #29). A message holds none unless its headers do; one with no tag reads the same without the hook."""
    return _loads(text) if '"__type__"' in text else json.loads(text)


_REPEATED_VALUES = frozenset(
    ("lang", "task", "kwargsrepr", "origin", "reply_to", "content-type", "content-encoding", "body_encoding",
     "exchange", "routing_key")
)  # fmt: skip
"""Header and property names whose values repeat from message to message (a task's name, a queue's, a client's)."""


def _with_shared_strings(payload: dict[str, Any]) -> dict[str, Any]:
    """The message with its names, and the values that repeat, as one string per process, not one per message.

    The JSON decoder makes new strings for every message; a worker holds each message it runs (kombu's, then
    Celery's request and context, copies of its headers) until its ack, seconds for a model turn. At 1,000 held
    steps the strings alone were 2 KB a step (issue #29)."""
    shared = {intern(name): _shared(name, value) for name, value in payload.items()}
    shared["headers"] = {intern(name): _shared(name, value) for name, value in shared["headers"].items()}
    properties = {intern(name): _shared(name, value) for name, value in shared["properties"].items()}
    delivery_info = properties.get("delivery_info")
    if isinstance(delivery_info, dict):
        properties["delivery_info"] = {intern(name): _shared(name, value) for name, value in delivery_info.items()}
    shared["properties"] = properties
    return shared


def _shared(name: str, value: Any) -> Any:
    return intern(value) if name in _REPEATED_VALUES and type(value) is str else value


class Channel(redis.Channel):
    """kombu's Redis channel, taking in only what it can deliver: the rest is moved aside; one redis-py client
    for its commands."""

    _sync_client: Any = None
    _take_in_script: Any = None
    QoS = BatchedQoS

    def _create_client(self, asynchronous: bool = False) -> Any:
        """kombu makes a new redis-py client for every publish (each Celery task event), ack and queue-length read
        (`conn_or_acquire`), and making one copies its table of ~200 response callbacks: 7% of a busy worker's
        CPU on lousho's pool (issue #30's hop cost). The channel keeps one per connection pool instead; a client
        takes a connection from its pool for each command, so the pool's threads share it as kombu's own
        `client` property is shared. A new pool (kombu's reconnect) gets a new client."""
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool = self.pool
        if self._sync_client is None or self._sync_client.connection_pool is not pool:
            self._sync_client = super()._create_client()  # type: ignore[no-untyped-call]
        return self._sync_client

    def _brpop_read(self, **options: Any) -> bool:
        """kombu 5.7's `_brpop_read` (earlier kombus' without the re-auth flush), with `_take_in` where
        it decoded and delivered."""
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # as kombu: the next poll reconnects
                raise
            if not reply:
                raise Empty()
            key, entry = reply
            queue = _bytes_to_str(key).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)
            if not self._take_in_batch(queue, key, entry):
                raise Empty()  # nothing delivered, as when BRPOP times out
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # as kombu's (its class says False)
            flush_reauth = getattr(self, "_flush_brpop_reauth", None)  # kombu 5.7's re-auth hook
            if flush_reauth is not None:
                flush_reauth()

    def _take_in_batch(self, queue: str, key: bytes, entry: bytes) -> bool:
        """Deliver `entry`, and up to `TAKEN_AT_ONCE` - 1 more of the same queue that the prefetch has room for,
        taken off the queue and recorded among kombu's unacknowledged messages in one script (issue #29: one read
        an entry, and a round trip to record each, held a busy worker's intake to the round trips of its one
        consumer thread). Whether any was delivered.

        None of them is ever off the queue without its record (`lua/take_in.lua`): a worker killed while it takes
        them in leaves each to be put back after the visibility timeout. Only `entry`, between its `BRPOP` and the
        script, is in this process alone, as kombu's own entry between its `BRPOP` and its record."""
        qos = self.qos
        room = _room(qos) - 1
        if room <= 0 or not isinstance(qos, BatchedQoS) or self.global_keyprefix:
            return self._take_in(queue, entry)  # kombu's way: the entry recorded as it is delivered
        delivered, set_aside = False, []
        for taken, tag in self._take_recorded(qos, key, entry, min(room, TAKEN_AT_ONCE - 1)):
            if not tag:  # no record the script could write: kombu's way, or moved aside
                delivered = self._take_in(queue, taken) or delivered
                continue
            with qos.recorded_already():
                took = self._take_in(queue, taken)
            delivered = took or delivered
            if not took:
                set_aside.append(_bytes_to_str(tag))
        qos.forget_records(set_aside)
        return delivered

    def _take_recorded(self, qos: BatchedQoS, key: bytes, entry: bytes, more: int) -> list[tuple[bytes, bytes]]:
        """`entry` and up to `more` entries after it off the list `key`, each with the delivery tag of its record
        (b'' when it has none): `lua/take_in.lua`."""
        with self.conn_or_acquire() as client:
            if self._take_in_script is None or self._take_in_script.registered_client is not client:
                self._take_in_script = load_script(client, "lousho.fleet:take_in")
            reply = self._take_in_script(
                keys=[key, qos.unacked_key, qos.unacked_index_key], args=[entry, more, time.time()]
            )
        return list(zip(reply[::2], reply[1::2], strict=True))

    def _take_in(self, queue: str, entry: bytes) -> bool:
        """Deliver the entry to the queue's consumer (Celery); if it is no message, or Celery's
        handler raises on it, move it aside instead. Whether it was delivered."""
        try:
            payload = decode_entry(entry)
        except ValueError as exc:
            self._set_aside(queue, entry, str(exc))
            return False
        try:
            self.connection._deliver(payload, queue)  # noqa: SLF001 -- kombu's hand-off to its consumer; no public one
        except _BROKER_ERRORS:
            raise
        except Exception as exc:  # Celery could not read it: a header it needs missing, a body not its shape
            self._drop_delivery(payload["properties"]["delivery_tag"])
            self._set_aside(queue, entry, f"Celery could not take it ({type(exc).__name__}: {exc})")
            return False
        return True

    def _drop_delivery(self, delivery_tag: str) -> None:
        """Take a message Celery failed on out of kombu's unacknowledged ones: else it would hold the
        worker's prefetch slot, and be put back on the queue when the worker stops."""
        try:
            message = self.qos.get(delivery_tag)
        except KeyError:
            return  # it failed before kombu took it in
        if not message.acknowledged:
            message.reject(requeue=False)

    def _set_aside(self, queue: str, entry: bytes, reason: str) -> None:
        """Log the entry (before anything else can fail), then move it to the queue's rejected list."""
        key = rejected_key(queue)
        log.error(
            "lousho: an entry on queue %r is no task message the worker can run, moved to %r: %s; "
            "the entry (%d bytes): %r",
            queue, key, reason, len(entry), entry[:_LOGGED_BYTES],
        )  # fmt: skip
        with self.conn_or_acquire() as client:
            client.pipeline().lpush(key, entry).ltrim(key, 0, REJECTED_KEPT - 1).execute()


def _room(qos: Any) -> int:
    """How many more messages the prefetch lets the channel take (kombu's estimate; no limit: `TAKEN_AT_ONCE`)."""
    estimate = qos.can_consume_max_estimate()
    return TAKEN_AT_ONCE if estimate is None else int(estimate)


class _AcksOnTick:
    """A transport whose event loop (Celery's worker) removes the acks of each turn in one pipeline, at its end."""

    channels: list[Any]
    acks_on_tick = False
    """Read by `BatchedQoS.ack`: whether an event loop flushes the acks of its channels at the end of each turn."""

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)  # type: ignore[misc]  # kombu's
        self.acks_on_tick = True  # the hub's thread runs every ack (Celery's `call_soon`)
        loop.on_tick.add(self.flush_acks)

    def flush_acks(self) -> None:
        for channel in list(self.channels):
            qos = channel._qos  # noqa: SLF001 -- kombu makes it on first use
            if isinstance(qos, BatchedQoS):
                qos.flush_acks()


class Transport(_AcksOnTick, redis.Transport):
    """kombu's Redis transport with `Channel`."""

    Channel = Channel


class SentinelChannel(Channel, redis.SentinelChannel):
    """kombu's Sentinel channel (its pool follows the master) taking in only what it can deliver (issue #18)."""


class SentinelTransport(_AcksOnTick, redis.SentinelTransport):
    """kombu's Redis Sentinel transport with `SentinelChannel`."""

    Channel = SentinelChannel


class Connection(KombuConnection):
    """kombu's connection, with `Transport` wherever kombu would use its Redis transport, and
    `SentinelTransport` for its Sentinel one (issue #18); any other broker's is kombu's."""

    def get_transport_cls(self) -> Any:
        transport = super().get_transport_cls()  # type: ignore[no-untyped-call]  # kombu's is untyped
        if transport is redis.SentinelTransport:
            return SentinelTransport
        return Transport if transport is redis.Transport else transport

    def __eqhash__(self) -> Any:
        """kombu's process-wide pools (`kombu.pools.connections`, which Celery's `app.pool` reads) are keyed by this:
        kombu's names the transport by the URL's scheme, so a plain Celery app of the same broker URL in the same
        process shared its pool, and whichever came first decided both apps' transport (a test that ran after one
        found a lousho client publishing through kombu's own channel: issue #33)."""
        return HashedSeq(__name__, *super().__eqhash__())  # type: ignore[no-untyped-call]  # kombu's is untyped

    def Pool(self, limit: int | None = None, **kwargs: Any) -> Any:
        """Celery's producer pool (every `send_task`, every task event) takes its connections from here: kombu's
        pool makes its own `PooledConnection`s, of kombu's transport (issue #29: the client's and the workers'
        publishes made a redis-py client each)."""
        return _ConnectionPool(self, limit=limit, **kwargs)  # type: ignore[no-untyped-call]  # kombu's __init__


class _PooledConnection(kombu_connection.PooledConnection, Connection):
    """A pool's connection (closed on an error inside its `with`, as kombu's), of this module's transport."""


class _ConnectionPool(kombu_connection.ConnectionPool):
    def new(self) -> _PooledConnection:
        info = dict(self.connection._info(resolve=False))  # noqa: SLF001 -- as kombu's own pool
        return _PooledConnection(self, **info)  # type: ignore[no-untyped-call]  # kombu's __init__


class AMQP(amqp.AMQP):  # type: ignore[misc]  # celery is untyped
    """Celery's broker glue for a lousho app (`Celery(..., amqp=AMQP)`): its connections are `Connection`s."""

    Connection = Connection
    BrokerConnection = Connection
