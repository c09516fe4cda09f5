"""Make docs/flower.png: Flower's tasks page while the demo's trip planners run on a real fleet.

    python scripts/flower_screenshot.py [out.png]

Needs headless Chromium (Debian: `apt-get install -y chromium`). Starts a private Redis, one
worker of `lousho.demo.fleet_app`, and Flower on a free port; runs three trip planners to the
end (approving each booking through `Client.resolve_approval`); then screenshots
`/tasks`, where each model turn shows as `lousho.model_turn` with id `<session>/turn/<n>` and
each tool call as `tool:<tool>` with id `<session>/turn/<n>/tool/<call id>`. Ends every process it
started, by pid. Made by hand, not in CI.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from lousho.demo.trip import TRIP_REQUESTS
from lousho.settings import LoushoSettings
from lousho.testing.redis_server import private_redis
from lousho.testing.workers import start_worker

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout_s}s")


def end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def main(out: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (Debian: apt-get install -y chromium)")
    with private_redis() as url, tempfile.TemporaryDirectory(prefix="lousho-flower-") as folder:
        settings = LoushoSettings(redis_url=url, store_url=None, prefix="lousho:", queue="lousho")
        env = {**os.environ, **settings.env(), "LOUSHO_DEMO_TOOL_DELAY_S": "0.2", "FLOWER_UNAUTHENTICATED_API": "1"}
        port = free_port()
        with open(Path(folder) / "flower.log", "wb") as log:
            flower = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "lousho.demo.fleet_app",
                    "flower",
                    f"--port={port}",
                    "--address=127.0.0.1",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = None
        try:
            wait_http(f"http://127.0.0.1:{port}/healthcheck")
            worker = start_worker(
                "lousho.demo.fleet_app", queue=settings.fleet.queue, name="worker1", env=env, log_dir=folder
            )
            client = settings.client()
            for session, request in TRIP_REQUESTS.items():
                client.enqueue("trip_planner", request, session_id=session)
            approved: set[str] = set()
            deadline = time.monotonic() + 60
            while not all(client.status(s).status == "finished" for s in TRIP_REQUESTS):
                for session in TRIP_REQUESTS:
                    status = client.status(session)
                    if (
                        status.approval_id
                        and status.status == "awaiting-approval"
                        and status.approval_id not in approved
                    ):
                        client.resolve_approval(status.approval_id, approved=True, note="ok")
                        approved.add(status.approval_id)
                if time.monotonic() > deadline:
                    raise RuntimeError("the trip planners did not finish")
                time.sleep(0.1)
            time.sleep(1.0)  # let Flower receive the last events
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--hide-scrollbars",
                    "--window-size=1600,1000",
                    "--virtual-time-budget=5000",
                    f"--screenshot={out}",
                    f"http://127.0.0.1:{port}/tasks",
                ],
                check=True,
                timeout=120,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            print(f"wrote {out}")
        finally:
            if worker is not None:
                worker.stop()
            end(flower)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "flower.png")
