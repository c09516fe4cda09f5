"""`python -m bench --quick --only events` (issue #34) finishes and writes the table of the hop with live events on
and off. A benchmark, not a test of speed: nothing here looks at a figure's size, only that each was measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.workers  # its child process starts Celery worker processes
def test_quick_bench_of_live_events_writes_the_hop_on_and_off_and_its_goal_row(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    command = [sys.executable, "-m", "bench", "--quick", "--only", "events", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-4000:]

    table = (out / "README.md").read_text(encoding="utf-8")
    assert "## 7. The live event stream's cost (issue #34)" in table
    for row in ("| events on (the session's stream written) |", "| events off (`Agent(stream_events=False)`) |"):
        assert row in table, table
    assert "| live events on: a hop <= 1.10x events off (500 tokens in 50 deltas a turn) |" in table
    section = json.loads((out / "results.json").read_text(encoding="utf-8"))["events"]
    assert section["deltas_per_turn"] == 50 and section["tokens_per_turn"] == 500
    assert section["ratio"]["n"] == section["repeats"] == 3
    assert section["stream_entries_per_session"]["min"] > section["hops"]  # the stream was written, each hop
