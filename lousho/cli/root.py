"""The `lousho` command's root: its group, its global options and its error handling; each group of commands
lives in a module of its own (`lousho.cli.sessions`, `.jobs`, `.approvals`, `.evaluation`, `.fleet`, `.metrics`,
`.reseal`).

Configuration comes from flags and the environment (`lousho.settings.LoushoSettings`):
`--redis-url` / `LOUSHO_REDIS_URL` / `REDIS_URL`, `--store-url` / `LOUSHO_STORE_URL`,
`--prefix` / `LOUSHO_PREFIX`, and each `FleetSettings` field, `--queue` / `LOUSHO_QUEUE`,
`--lease-ttl-s` / `LOUSHO_LEASE_TTL_S`, ... (before the command: `lousho --lease-ttl-s 3 worker`,
passed on to the worker's app in its environment). An error prints one line
(`error: [CODE] message`) on stderr and exits with status 1, never a traceback, and never a
configured URL's password (issue #21). Exit codes: `lousho.cli.exits` (one scheme for every command, issue #32).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any, get_type_hints

import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from lousho.cli import approvals, evaluation, fleet, jobs, metrics, reseal, sessions
from lousho.cli.conventions import (
    GLOBAL_PANEL,
    USAGE_ERROR,
    apply_conventions,
    fail_usage,
    given_after_the_command,
    show_version,
)
from lousho.cli.exits import FAILED, OK, exit_code_of
from lousho.cli.fleet_options import fleet_option_help, fleet_option_range
from lousho.errors import SDKError, StoreAuthenticationError, StoreUnavailableError
from lousho.fleet.settings import FleetSettings
from lousho.redaction import redact_secrets, redact_url, url_secrets
from lousho.settings import LoushoSettings, fleet_env_var

__all__ = ["app", "main"]


GLOBAL_OPTIONS = frozenset({"redis_url", "store_url", "prefix", *(f.name for f in dataclasses.fields(FleetSettings))})
"""The root's options that every command accepts after its name too (issue #15)."""


class _Group(TyperGroup):
    """Every command's errors become one line on stderr and an exit status of `lousho.cli.exits` (issue #32), and
    every command follows the CLI conventions of `lousho.cli.conventions` (issue #15)."""

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
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe is met here, not at the interpreter's exit
            return result
        except BrokenPipeError:
            _quiet_after_closed_pipe()
        except USAGE_ERROR as exc:
            fail_usage(exc)
        except SDKError as exc:
            refused = _refused_password(exc, ctx)
            _fail(_without_secrets(str(refused or exc), ctx), FAILED if refused else exit_code_of(exc))
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


def _quiet_after_closed_pipe() -> None:
    """The reader of stdout went away (`| head`): end quietly, with nothing on stderr and no error at exit
    (issue #32). Python's advice: point stdout at /dev/null, so the interpreter's last flush has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise typer.Exit(OK)


def _fail(message: str, code: int = FAILED) -> None:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


app = typer.Typer(
    cls=_Group,
    help="lousho: durable LLM agent runs, in process or on a Celery + Redis fleet.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},  # -h on every command (issue #15)
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: fits 80 columns without cutting a flag (issue #32)
)


def _with_fleet_options(callback: Callable[..., None]) -> Callable[..., None]:
    """Add an option per `FleetSettings` field to `callback`'s signature (`--lease-ttl-s`, `--outbox/--no-outbox`,
    ...), so a field added there is a flag here with nothing else to write (issue #14)."""
    types = get_type_hints(FleetSettings)

    def option(name: str) -> inspect.Parameter:
        flag = f"--{name.replace('_', '-')}"
        flags = f"{flag}/--no-{flag[2:]}" if types[name] is bool else flag
        help = f"{fleet_option_help(name)} (env: {fleet_env_var(name)})"
        default = typer.Option(None, flags, help=help, rich_help_panel=GLOBAL_PANEL, **fleet_option_range(name))
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


fleet.register(app)  # demo, worker, reaper, workers (issue #35); `dashboard`: lousho/console.py
jobs.register(app)  # enqueue, resume, abort
approvals.register(app)  # approvals, approve
sessions.register(app)  # sessions, show, history, fork, compare, delete, prune
evaluation.register(app)  # `lousho eval --drift A B` (issue #16)
metrics.register(app)  # `lousho metrics`: the fleet's /metrics on a host (issue #19)
reseal.register(app)  # `lousho reseal`: values sealed again under the current key (issue #31)


def main() -> None:
    """The `lousho` console script."""
    app()
