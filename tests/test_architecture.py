"""The parts of the package talk through public names, and import only what docs/architecture.md allows (issue #14)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_of_the_package_reads_another_modules_private_members() -> None:
    """The fleet's steps drive a run through `RunContext`/`Run`'s public API, not `run._ctx`, `_latest`, `_abort`..."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "SLF001", "--output-format", "concise", "lousho"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]


def test_the_import_contracts_between_the_parts_hold() -> None:
    """Among them: the run loop imports downwards only, so `run -> pausing -> subagents -> executor -> run` is no circle."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "The run loop's modules import downwards only (no circle) KEPT" in result.stdout
    assert "0 broken" in result.stdout
