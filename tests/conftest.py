"""Shared fixtures. Each real part (Redis, SQL) has its own fixture module under tests/fixtures/."""

from __future__ import annotations

import os

# The CLI sizes its tables to COLUMNS when it is set (a terminal's width); the tests read its output as a pipe
# gets it, whatever the shell that runs them exports (pytest-xdist's workers set COLUMNS=80: issue #33).
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

pytest_plugins = [
    "tests.fixtures.core",
    "tests.fixtures.sql",
    "tests.fixtures.redis",
    "tests.fixtures.local_store",
    "tests.fixtures.rabbitmq",
    "tests.fixtures.workers",
]
