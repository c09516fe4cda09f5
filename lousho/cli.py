"""The `lousho` command."""

from __future__ import annotations

import asyncio

import typer

app = typer.Typer(help="lousho: durable LLM agent runs on Celery and Redis.", no_args_is_help=True)


@app.command()
def demo(in_process: bool = typer.Option(True, help="Run the in-process demo (one SQLite file, two processes).")) -> None:
    """Run a scripted trip planner that is killed mid-run, resumed, and approved."""
    from lousho.demo.inprocess import run_demo

    asyncio.run(run_demo())


@app.callback()
def main_callback() -> None:
    """lousho: durable LLM agent runs."""


def main() -> None:
    app()
