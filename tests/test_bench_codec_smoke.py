"""`python -m bench.codec --quick` finishes and writes its tables with every codec's row (issue #17).

Benchmarks are not tests: nothing here looks at a figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROWS = ["| off |", "| compression (zlib) |", "| zlib + encryption |", "| zstd + encryption |", "| encryption only |"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_codec_bench_writes_its_memory_and_save_tables(tmp_path: Path) -> None:
    out = tmp_path / "codec.md"
    command = [sys.executable, "-m", "bench.codec", "--quick", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    table = out.read_text(encoding="utf-8")
    assert "## 1. Redis memory per session" in table and "## 2. Save overhead" in table
    memory, saves = table.split("## 2.", 1)
    assert all(row in memory for row in ROWS), memory
    assert all(row in saves for row in ROWS if "compression" not in row), saves
