"""`lousho demo`, `worker`, `reaper`, `workers`: running and listing the fleet's processes;
`lousho workers`: the live workers, with the lousho and the protocols each speaks (issue #35).
(`lousho dashboard`, which starts the dashboard's server, is in lousho/console.py: issue #32.)"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import signal
import sys
from types import FrameType

import typer
from rich.table import Table

from lousho.cli.context import fleet_target_of, settings_of
from lousho.cli.exits import FAILED
from lousho.cli.render import print_json, print_table
from lousho.operations import live_workers
from lousho.settings import LoushoSettings

__all__ = ["default_node_name", "register"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: `finally` blocks run (and end what they started)."""
    raise KeyboardInterrupt


def _from_ctrl_c(error: BaseException) -> bool:
    """Whether a Ctrl-C raised `error`, itself or below it: Python 3.11 wraps what a class attribute's
    `__set_name__` raises in RuntimeError, so a Ctrl-C that lands while a module defines such a class comes out as
    RuntimeError (a loaded run's demo was stopped while its first `send_task` imported Celery's canvas; issue #33)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _fail(message: str) -> None:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(FAILED)


def default_node_name(queue: str | None, app_spec: str, pid: int) -> str:
    """A worker's Celery node name when none is given: `<queue or app>-<pid>@%h`, unique on its host, so two
    `lousho worker` commands are two nodes (Flower merged two `celery@<host>`), and the fleet page names each
    (issue #32)."""
    base = queue or app_spec.partition(":")[0].rpartition(".")[2] or "lousho"
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', base).strip('-') or 'lousho'}-{pid}@%h"


def _stopped_by_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _fail("[LOUSHO_INTERRUPTED] the demo was stopped; every process it started has ended")


def register(app: typer.Typer) -> None:
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
                raise typer.Exit(FAILED)
        except Exception as exc:
            if not _from_ctrl_c(exc):
                raise
            _stopped_by_ctrl_c()
        except KeyboardInterrupt:  # Ctrl-C, either demo: one line, no traceback (issue #15)
            _stopped_by_ctrl_c()

    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def worker(
        ctx: typer.Context,
        app_spec: str | None = typer.Option(None, "--app", "-A", help="The Celery app, module:attr (env: LOUSHO_APP)."),
        concurrency: int | None = typer.Option(
            None,
            "--concurrency",
            "-c",
            min=1,
            help="Slots per process on lousho's pool (default 100); prefork: processes.",
        ),
        pool: str = typer.Option(
            "lousho", "--pool", "-P", help="lousho (default: many steps per process), prefork, threads, solo."
        ),
        processes: int | None = typer.Option(
            None, "--processes", help="Worker processes (default: one per core on lousho's pool, else 1).", min=1
        ),
        hostname: str | None = typer.Option(
            None,
            "--hostname",
            "-n",
            help="Node name, e.g. worker1@%h; default QUEUE-PID@%h (the app for QUEUE when none): unique.",
        ),
        worker_queue: str | None = typer.Option(
            None, "--queues", "-Q", help="Queues to consume; default: the app's lousho queue."
        ),
        loglevel: str = typer.Option("INFO", "--loglevel", "-l", help="Celery's log level; default INFO."),
    ) -> None:
        """Run Celery workers for a lousho app: `celery -A APP worker` with lousho's flags, one process per core with
        100 slots each by default (issue #29); extra args go to celery."""
        from lousho.cli.worker_processes import default_processes, run_worker_processes, worker_command

        settings = settings_of(ctx)
        spec = app_spec or settings.app
        if not spec:
            _fail(
                "[LOUSHO_CONFIGURATION] no app: pass --app module:attr or set LOUSHO_APP "
                "(e.g. lousho.demo.fleet_app:app)"
            )
        _check_app(str(spec), settings)
        extra = ["-l", loglevel, *(["-Q", worker_queue] if worker_queue else []), *ctx.args]
        command, pool_env = worker_command(str(spec), pool, concurrency, extra)
        env = {**os.environ, **settings.env(), **pool_env}
        count = processes or default_processes(pool)
        name = hostname or default_node_name(worker_queue or settings.fleet.queue, str(spec), os.getpid())
        sys.stdout.flush()
        if count == 1:
            os.execve(sys.executable, [*command, "-n", name], env)
        raise typer.Exit(run_worker_processes(command, env, count, name))

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
    def workers(
        ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print the workers as JSON.")
    ) -> None:
        """The live workers: the agents each serves, its queues, its lousho and the protocols it speaks (a fleet
        in a rolling upgrade shows two releases; docs/upgrading.md). The dashboard's fleet page shows the same."""
        live = live_workers(fleet_target_of(ctx))
        if as_json:
            print_json([dataclasses.asdict(worker) | {"formats": dict(worker.formats or ())} for worker in live])
            return
        table = Table(title=f"{len(live)} live worker(s)")
        for column in ("worker", "process", "agents", "queues", "lousho and protocols"):
            table.add_column(column, overflow="fold")
        for worker in live:
            row = (worker.name or "-", worker.id, ", ".join(worker.agents), ", ".join(worker.queues), worker.speaks())
            table.add_row(*row)
        print_table(table)


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
