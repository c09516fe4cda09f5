"""`python -m bench --quick` on a subset finishes and writes its table with the expected rows.

Benchmarks are not tests: nothing here looks at a figure. LangGraph and DBOS may be missing
from the test venv (they are the `bench` extra): their rows then say "not installed".
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

ROWS = [
    "| lousho | no store |",
    "| lousho | memory store |",
    "| lousho | SqliteStore |",
    "| lousho | RedisStore |",
    "| LangGraph | no checkpointer |",
    "| LangGraph | InMemorySaver |",
    "| LangGraph | SqliteSaver (default durability: async) |",
    '| LangGraph | SqliteSaver, durability="sync" |',
    "| DBOS | plain functions (no DBOS) |",
    "| DBOS | workflow of steps, SQLite system database |",
    "| floor: bare Celery hop |",
    "| lousho | ",
    "| lousho, outbox off (each step through `send_task`) |",
    "| Redis commands per hop (inside scripts too) <= 2x the floor's |",
    "| Redis round trips per hop <= the floor's |",  # counted by the server (issue #30)
]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.workers  # its child process starts Celery workers, which tests/fixtures/workers.py cannot see
def test_quick_bench_writes_its_table_with_every_row(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    command = [sys.executable, "-m", "bench", "--quick", "--only", "overhead,latency", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-4000:]

    table = (out / "README.md").read_text(encoding="utf-8")
    missing = [row for row in ROWS if row not in table]
    assert not missing, f"rows missing from the table: {missing}\n{table}"
    for framework in ("LangGraph", "DBOS"):
        if importlib.util.find_spec(framework.lower()) is None:
            rows = [line for line in table.splitlines() if line.startswith(f"| {framework} | ")]
            assert rows and all("not installed" in row for row in rows), rows
    for section in ("## 3. Throughput", "## 4. Cost growth", "## 5. Recovery"):
        assert f"{section}" in table and "Not run in this invocation" in table.split(section, 1)[1].split("##", 1)[0]
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert set(results) == {"overhead", "latency", "meta"} and results["meta"]["versions"]["lousho"]
    counted = results["latency"]["redis_commands_per_hop"]
    assert all(counted[kind]["round_trips"] > 1 for kind in ("lousho", "floor")), counted  # a hop is a read or more
    assert "## Benchmarks" in (out / "summary.md").read_text(encoding="utf-8")
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "overhead.png").stat().st_size > 0 and (out / "fleet_latency.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_store_growth_writes_a_row_per_store(tmp_path: Path) -> None:
    from bench import store_growth

    table = store_growth.run(1)

    for store in (
        "memory_store()",
        "SqliteStore",
        "FileStore",
        "RedisStore",
        "naive SQLite",
        "naive files",
        "naive Redis",
    ):
        rows = [line for line in table.splitlines() if line.startswith(f"| {store}")]
        assert len(rows) == 1 and rows[0].count("|") == 7, (store, rows)


@pytest.mark.slow  # 2-7 s: out of `scripts/check --fast` (issue #33)
@pytest.mark.workers  # its child process starts Celery workers, which tests/fixtures/workers.py cannot see
def test_the_hop_profile_writes_a_row_per_area_for_lousho_and_the_floor(tmp_path: Path) -> None:
    out = tmp_path / "profile.md"
    command = [sys.executable, "-m", "bench.profile_hop", "--quick", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    table = out.read_text()
    for area in ("waiting on sockets", "redis-py", "celery, kombu, billiard, vine", "lousho", "pydantic", "**all**"):
        assert f"| {area} |" in table, table
    assert "Redis commands per hop" in table and "floor" in table


def test_the_in_process_profile_writes_a_row_per_area_and_the_growing_functions(tmp_path: Path) -> None:
    out = tmp_path / "inprocess_profile.md"
    command = [sys.executable, "-m", "bench.profile_inprocess", "--quick", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    table = out.read_text()
    areas = ("sqlalchemy", "sqlite3 driver (C: execute, commit)", "redis-py", "pydantic", "lousho.stores", "**all**")
    for area in areas:
        assert f"| {area} |" in table, table
    assert "overhead: SqliteStore" in table and "RedisStore" in table
    for store in ("SqliteStore", "RedisStore"):
        assert f"Functions whose own time per step grows most with {store}" in table, table


def test_the_hop_profile_keeps_the_notes_below_its_marker_and_replaces_the_table(tmp_path: Path) -> None:
    from bench.profile_hop import KEPT, with_kept_notes

    out = tmp_path / "profile.md"
    assert with_kept_notes("# table 1\n", out) == "# table 1\n"  # no page yet
    out.write_text("# table 1\n" + KEPT + "\n## What it shows\n\nnotes\n", encoding="utf-8")

    assert with_kept_notes("# table 2\n", out) == "# table 2\n\n" + KEPT + "\n## What it shows\n\nnotes\n"


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.workers  # its child process starts Celery workers, which tests/fixtures/workers.py cannot see
def test_the_cluster_bench_writes_its_throughput_reaper_and_repair_tables(tmp_path: Path) -> None:
    from tests.topologies.cluster_fleet import require_cluster_binaries

    require_cluster_binaries()
    out = tmp_path / "cluster.md"
    command = [sys.executable, "-m", "bench.cluster", "--quick", "--markdown", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=380, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    table = out.read_text()
    for row in ("| one Redis (outbox on) |", "| Cluster store, Redis broker |", "| Cluster store / one Redis |"):
        assert row in table, table
    for header in ("| idle sessions | one Redis | Cluster (16,384 shards) |", "| stored sessions | one Redis | Cluster |"):
        rows = table.split(header, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
        assert [row.split(" | ")[0] for row in rows] == ["| 0", "| 100", "| 1,000"], table  # bench.cluster.QUICK_COUNTS


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_waiting_workload_bench_runs_every_side_and_every_session_finishes(tmp_path: Path) -> None:
    """`python -m bench.concurrency --quick` (issue #29): the table's row, and no session lost on any side (lousho,
    the floor, and the floor's tasks on lousho's pool)."""
    command = [sys.executable, "-m", "bench.concurrency", "--quick", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    [row] = json.loads((tmp_path / "concurrency.json").read_text())["rows"]
    assert row["lousho"]["finished"] == row["floor"]["finished"] == row["pooled"]["finished"] == 100
    assert min(row[side]["most_in_flight"] for side in ("lousho", "floor", "pooled")) > 1  # counted, every side
    page = (tmp_path / "concurrency.md").read_text()
    assert "| 100 | " in page and "The pool alone" in page


def test_the_waiting_workloads_figures_are_medians_over_rounds_and_every_round_must_finish_every_session() -> None:
    from bench.concurrency import _medians

    def round_(kb: float, wall_s: float, finished: int) -> dict[str, Any]:
        return {"sessions": 100, "wall_s": wall_s, "enqueue_s": 0.1, "slots": 50, "most_in_flight": 50,
                "kb_per_session": kb, "worker_cpu_ms_per_session": 1.0, "redis_cpu_ms_per_session": 0.5,
                "redis_commands_per_session": 40.0, "finished": finished}  # fmt: skip

    rounds = [round_(39.0, 3.0, 100), round_(64.0, 2.9, 99), round_(61.0, 3.4, 100)]
    figures = _medians(rounds)
    assert (figures["kb_per_session"], figures["wall_s"]) == (61.0, 3.0)
    assert figures["finished"] == 99, "a session lost in any round is lost"
    assert figures["rounds"] == rounds
