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

`routers=` adds your own APIRouters (guarded by the same `auth`). `/metrics` (issue #19, item 2) serves
`lousho.telemetry.metrics.metrics_registry(bundle)` when `prometheus_client` is installed (the `metrics` extra)
and `metrics=True`, behind `auth` like every page (issue #31); `metrics_public=True` serves it to anyone (a
scraper with no login), `metrics=False` not at all.

Every answer carries `security.SECURITY_HEADERS` (a Content-Security-Policy that allows only the dashboard's own
files, no framing, no sniffing); forms carry a CSRF token signed with `secret` (default: `LOUSHO_DASHBOARD_SECRET`,
else random per process: give every process of one dashboard the same), and what a POST did is told by a signed
flash message, never by the URL (`security.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.exceptions import HTTPException
from fastapi.responses import FileResponse, Response
from starlette.requests import Request

from lousho.dashboard import routes_approvals, routes_compare, routes_fleet, routes_history, routes_sessions
from lousho.dashboard.pages import Pages
from lousho.dashboard.security import DashboardSecret, GuardedRoute
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
    secret: str | bytes | None = None,
) -> APIRouter:
    """The dashboard's pages as an APIRouter, for `app.include_router(router, prefix=...)`."""
    ctx = _context(bundle, client, read_only)
    return _router(ctx, auth, DashboardSecret(secret))


def _router(ctx: DashboardContext, auth: Callable[..., Any] | None, secret: DashboardSecret) -> APIRouter:
    guards = [Depends(secret.attach), *([Depends(auth)] if auth is not None else [])]
    router = APIRouter(dependencies=guards, route_class=GuardedRoute)
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
    metrics_public: bool = False,
    secret: str | bytes | None = None,
) -> FastAPI:
    """The dashboard as a FastAPI app over `bundle` (any store the CLI opens); mount it or serve it."""
    ctx = _context(bundle, client, read_only)
    app = FastAPI(title="lousho dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(_router(ctx, auth, DashboardSecret(secret)))
    guard = [Depends(auth)] if auth is not None else []
    for extra in routers:
        app.include_router(extra, dependencies=guard)
    scrape = _metrics_route(bundle) if metrics else None
    if scrape is not None:  # behind `auth` unless the operator opts out (issue #31)
        for path in ("/metrics", "/metrics/"):
            app.add_api_route(path, scrape, dependencies=[] if metrics_public else guard, include_in_schema=False)
    return app


def _metrics_route(bundle: StoreBundle) -> Callable[[Request], Response] | None:
    """The Prometheus scrape of the metrics helper (issue #19, item 2); None without `prometheus_client`."""
    try:
        from prometheus_client.exposition import choose_encoder

        from lousho.telemetry.metrics import metrics_registry
    except ModuleNotFoundError as exc:
        if exc.name not in (
            "prometheus_client",
            "prometheus_client.exposition",
            "lousho.telemetry",
            "lousho.telemetry.metrics",
        ):
            raise
        return None
    registry = metrics_registry(bundle)

    def scrape(request: Request) -> Response:
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(registry), media_type=content_type)

    return scrape
