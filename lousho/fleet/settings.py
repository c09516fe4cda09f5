"""Fleet settings, and the Celery configuration every lousho app (worker or client) shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_QUEUE",
    "DEFAULT_SLOTS",
    "LOUSHO_POOL",
    "pool_arguments",
    "broker_url",
    "FleetSettings",
    "TASK_ADVANCE",
    "TASK_MODEL_TURN",
    "TASK_REAP",
    "TASK_TOOL_CALL",
    "celery_config",
]

DEFAULT_QUEUE = "lousho"
"""Celery's default queue of an app whose queue is chosen per job (a `Client` with `queue=None`, issue #15)."""
TASK_MODEL_TURN = "lousho.model_turn"
TASK_TOOL_CALL = "lousho.tool_call"
TASK_ADVANCE = "lousho.advance"
TASK_REAP = "lousho.reap"


@dataclass(frozen=True, kw_only=True)
class FleetSettings:
    """How fast the fleet notices a dead worker, and how hard it retries poison work.

    A dead worker's session runs again within about `lease_ttl_s + reaper_interval_s`
    (defaults: 8 s); both can go down to 1 s at the cost of more Redis traffic. A tool call whose worker
    process is gone runs again sooner, within about `death_check_interval_s`, under `lousho reaper`.
    """

    lease_ttl_s: float = 6.0
    """A session's (or a tool call's) lease lives this long without a heartbeat."""
    heartbeat_interval_s: float | None = None
    """How often running work extends its lease; default a third of `lease_ttl_s`."""
    reaper_interval_s: float = 2.0
    """How often the reaper looks for sessions whose deadline passed and whose lease is free."""
    death_check_interval_s: float = 0.25
    """How often `lousho reaper` lists the worker processes connected to Redis: a tool call whose process
    is gone (SIGKILL, OOM killer) runs again at once, without waiting for its lease (issue #20,
    `lousho.fleet.liveness`). 0: never; the lease TTL alone then tells a dead worker."""
    approval_repair_interval_s: float = 30.0
    """How often `lousho reaper` looks for paused sessions whose approval record a Redis Cluster failover lost
    in part, and writes it again from the checkpoint (`lousho.scheduler.approval_repair`, issue #18): a `SCAN`
    of the session heads, so not on every pass. 0: never."""
    requeue_backoff_s: float = 30.0
    """After a requeue, how long the reaper leaves a session alone (a busy queue is not a dead worker), and up to
    half that again, drawn for each session (`lousho.backoff`): the sessions one pass sent come due apart."""
    max_attempts: int = 3
    """A model turn or tool call that killed its worker this many times is poison: the turn parks
    the session, the tool call gets an error result."""
    lock_wait_s: float = 5.0
    """How long a finished tool call waits for the session's lease to fold its result in."""
    transcript_keep_s: float = 1.0
    """How long a worker process keeps a session's transcript after its step, for the session's next step if
    that runs in the same process (then it reads only the checkpoint's head and sends only new messages). Kept
    longer, a process holds the transcripts of the sessions waiting between steps (issue #29)."""
    queue: str | None = None
    """The Celery queue lousho's tasks go to (workers consume it: `celery worker -Q <queue>`). None: each app
    its own, named after its agents (`lousho:queue:<agent>[+<agent>...]`, `lousho.fleet.registry.app_queue`), and
    a `Client` sends a job where a live worker serves its agent; two apps on one Redis then never take each
    other's jobs (issue #15). Name one to keep it across deploys that change the agents."""
    outbox: bool = True
    """A worker pushes a step's next task from the script that ends the step: atomic with its save
    and lease release, and cheaper than `app.send_task` (a hop 3.97 ms against 5.11 ms in the
    benchmarks; used only when the broker is the store's Redis). False sends every step through
    Celery's publish: its `task-sent` events and `after_task_publish` signal for each step."""

    quorum_queues: bool = False
    """On RabbitMQ, declare lousho's queues as quorum queues: replicated over a RabbitMQ cluster's nodes, so
    the loss of one node loses no queued step (RabbitMQ 3.8+). Every app on the broker must agree (workers,
    `Client`s, the reaper): RabbitMQ refuses to declare a queue again with another type. Not needed for
    correctness (a lost message costs a reaper pass) and ignored on Redis (docs/topologies.md, issue #18)."""

    min_replicas_acked: int = 0
    """Each save of the fleet (a worker's, a `Client`'s) returns only once Redis `WAIT` says this many replicas
    have it; fewer within `replica_ack_timeout_ms` fail the step with `SaveNotReplicatedError` (the reaper sends
    the session again). For a Sentinel or replicated store: a failover then loses no acknowledged save
    (docs/topologies.md, issue #18). 0: the store's own setting (`RedisStore(min_replicas_acked=...)`)."""
    replica_ack_timeout_ms: int = 1000
    """How long a save waits for `min_replicas_acked` replicas."""

    # What `Client.enqueue` takes (issue #31): more is refused with `InputTooLargeError`, nothing written.
    max_input_chars: int = 8_000_000
    """The most characters of one job's input: its messages' text and tool-call arguments, all together (the
    default is above any model's context window)."""
    max_input_messages: int = 10_000
    """The most messages one job's input may hold."""
    max_business_state_chars: int = 1_000_000
    """The longest `business_state` a job may carry, in characters of its JSON."""
    max_agent_name_chars: int = 200
    """The longest agent name a job may name."""
    max_session_id_chars: int = 200
    """The longest session id a job may name (at most 200: what keys and task ids carry)."""

    # The session's live event stream (lousho.fleet.events, issue #34).
    events_maxlen: int = 5000
    """The most entries a session's event stream keeps (`XADD MAXLEN ~`): older ones are trimmed."""
    events_flush_interval_s: float = 0.05
    """Text deltas that arrive within this of the last write are written together, as one entry (one round
    trip); 0 writes each delta as it comes."""

    @property
    def requeue_wait_ms(self) -> int:
        """How long a requeue the reaper sent may wait on the queue before it sends another (the first
        was lost): four `requeue_backoff_s`. Under a backlog the reaper adds one message per session,
        not one per pass (issue #21)."""
        return max(1, round(self.requeue_backoff_s * 4000))

    @property
    def lease_ttl_ms(self) -> int:
        return max(1, round(self.lease_ttl_s * 1000))

    @property
    def heartbeat_s(self) -> float:
        return self.heartbeat_interval_s or self.lease_ttl_s / 3


LOUSHO_POOL = "lousho.worker.pool:AsyncioPool"
"""The worker pool `create_app` makes the default (`celery worker` with no `-P`; issue #29)."""
DEFAULT_SLOTS = 100
"""Steps in flight per worker process on lousho's pool when `-c` is not given (issue #29)."""


_BY_HOOK = {"lousho": LOUSHO_POOL, "prefork": "celery.concurrency.prefork:TaskPool"}
"""Pools that `-P` cannot select by name once an app configures lousho's: `-P` takes only Celery's names, and
Celery reads `-P prefork` as "the app's configured pool"."""


def pool_arguments(pool: str) -> tuple[list[str], dict[str, str]]:
    """The `celery worker` arguments and environment that select `pool` ("lousho", or any of Celery's): the two
    above through Celery's hook for a pool of one's own, `-P custom` with `CELERY_CUSTOM_WORKER_POOL`."""
    if pool in _BY_HOOK:
        return ["-P", "custom"], {"CELERY_CUSTOM_WORKER_POOL": _BY_HOOK[pool]}
    return ["-P", pool], {}


def celery_config(broker: str, settings: FleetSettings, **overrides: Any) -> dict[str, Any]:
    """Celery settings that make a lousho fleet safe (DESIGN.md: 'Reliability rules for the fleet')."""
    config: dict[str, Any] = {
        "broker_url": broker,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],  # never pickle: a message is data, not code
        "event_serializer": "json",
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,  # the checkpoint is the result
        "task_default_queue": settings.queue or DEFAULT_QUEUE,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        "broker_transport_options": {
            # Redelivery after the visibility timeout is normal and harmless here (a duplicate
            # finds its work recorded or its lease held), but keep it well above task durations.
            "visibility_timeout": 3600,
            # A Redis that vanishes without closing the TCP connection (failover behind a virtual
            # IP, a NAT or firewall that forgets the flow, a host that is gone): without a socket
            # timeout an ack or a publish on the dead connection blocks the worker forever; with a
            # timeout but no retry, the failed ack leaked kombu's prefetch slot and the worker never
            # consumed again (lousho's transport now frees the slot at the ack: broker_qos.py). Retried once
            # on a fresh connection, it goes on (docs/reliability.md).
            "socket_timeout": 5.0,
            "socket_connect_timeout": 5.0,
            "socket_keepalive": True,
            "health_check_interval": 10,
            "retry_on_timeout": True,
        },
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        "worker_soft_shutdown_timeout": 10.0,
        "worker_hijack_root_logger": False,
        "beat_schedule": {"lousho-reaper": {"task": TASK_REAP, "schedule": settings.reaper_interval_s}},
    }
    if broker.lower().startswith("redis+sentinel://"):  # the store's Sentinel URL, in kombu's form (issue #18)
        from lousho.stores.redis_sentinel import kombu_broker

        config["broker_url"], sentinel_options = kombu_broker(broker)
        config["broker_transport_options"].update(sentinel_options)
    if settings.quorum_queues:  # the app's own queue and those it names per job (a Client's, the reaper's)
        config.update(task_default_queue_type="quorum", task_create_missing_queue_type="quorum")
    config.update(overrides)
    if config.get("worker_pool", LOUSHO_POOL) == LOUSHO_POOL:
        # Many steps in flight per process, since a fleet mostly waits on models (issue #29): lousho's pool,
        # with `worker_concurrency` slots (not processes) in each worker process, unless the app names another.
        config["worker_pool"] = LOUSHO_POOL
        config.setdefault("worker_concurrency", DEFAULT_SLOTS)
    return config


def broker_url(redis_url: str) -> str:
    """The Celery broker URL for a Redis URL (kombu spells a unix socket `redis+socket://`)."""
    if redis_url.startswith("unix://"):
        # The query starts after the user info: a '?' in a password would otherwise cut the URL there
        # and leave the password where nothing can redact it (issue #21).
        rest = redis_url[len("unix://") :]
        user_info, at, location = ("", "", rest) if rest.startswith("/") else rest.rpartition("@")
        path, _, query = location.partition("?")
        db = next((part.split("=", 1)[1] for part in query.split("&") if part.startswith("db=")), "0")
        return f"redis+socket://{user_info}{at}{path}?virtual_host={db}"
    return redis_url
