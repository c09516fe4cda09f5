"""Every Python code block in the README runs, as a user would paste it (in a fresh interpreter)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_starts_with_the_demo_and_test_commands() -> None:
    head = README.read_text(encoding="utf-8").splitlines()[:6]
    assert any("lousho demo" in line for line in head)
    assert any("scripts/check" in line for line in head)


# A block that starts real workers (the fleet's `Client` tour) is marked so (tests/fixtures/workers.py, issue #33).
PARAMS = [pytest.param(block, id=f"block-{i}", marks=[pytest.mark.workers] if "start_worker(" in block else [])
          for i, block in enumerate(BLOCKS)]  # fmt: skip


@pytest.mark.parametrize("block", PARAMS)
def test_readme_python_block_runs(block: str, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
