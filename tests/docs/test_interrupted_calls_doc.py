"""docs/interrupted-calls.md: its Python example runs as shown and prints what the page says (issue #17)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.docs.walkthrough import fenced_blocks, python_blocks

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "interrupted-calls.md"


def test_the_interrupted_calls_example_prints_what_the_page_shows() -> None:
    [example] = python_blocks(PAGE)
    shown = next("\n".join(lines) for lang, lines in fenced_blocks(PAGE) if not lang and lines[0].startswith("aborted"))
    done = subprocess.run([sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == shown.strip()
