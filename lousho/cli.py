"""The `lousho` command: the demo, a worker, the reaper, and looking at and steering sessions.

Configuration comes from flags and the environment (`lousho.settings.LoushoSettings`):
`--redis-url` / `LOUSHO_REDIS_URL` / `REDIS_URL`, `--store-url` / `LOUSHO_STORE_URL`,
`--prefix` / `LOUSHO_PREFIX`, and each `FleetSettings` field, `--queue` / `LOUSHO_QUEUE`,
`--lease-ttl-s` / `LOUSHO_LEASE_TTL_S`, ... (before the command: `lousho --lease-ttl-s 3 worker`,
passed on to the worker's app in its environment). An error prints one line
(`error: [CODE] message`) on stderr and exits with status 1, never a traceback, and never a
configured URL's password (issue #21).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, get_type_hints

import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from lousho.cli_conventions import (
    GLOBAL_PANEL,
    USAGE_ERROR,
    apply_conventions,
    fail_usage,
    given_after_the_command,
    show_version,
)
from lousho.errors import SDKError, StoreAuthenticationError, StoreUnavailableError
from lousho.fleet.settings import FleetSettings
from lousho.redaction import redact_secrets, redact_url, url_secrets
from lousho.settings import LoushoSettings, fleet_env_var

__all__ = ["app", "main", "settings_of"]


GLOBAL_OPTIONS = frozenset({"redis_url", "store_url", "prefix", *(f.name for f in dataclasses.fields(FleetSettings))})
"""The root's options that every command accepts after its name too (issue #15)."""


class _Group(TyperGroup):
    """Every command's errors become one line on stderr and exit status 1 (a usage error: 2), and every command
    follows the CLI conventions of `lousho.cli_conventions` (issue #15)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        apply_conventions(self, GLOBAL_OPTIONS)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help:
            return super().parse_args(ctx, args)  # `lousho` alone: the help, as typer shows it
        try:
            return super().parse_args(ctx, args)
        except USAGE_ERROR as exc:
            fail_usage(exc)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except USAGE_ERROR as exc:
            fail_usage(exc)
        except SDKError as exc:
            _fail(_without_secrets(str(_refused_password(exc, ctx) or exc), ctx))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
            _fail(f"[LOUSHO_CONFIGURATION] bad settings: {problems}")
        except Exception as exc:
            refused = _refused_password(exc, ctx)
            if refused is not None:
                _fail(_without_secrets(str(refused), ctx))
            if _is_connection_error(exc):
                detail = _without_secrets(str(exc), ctx)
                _fail(f"[LOUSHO_STORE_UNAVAILABLE] cannot reach the broker or store: {detail}")
            raise


def _refused_password(exc: Exception, ctx: Any) -> StoreAuthenticationError | None:
    """A Redis that answered and refused the password, as the authentication failure it is, not as "unreachable"
    (issue #15). The stores report it as `StoreUnavailableError` from redis' `AuthenticationError`; this reads
    the cause, so the CLI says what to fix."""
    import redis

    cause = exc.__cause__ if isinstance(exc, StoreUnavailableError) else exc
    if not isinstance(cause, redis.AuthenticationError) and "NOAUTH" not in str(cause):
        return None
    settings = ctx.obj.with_overrides(**given_after_the_command(ctx)) if isinstance(ctx.obj, LoushoSettings) else None
    url = settings and (settings.redis_url or settings.store_url)
    where = f" at {redact_url(url)}" if url else ""
    return StoreAuthenticationError(
        f"Redis{where} refused this client's password ({type(cause).__name__}: {cause}): check the password in "
        "--redis-url / LOUSHO_REDIS_URL / REDIS_URL (or --store-url / LOUSHO_STORE_URL); waiting will not help"
    )


def _without_secrets(message: str, ctx: Any) -> str:
    """`message` without the password of any URL this command was given (flags, environment, settings):
    the last guard before stderr, for a driver's message that quotes one (issue #21)."""
    settings = ctx.obj if isinstance(ctx.obj, LoushoSettings) else None  # None: the settings were refused
    urls = [
        *(os.environ.get(name) for name in ("LOUSHO_REDIS_URL", "REDIS_URL", "LOUSHO_STORE_URL")),
        *(ctx.params.get(name) for name in ("redis_url", "store_url")),
        *(given_after_the_command(ctx).get(name) for name in ("redis_url", "store_url")),
        *((settings.redis_url, settings.store_url) if settings else ()),
    ]
    return redact_secrets(message, *(secret for url in urls if url for secret in url_secrets(url)))


def _is_connection_error(exc: Exception) -> bool:
    import kombu.exceptions
    import redis

    return isinstance(exc, (kombu.exceptions.OperationalError, redis.RedisError, ConnectionError))


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: `finally` blocks run (and end what they started)."""
    raise KeyboardInterrupt


def _fail(message: str) -> None:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(1)


app = typer.Typer(
    cls=_Group,
    help="lousho: durable LLM agent runs, in process or on a Celery + Redis fleet.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},  # -h on every command (issue #15)
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _with_fleet_options(callback: Callable[..., None]) -> Callable[..., None]:
    """Add an option per `FleetSettings` field to `callback`'s signature (`--lease-ttl-s`, `--outbox/--no-outbox`,
    ...), so a field added there is a flag here with nothing else to write (issue #14)."""
    types = get_type_hints(FleetSettings)

    def option(name: str) -> inspect.Parameter:
        flag = f"--{name.replace('_', '-')}"
        flags = f"{flag}/--no-{flag[2:]}" if types[name] is bool else flag
        help = f"FleetSettings.{name} (env: {fleet_env_var(name)})."
        default = typer.Option(None, flags, help=help, rich_help_panel=GLOBAL_PANEL)
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=types[name] | None)

    own = [p for p in inspect.signature(callback).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fleet = [option(field.name) for field in dataclasses.fields(FleetSettings)]
    callback.__signature__ = inspect.Signature([*own, *fleet])  # type: ignore[attr-defined]
    return callback


@app.callback()
@_with_fleet_options
def main_callback(
    ctx: typer.Context,
    redis_url: str | None = typer.Option(
        None,
        "--redis-url",
        metavar="URL",
        rich_help_panel=GLOBAL_PANEL,
        help="The fleet's Redis (broker and store) (env: LOUSHO_REDIS_URL, REDIS_URL).",
    ),
    store_url: str | None = typer.Option(
        None,
        "--store-url",
        metavar="URL",
        rich_help_panel=GLOBAL_PANEL,
        help="redis://..., sqlite:///path.db, postgresql://..., file:///dir (env: LOUSHO_STORE_URL).",
    ),
    prefix: str | None = typer.Option(
        None,
        "--prefix",
        metavar="PREFIX",
        rich_help_panel=GLOBAL_PANEL,
        help="RedisStore key prefix (env: LOUSHO_PREFIX; default lousho:).",
    ),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=show_version, help="Print lousho's version and exit."
    ),
    **fleet: Any,
) -> None:
    """lousho: durable LLM agent runs."""
    ctx.obj = LoushoSettings().with_overrides(redis_url=redis_url, store_url=store_url, prefix=prefix, **fleet)


def settings_of(ctx: typer.Context) -> LoushoSettings:
    """The command's settings: the environment, then the global options before the command, then those after it."""
    settings = ctx.find_root().obj
    assert isinstance(settings, LoushoSettings)
    return settings.with_overrides(**given_after_the_command(ctx))


@app.command()
def demo(
    in_process: bool = typer.Option(
        False, "--in-process", help="The in-process demo instead: one SQLite file, two processes."
    ),
) -> None:
    """Trip planners on two workers: one is SIGKILLed mid-run and recovered, bookings approved (the local store unless REDIS_URL)."""
    from lousho.demo.fleet import run_fleet_demo
    from lousho.demo.inprocess import run_demo

    signal.signal(signal.SIGTERM, _interrupt)  # a stopped demo still ends every process it started
    try:
        if in_process:
            asyncio.run(run_demo())
        elif not run_fleet_demo().ok:
            raise typer.Exit(1)
    except KeyboardInterrupt:  # Ctrl-C, either demo: one line, no traceback (issue #15)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _fail("[LOUSHO_INTERRUPTED] the demo was stopped; every process it started has ended")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    ctx: typer.Context,
    app_spec: str | None = typer.Option(None, "--app", "-A", help="The Celery app, module:attr (env: LOUSHO_APP)."),
    concurrency: int | None = typer.Option(
        None, "--concurrency", "-c", help="Slots per process on lousho's pool (default 100); prefork: processes."
    ),
    pool: str = typer.Option(
        "lousho", "--pool", "-P", help="lousho (default: many steps per process), prefork, threads, solo."
    ),
    processes: int | None = typer.Option(
        None, "--processes", help="Worker processes (default: one per core on lousho's pool, else 1).", min=1
    ),
    hostname: str | None = typer.Option(None, "--hostname", "-n", help="Node name, e.g. worker1@%h."),
    worker_queue: str | None = typer.Option(
        None, "--queues", "-Q", help="Queues to consume; default: the app's lousho queue."
    ),
    loglevel: str = typer.Option("INFO", "--loglevel", "-l"),
) -> None:
    """Run Celery workers for a lousho app: `celery -A APP worker` with lousho's flags, one process per core with
    100 slots each by default (issue #29); extra args go to celery."""
    from lousho.cli_worker import default_processes, run_worker_processes, worker_command

    settings = settings_of(ctx)
    spec = app_spec or settings.app
    if not spec:
        _fail(
            "[LOUSHO_CONFIGURATION] no app: pass --app module:attr or set LOUSHO_APP (e.g. lousho.demo.fleet_app:app)"
        )
    _check_app(str(spec), settings)
    extra = ["-l", loglevel, *(["-Q", worker_queue] if worker_queue else []), *ctx.args]
    command, pool_env = worker_command(str(spec), pool, concurrency, extra)
    env = {**os.environ, **settings.env(), **pool_env}
    count = processes or default_processes(pool)
    sys.stdout.flush()
    if count == 1:
        os.execve(sys.executable, [*command, *(["-n", hostname] if hostname else [])], env)
    raise typer.Exit(run_worker_processes(command, env, count, hostname))


def _check_app(spec: str, settings: LoushoSettings) -> None:
    """Import the app as the worker will (from the working directory, with these settings), so a typo
    or a missing setting is one clear line here rather than a traceback from celery."""
    import importlib

    module_name, _, attr = spec.partition(":")
    saved = dict(os.environ)
    os.environ.update(settings.env())
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _fail(
            f"[LOUSHO_CONFIGURATION] cannot import the app module {module_name!r}: {exc} "
            "(run from the folder that holds it, or set PYTHONPATH)"
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if attr and not hasattr(module, attr):
        _fail(f"[LOUSHO_CONFIGURATION] the module {module_name!r} has no {attr!r} (the Celery app made by create_app)")


@app.command()
def reaper(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="One pass, then exit (prints the sessions it requeued)."),
) -> None:
    """Requeue sessions whose worker went quiet (deadline passed, lease free), until stopped; several at once are safe.

    A pass every --reaper-interval-s (an option before the command: `lousho --reaper-interval-s 1 reaper`)."""
    from lousho.scheduler.reaper import reap_once, run_reaper

    client = settings_of(ctx).client()
    if once:
        requeued = reap_once(client.store, client.app, client.settings)
        typer.echo(f"requeued {len(requeued)} session(s){': ' if requeued else ''}{', '.join(requeued)}")
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    signal.signal(signal.SIGTERM, _interrupt)
    typer.echo(
        f"lousho reaper: a pass every {client.settings.reaper_interval_s}s on {client.store!r}, "
        + (f"queue {client.settings.queue}" if client.settings.queue else "each session to its agent's queue")
        + f"; dead workers looked for every {client.settings.death_check_interval_s}s",
        err=True,
    )
    try:
        run_reaper(client.store, client.app, client.settings)
    except KeyboardInterrupt:
        typer.echo("lousho reaper: stopped", err=True)


@app.command()
def dashboard(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8300, "--port", help="Port to listen on."),
    read_only: bool = typer.Option(False, "--read-only", help="Show only: every POST (approve, fork, run) is refused."),
) -> None:
    """Serve the sessions dashboard (needs the dashboard extra of lousho): sessions, approvals, history, fleet."""
    from lousho.dashboard.serve import serve_dashboard

    serve_dashboard(settings_of(ctx), host=host, port=port, read_only=read_only)  # issue #19


def _register() -> None:
    from lousho import cli_eval, cli_jobs, cli_metrics, cli_reseal, cli_sessions

    cli_jobs.register(app)
    cli_jobs.register_workers(app)  # `lousho workers`: who runs which lousho (issue #35)
    cli_sessions.register(app)
    cli_eval.register(app)  # `lousho eval --drift A B` (issue #16)
    cli_metrics.register(app)  # `lousho metrics`: the fleet's /metrics on a host (issue #19)
    cli_reseal.register(app)  # `lousho reseal`: values sealed again under the current key (issue #31)


_register()


def main() -> None:
    app()
