"""`create_dashboard` and `dashboard_router`: the sessions dashboard as an app, or a router to mount (issue #19).

```python
from lousho.dashboard import create_dashboard, dashboard_router

app = create_dashboard(store, client=client)                  # served alone (`lousho dashboard`)
my_app.include_router(dashboard_router(store, auth=require_admin), prefix="/ops")   # or in your app
my_app.mount("/dashboard", create_dashboard(store, read_only=True))
```

`auth` is a FastAPI dependency run before every route (raise `HTTPException(401/403)` to refuse);
`read_only=True` refuses every POST with 403. On a fleet (a `RedisStore` bundle) decisions and runs go
through `client` (a `lousho.scheduler.Client`), which wakes the workers as `lousho approve` does.

`routers=` adds your own APIRouters (guarded by the same `auth`). `/metrics` (issue #19, item 2) is
`lousho.telemetry.metrics.metrics_app(bundle)` mounted as its own ASGI app when `prometheus_client` is
installed (the `metrics` extra) and `metrics=True`: a mount is outside the routers, so `auth` does not guard
it (a scraper has no login); pass `metrics=False` and mount it yourself behind your own guard if it must be.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.exceptions import HTTPException
from fastapi.responses import FileResponse, Response

from lousho.dashboard import routes_approvals, routes_compare, routes_fleet, routes_history, routes_sessions
from lousho.dashboard.pages import Pages
from lousho.dashboard.views import DashboardContext
from lousho.errors import ConfigurationError
from lousho.scheduler.client import Client
from lousho.store_bundle import StoreBundle

__all__ = ["create_dashboard", "dashboard_router"]

STATIC = Path(__file__).parent / "static"


def _context(bundle: StoreBundle, client: Client | None, read_only: bool) -> DashboardContext:
    ctx = DashboardContext(bundle=bundle, client=client, read_only=read_only)
    if ctx.fleet_store is not None and client is None and not read_only:
        raise ConfigurationError(
            "a RedisStore is a fleet's store: pass client=Client(broker=..., store=store, settings=...) so that "
            "approvals and forks decided on the dashboard wake the workers (or read_only=True)"
        )
    return ctx


def dashboard_router(
    bundle: StoreBundle,
    *,
    client: Client | None = None,
    read_only: bool = False,
    auth: Callable[..., Any] | None = None,
) -> APIRouter:
    """The dashboard's pages as an APIRouter, for `app.include_router(router, prefix=...)`."""
    ctx = _context(bundle, client, read_only)
    return _router(ctx, auth)


def _router(ctx: DashboardContext, auth: Callable[..., Any] | None) -> APIRouter:
    router = APIRouter(dependencies=[Depends(auth)] if auth is not None else [])
    pages = Pages(ctx)
    for module in (routes_sessions, routes_history, routes_approvals, routes_compare, routes_fleet):
        module.add_routes(router, ctx, pages)

    @router.get("/static/{name}", name="static", include_in_schema=False)
    def static(name: str) -> Response:
        path = STATIC / name
        if path.parent != STATIC or not path.is_file():
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(path)

    return router


def create_dashboard(
    bundle: StoreBundle,
    *,
    client: Client | None = None,
    read_only: bool = False,
    auth: Callable[..., Any] | None = None,
    routers: Sequence[APIRouter] = (),
    metrics: bool = True,
) -> FastAPI:
    """The dashboard as a FastAPI app over `bundle` (any store the CLI opens); mount it or serve it."""
    ctx = _context(bundle, client, read_only)
    app = FastAPI(title="lousho dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(_router(ctx, auth))
    guard = [Depends(auth)] if auth is not None else []
    for extra in routers:
        app.include_router(extra, dependencies=guard)
    metrics_app = _metrics_app(bundle) if metrics else None
    if metrics_app is not None:
        app.mount("/metrics", metrics_app)
    return app


def _metrics_app(bundle: StoreBundle) -> Any:
    """The Prometheus app of the metrics helper (issue #19, item 2); None without `prometheus_client`."""
    try:
        from lousho.telemetry.metrics import metrics_app
    except ModuleNotFoundError as exc:
        if exc.name not in ("prometheus_client", "lousho.telemetry", "lousho.telemetry.metrics"):
            raise
        return None
    return metrics_app(bundle)
