"""docs/topologies.md: each section's Python blocks run as they are, in a fresh interpreter (issue #18)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.fixtures.rabbitmq import require_rabbitmq_server
from tests.ops.conftest import ROOT, run_clean

DOC = ROOT / "docs" / "topologies.md"


def section(title: str) -> str:
    """The text under `## <title>`, up to the next `## ` heading."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def python_blocks(title: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", section(title), re.S)


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.workers  # its child process starts Celery workers, which tests/fixtures/workers.py cannot see
def test_the_rabbitmq_example_runs_a_job_with_an_approval_on_rabbitmq_and_redis(tmp_path: Path) -> None:
    require_rabbitmq_server()
    [block] = python_blocks("RabbitMQ broker, Redis store")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_")}  # the block says what it uses
    done = run_clean([sys.executable, "-c", block], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, timeout_s=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["Your day in Oslo: sunny, lunch at Casa Oslo (booked for 2).", "True"]
