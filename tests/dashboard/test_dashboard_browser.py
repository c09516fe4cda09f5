"""The dashboard end to end in a real headless chromium, on a real fleet of Celery worker processes (issue #19):
a job appears on the sessions page, is approved from the approvals page and finishes; a finished session is
forked from its history with a patched tool result, run, and compared with its source. Each page's screenshot is
written to the test's temporary folder: a test run writes nothing into the repository tree (issue #33). The copies
shown in the README and docs/observability.md (docs/dashboard/*.png) are remade by `bash scripts/screenshots`, which
runs this test with LOUSHO_SCREENSHOTS naming that folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from lousho import Message
from lousho.dashboard import create_dashboard
from tests.dashboard.browser import chromium_page, serving
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.workers]
PAGES = ["approvals", "compare", "fleet", "history", "session", "sessions"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the screenshots go: the test's temporary folder, or the one LOUSHO_SCREENSHOTS names (only
    `scripts/screenshots` sets it, to docs/dashboard: issue #33)."""
    folder = Path(os.environ.get("LOUSHO_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shoot(page: Any, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


def wait_for_status(page: Any, status: str) -> None:
    """The session's page reloads itself on each new save (follow.js) until it shows `status`."""
    page.wait_for_selector(f"#session-status:text-is('{status}')", timeout=60_000)


def newest_save_with_both_results(fleet: Fleet, session_id: str) -> int:
    """The save right before the final answer: both calls' results recorded, the model not asked yet."""
    for entry in fleet.store.checkpoints.history(session_id):  # newest first
        results = {m.tool_call_id for m in entry.checkpoint.messages if m.role == "tool"}
        if entry.status == "in-progress" and results == {"w1", "c1"}:
            return entry.checkpoint.version
    raise AssertionError(f"{session_id} has no save with both results")


def test_a_job_is_approved_from_the_page_then_forked_run_and_compared_in_a_browser(fleet: Fleet, shots: Path) -> None:
    fleet.script(
        "pay",
        [
            tool_turn(("w1", "work", {"n": 3}), ("c1", "charge", {"amount": 30})),
            Message.assistant("Paid 30; the square of 3 is 9."),
        ],
    )
    fleet.script("pay.fork-1", [Message.assistant("unused"), Message.assistant("Paid 30; the square of 3 is 99?")])
    fleet.script("warm-up", [tool_turn(("k1", "work", {"n": 2})), Message.assistant("The square of 2 is 4.")])
    fleet.start_worker("w1")
    with serving(create_dashboard(fleet.store, client=fleet.client)) as base, chromium_page() as page:
        blocked: list[str] = []  # what the Content-Security-Policy refused (issue #31): nothing of the dashboard's own
        page.on(
            "console",
            lambda message: blocked.append(message.text) if "Content Security Policy" in message.text else None,
        )
        fleet.client.enqueue("jobs", "Square 2", session_id="warm-up")
        fleet.wait_for(["warm-up"], timeout_s=60)
        page.goto(f"{base}/")
        fleet.client.enqueue("jobs", "Charge 30 and square 3", session_id="pay")
        page.wait_for_selector('tr[data-session="pay"] .status.awaiting-approval', timeout=60_000)  # live rows
        page.wait_for_selector("#pending-count:text-is('1')", timeout=10_000)  # the count follows too (issue #32)
        assert page.inner_text("#pager-shown") == "1-2 of 2"
        shoot(page, shots, "sessions")
        rows = page.locator("#session-rows tr")
        assert rows.first.get_attribute("data-session") == "pay"  # newest save first, with its age (issue #32)
        assert rows.first.locator("td.age").inner_text().endswith(" ago")
        page.select_option("#prune-status", "finished")  # prune: first what it would delete (issue #32)
        page.fill("#prune-older-than", "1d")
        page.click("#prune")
        page.wait_for_selector("text=Nothing to delete.", timeout=10_000)
        page.goto(f"{base}/")
        page.select_option("#status-filter", "finished")  # filters at once (live.js: the CSP allows no inline handler)
        page.wait_for_url("**status=finished**")
        assert page.locator('tr[data-session="pay"]').count() == 0

        page.goto(f"{base}/approvals")
        row = page.locator("tr[data-approval]").filter(has_text="charge")
        row.locator('input[name="note"]').fill("within budget")
        shoot(page, shots, "approvals")
        row.locator("button.approve").click()
        page.wait_for_selector("p.note:text('approved')")
        page.goto(f"{base}/sessions/pay")
        wait_for_status(page, "finished")
        assert "Paid 30; the square of 3 is 9." in page.inner_text("table.transcript")
        assert '"charged": 30' in page.inner_text("#call-c1")
        shoot(page, shots, "session")

        page.goto(f"{base}/sessions/pay/history")
        page.select_option("#fork-save", str(newest_save_with_both_results(fleet, "pay")))
        page.select_option("#fork-call", "w1")
        page.fill("#fork-result", '{"n": 3, "square": 99}')
        shoot(page, shots, "history")
        page.click("#fork-submit")
        page.wait_for_selector("p.note:text('forked pay')")
        assert page.inner_text("#session-status") == "in-progress"
        fleet.redis.set(fleet.key("model-delay:pay.fork-1:2"), "2")  # the fork's model turn takes 2 s
        page.click("#run")
        page.wait_for_selector("p.note:text('resumed')")
        assert page.inner_text("#session-status") == "in-progress"
        wait_for_status(page, "finished")  # the page followed the run by itself
        assert '"square": 99' in page.inner_text("#call-w1")

        page.click("#compare-with-source")
        assert page.inner_text("#verdict") == "first divergence at step 1"
        highlighted = page.locator("#first-divergence")
        assert "99" in highlighted.inner_text() and "9" in highlighted.inner_text()
        assert highlighted.evaluate("row => getComputedStyle(row.cells[0]).backgroundColor") != "rgb(255, 255, 255)"
        shoot(page, shots, "compare")

        fleet.script("busy", [tool_turn(("s1", "work", {"n": 2, "sleep_s": 4})), Message.assistant("done")])
        fleet.client.enqueue("jobs", "a slow one", session_id="busy")
        fleet.pid_running("s1")
        page.goto(f"{base}/fleet")
        assert "jobs" in page.inner_text("table.workers") and fleet.queue in page.inner_text("table.queues")
        assert "w1@" in page.inner_text("table.workers")  # the worker by its node name (issue #32)
        assert "busy" in page.inner_text("table.inflight") and "s1" in page.inner_text("table.running")
        shoot(page, shots, "fleet")

        page.goto(f"{base}/approvals")  # none pending: the page's rows follow the store (issue #32)
        assert "no approval is pending" in page.inner_text("#approval-rows")
        fleet.script("pay-2", [tool_turn(("c2", "charge", {"amount": 5})), Message.assistant("Paid 5.")])
        fleet.client.enqueue("jobs", "Charge 5", session_id="pay-2")
        page.wait_for_selector("tr[data-approval]:has-text('charge')", timeout=60_000)
        page.wait_for_selector("#pending-count:text-is('1')", timeout=10_000)
    assert blocked == []
    assert fleet.counts("runs") == {
        "k1": 1,
        "w1": 1,
        "c1": 1,
        "s1": 1,
    }  # the fork ran no tool: its results came from the save
    assert {shot.stem: shot.read_bytes()[:8] for shot in shots.glob("*.png")} == dict.fromkeys(PAGES, PNG)
