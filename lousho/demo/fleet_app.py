"""The demo trip planner served by a Celery fleet, configured by environment variables.

```
LOUSHO_REDIS_URL=redis://localhost:6379/0 lousho worker --app lousho.demo.fleet_app:app
```

Settings come from `lousho.settings.LoushoSettings` (`LOUSHO_REDIS_URL`/`REDIS_URL`,
`LOUSHO_PREFIX`, `LOUSHO_QUEUE`, `LOUSHO_LEASE_TTL_S`, ...). The model is scripted and
answers by turn (`trip_provider()`), so any worker gives the same answer to the same turn.
Each tool call records, while it runs, which process runs it (`lousho.demo.tracking`).
"""

from __future__ import annotations

import dataclasses

from lousho.demo.tracking import CountingProvider, tracking_hooks
from lousho.demo.trip import trip_planner, trip_provider
from lousho.settings import LoushoSettings
from lousho.worker import create_app

__all__ = ["agent", "app", "settings", "store"]

settings = LoushoSettings()
store = settings.redis_store()
before_tool, after_tool = tracking_hooks(store.client, settings.prefix)
agent = dataclasses.replace(trip_planner(), before_tool=before_tool, after_tool=after_tool)
app = create_app(
    agents=[agent],
    store=store,
    broker=settings.broker(),
    provider=CountingProvider(trip_provider(), store.client, settings.prefix),
    settings=settings.fleet,
    name="lousho-demo",
)
