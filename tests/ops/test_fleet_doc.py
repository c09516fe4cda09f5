"""docs/fleet.md (the fleet section of the README): its Python blocks run as they are, in a fresh interpreter,
and every `lousho` command its shell blocks use exists."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import typer

from lousho.cli import app
from tests.ops.conftest import ROOT, run_clean

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

DOC = ROOT / "docs" / "fleet.md"
TEXT = DOC.read_text(encoding="utf-8")
PYTHON = re.findall(r"```python\n(.*?)```", TEXT, re.S)
BASH = re.findall(r"```bash\n(.*?)```", TEXT, re.S)


TOUR = next(block for block in PYTHON if "resolve_approval" in block and "start_worker" in block)
OTHERS = [block for block in PYTHON if block is not TOUR]


@pytest.mark.parametrize("block", OTHERS, ids=[f"block-{i}" for i in range(len(OTHERS))])
def test_fleet_doc_python_block_runs(block: str, tmp_path: Path) -> None:
    done = run_clean([sys.executable, "-c", block], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_client_tour_runs_and_prints_the_approved_booking_and_the_answer(tmp_path: Path) -> None:
    done = run_clean([sys.executable, "-c", TOUR], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "book_table {'restaurant': 'Casa Oslo', 'people': 2}",
        "Your day in Oslo: sunny, lunch at Casa Oslo (booked for 2).",
    ]


def test_every_lousho_command_in_the_shell_blocks_exists() -> None:
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    used = set(re.findall(r"\blousho (?:--\S+ \S+ )*([a-z]+)", "\n".join(BASH)))
    assert used and used <= commands, used - commands
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", TEXT):
        assert (DOC.parent / image).is_file(), image  # links are relative to docs/
