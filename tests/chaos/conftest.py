"""Chaos fixtures, and the table of trials, faults and violations printed at the end of the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.chaos.harness import MODE, ROWS, ChaosFleet, drop_queue, make_fleet, render_table


@pytest.fixture
def chaos_fleet(redis_url: str, redis_prefix: str, redis_client: redis.Redis, tmp_path: Path) -> Iterator[ChaosFleet]:
    """Real workers on the run's Redis (REDIS_URL or the private one), on a queue and key prefix of their own."""
    fleet = make_fleet(redis_url, redis_prefix, redis_client, tmp_path)
    yield fleet
    fleet.stop_all()
    drop_queue(redis_client, fleet.queue)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    terminalreporter.write_sep("=", f"lousho chaos suite, {MODE} mode")
    for line in render_table(ROWS):
        terminalreporter.write_line(line)
