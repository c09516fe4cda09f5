"""`lousho dashboard`: the dashboard over the store the settings name, served by uvicorn (issue #19).

The store is opened as every `lousho` command opens it (`LoushoSettings.store()`); on a fleet's Redis the
dashboard decides and runs through `LoushoSettings.client()`, as `lousho approve` and `lousho resume` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lousho.errors import ConfigurationError
from lousho.settings import LoushoSettings

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["dashboard_of", "serve_dashboard"]


def dashboard_of(settings: LoushoSettings, *, read_only: bool = False) -> FastAPI:
    """The dashboard app over the settings' store (and, on a fleet, its `Client`)."""
    from lousho.dashboard.app import create_dashboard
    from lousho.stores.redis import RedisStore

    store = settings.store()
    if not isinstance(store, RedisStore):
        return create_dashboard(store, read_only=read_only)
    store.close()  # the fleet's store is the Client's (with its in-flight deadline), as `lousho approve` uses it
    client = settings.client()
    return create_dashboard(client.store, client=client, read_only=read_only)


def serve_dashboard(settings: LoushoSettings, *, host: str, port: int, read_only: bool) -> None:
    try:
        import uvicorn

        app = dashboard_of(settings, read_only=read_only)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(f"the dashboard needs {exc.name}: pip install 'lousho[dashboard]'") from None
    print(f"lousho dashboard on http://{host}:{port}/{' (read-only)' if read_only else ''}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
