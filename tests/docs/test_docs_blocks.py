"""docs/fork.md's code blocks run as pasted (issue #32): one after another in one fresh interpreter, as a reader
pastes them into one Python session, in a fresh folder, with nothing but lousho installed; what they print is what
the page says they print."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.docs.walkthrough import python_blocks
from tests.ops.conftest import ROOT

FORK = ROOT / "docs" / "fork.md"


def test_the_fork_pages_blocks_run_in_reading_order_and_print_what_it_says(tmp_path: Path) -> None:
    script = "\n".join(python_blocks(FORK))
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines()
    assert printed[0] == "Pack for sun."
    assert "trip.fork-1 Pack for rain." in printed
    assert "session_id='trip' step=1 save=2" in printed  # the fork knows its source
    assert "diverged at step 1" in printed
    assert list(tmp_path.iterdir()) == []  # a memory store: the page writes nothing
