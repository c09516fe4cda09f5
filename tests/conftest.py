"""Shared fixtures. Each real part (Redis, SQL) has its own fixture module under tests/fixtures/."""

from __future__ import annotations

import os
import signal

# The CLI sizes its tables to COLUMNS when it is set (a terminal's width); the tests read its output as a pipe
# gets it, whatever the shell that runs them exports (pytest-xdist's workers set COLUMNS=80: issue #33).
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

# A test command started in the background of a script (`bash scripts/check &`, a CI runner's `cmd &` with no job
# control) inherits SIGINT ignored, and so would every process a test starts, since an ignored signal stays ignored
# across exec: the Ctrl-C tests would see the demo and `lousho sessions --watch` shrug it off (a loaded run so started
# failed eight of them; issue #33). A handler, unlike SIG_IGN, is reset to the default in each child, as a terminal's
# shell gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = [
    "tests.fixtures.core",
    "tests.fixtures.sql",
    "tests.fixtures.redis",
    "tests.fixtures.local_store",
    "tests.fixtures.rabbitmq",
    "tests.fixtures.workers",
]
