"""`lousho dashboard`: the dashboard over the store the settings name, served by uvicorn (issue #19).

The store is opened as every `lousho` command opens it (`LoushoSettings.store()`); on a fleet's Redis the
dashboard decides and runs through `LoushoSettings.client()`, as `lousho approve` and `lousho resume` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lousho.errors import ConfigurationError
from lousho.operations.target import open_target
from lousho.settings import LoushoSettings

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["dashboard_of", "serve_dashboard"]


def dashboard_of(settings: LoushoSettings, *, read_only: bool = False) -> FastAPI:
    """The dashboard app over the settings' store (and, on a fleet, its `Client`), opened as every `lousho`
    command opens it (`open_target`); read-only, a local store that does not exist is refused, not created."""
    from lousho.dashboard.app import create_dashboard

    target = open_target(settings, must_exist=read_only)
    return create_dashboard(target.bundle, client=target.client, read_only=read_only)


def serve_dashboard(settings: LoushoSettings, *, host: str, port: int, read_only: bool) -> None:
    try:
        import uvicorn

        app = dashboard_of(settings, read_only=read_only)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(f"the dashboard needs {exc.name}: pip install 'lousho[dashboard]'") from None
    print(f"lousho dashboard on http://{host}:{port}/{' (read-only)' if read_only else ''}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
