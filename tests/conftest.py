"""Shared fixtures. Each real part (Redis, SQL) has its own fixture module under tests/fixtures/."""

from __future__ import annotations

pytest_plugins = [
    "tests.fixtures.core",
    "tests.fixtures.sql",
    "tests.fixtures.redis",
    "tests.fixtures.local_store",
    "tests.fixtures.rabbitmq",
    "tests.fixtures.workers",
]
