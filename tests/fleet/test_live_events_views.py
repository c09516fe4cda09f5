"""`lousho show --follow` and the dashboard's session page read a fleet session's event stream (issue #34): the
model's text shows as it is written, before its save, and the saved transcript follows."""

from __future__ import annotations

import codecs
import time

import pytest

from lousho.dashboard import create_dashboard
from tests.dashboard.browser import chromium_page, serving
from tests.fleet.conftest import Fleet
from tests.ops.test_cli_conventions import LiveCommand

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

APP = "tests.fleet.events_app"


class LiveOutput(LiveCommand):
    """A `LiveCommand` whose output is read as it comes, not by lines: a streamed answer stays on one line until
    its turn is saved."""

    def _read(self) -> None:
        assert self.process.stdout is not None
        decoder = codecs.getincrementaldecoder("utf-8")()
        while chunk := self.process.stdout.buffer.read1(4096):
            self.lines.append(decoder.decode(chunk))


def test_show_follow_prints_the_answer_as_it_streams_then_the_save_and_ends(fleet: Fleet) -> None:
    env = {"LOUSHO_REDIS_URL": fleet.env["LOUSHO_TEST_FLEET_REDIS"], "LOUSHO_PREFIX": fleet.prefix}
    session = fleet.client.enqueue("writer", "follow me", session_id="live-cli", require_worker=False)  # it waits
    following = LiveOutput("show", session, "--follow", env=env)
    try:
        following.wait_for("-- in-progress, step 0", timeout_s=30)  # the session as saved; then the run starts
        fleet.start_worker(app=APP, LOUSHO_TEST_DELTA_DELAY_S="0.1")
        following.wait_for("(streaming, turn 1): ", timeout_s=30)
        streaming = fleet.client.status(session).status
        status = following.process.wait(timeout=60)  # it ends by itself: the session finished
    finally:
        following.end()
    out = following.output
    assert streaming == "in-progress", "the text showed only once the run was over"
    assert status == 0, out
    text = fleet.client.status(session).text
    assert text is not None and text in out  # streamed, piece after piece, on one line
    assert out.count(text) == 1, "the saved answer is printed again after it streamed"
    assert out.index(text) < out.index("-- #2 assistant saved: the text above") < out.index("-- finished")
    assert "turn 1, attempt 1 started" in out and out.count("#0 system") == 1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_session_page_shows_the_answer_growing_from_the_stream_then_the_saved_transcript(fleet: Fleet) -> None:
    fleet.start_worker(app=APP, LOUSHO_TEST_DELTA_DELAY_S="0.2")
    fleet.redis.sadd(fleet.key("gate"), "live-page")  # the model waits until the page follows the stream
    session = fleet.client.enqueue("writer", "watch me", session_id="live-page")
    with serving(create_dashboard(fleet.store, client=fleet.client)) as base, chromium_page() as page:
        blocked: list[str] = []
        page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
        page.goto(f"{base}/sessions/{session}")
        # a loaded machine once started Chromium so slowly that the page saw only the answer's end (issue #33)
        fleet.redis.srem(fleet.key("gate"), "live-page")
        lengths = []
        while fleet.client.status(session).status == "in-progress":
            shown = page.evaluate("(document.getElementById('live-text') || {}).textContent || ''")
            lengths.append(len(shown))
            assert len(lengths) < 600, lengths
            time.sleep(0.1)
        page.wait_for_selector("#session-status:text-is('finished')", timeout=30_000)
        transcript = page.text_content("table.transcript") or ""
    assert len({n for n in lengths if n}) >= 3, f"the live text did not grow before the save: {lengths}"
    text = fleet.client.status(session).text
    assert text is not None and text in transcript
    assert blocked == []
