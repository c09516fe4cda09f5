"""`create_app()`: a Celery app that serves lousho agents.

```python
# myapp/lousho_app.py
app = create_app(agents=[agent], store=RedisStore(url), broker="redis://localhost:6379/0")
```
```
celery -A myapp.lousho_app worker      # any number, on any number of machines
celery -A myapp.lousho_app beat        # the reaper on a schedule (or: lousho reaper)
```
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from celery import Celery

from lousho.fleet.limits import FleetLimits
from lousho.fleet.registry import app_queue
from lousho.fleet.settings import FleetSettings, celery_config
from lousho.fleet.transport import AMQP
from lousho.providers.base import LLMProvider
from lousho.stores.redis import RedisStore
from lousho.telemetry.hooks import instrument_fleet
from lousho.worker.registry import watch_presence
from lousho.worker.running import watch_processes, watch_shutdown
from lousho.worker.runtime import FleetRuntime
from lousho.worker.tasks import register_tasks

__all__ = ["create_app"]


def create_app(
    *,
    agents: Sequence[Any],
    store: RedisStore,
    broker: str,
    provider: LLMProvider | None = None,
    settings: FleetSettings | None = None,
    name: str = "lousho",
    on_event: Any = None,
    limits: FleetLimits | None = None,
    **celery_settings: Any,
) -> Celery:
    """A configured Celery app serving `agents` (Agent definitions or `create_agent()` objects).

    Agents without their own provider use `provider`. `on_event` sees every run event on the
    worker (text, tool calls and results, saves, approvals, drift). `celery_settings` override Celery's
    (e.g. `broker_transport_options`), on top of lousho's safe defaults: JSON only,
    `task_acks_late`, `task_reject_on_worker_lost`, `worker_prefetch_multiplier=1`, events on.

    Its queue is `settings.queue`, else one named after its agents (`<prefix>queue:<agent>[+<agent>...]`), which
    `celery worker` consumes when given no `-Q`. Its workers publish which agents they serve on which
    queues (`lousho.worker.registry`), so a `Client` refuses a job no live worker serves (issue #15).
    `limits`: rate limits per model and sessions in flight per agent, kept by the whole fleet (issue #29).
    """
    settings = settings or FleetSettings()
    # A session with no save or heartbeat for a lease's time may have lost its worker.
    store = store.with_inflight_deadline(settings.lease_ttl_ms)
    if settings.min_replicas_acked:  # saves wait for replicas (WAIT): none lost in a failover (issue #18)
        store = store.with_replica_ack(settings.min_replicas_acked, settings.replica_ack_timeout_ms)
    runtime = FleetRuntime.build(agents, store, settings, provider)
    runtime.on_event = on_event
    runtime.limits = limits or FleetLimits()  # rate limits and sessions in flight, fleet-wide (issue #29)
    if settings.queue is None:  # the app's own queue, named after its agents (issue #15)
        runtime.settings = settings = dataclasses.replace(settings, queue=app_queue(store.prefix, runtime.agents))
        runtime.queue_named = False
    app = Celery(name, set_as_current=False, amqp=AMQP)  # a worker survives any bytes on its queue
    app.conf.update(celery_config(broker, settings, **celery_settings))
    runtime.app = app
    app.lousho_runtime = runtime
    register_tasks(app, runtime)
    watch_shutdown()
    watch_processes(store.client)  # connections named after the process: a dead one is seen at once (issue #20)
    watch_presence()
    instrument_fleet()  # LOUSHO_METRICS / LOUSHO_TRACES: nothing when unset (issue #19)
    return app
