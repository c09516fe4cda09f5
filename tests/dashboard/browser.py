"""A real headless browser for the dashboard's end-to-end test: Debian's chromium, driven by Playwright's Python
package (no browser download), and the dashboard served by uvicorn in a thread of the test (issue #19)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> str:
    """Debian's chromium; the test is skipped without it (failed in CI, where .ci/run installs it)."""
    found = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if found is None:
        reason = "chromium is not installed: the dashboard's browser test needs it (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"in CI the dashboard is tested in a browser: {reason}")
        pytest.skip(reason)
    return found


@contextmanager
def chromium_page() -> Iterator[Any]:
    """A page of a fresh headless chromium (its own user-data-dir), closed and removed afterwards."""
    executable = require_chromium()
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="lousho-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=executable,
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": 1280, "height": 800},
            )
            try:
                yield context.pages[0] if context.pages else context.new_page()
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` served by uvicorn on a free local port, in a thread; its base URL. Stopped on exit."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("the dashboard's server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
