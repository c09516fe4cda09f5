"""The payload codec on a real fleet (issue #17): workers and the web app's client with compression and
encryption on run a session end to end through the fleet's Lua scripts (leases, saves, committed tool
results, the outbox), and afterwards no Redis key holds a plaintext of the secret the session carried in
its input, its tool arguments, its tool results and its answer."""

from __future__ import annotations

import uuid

import pytest

from lousho import Message
from tests.engine.helpers import assert_valid_transcript
from tests.fleet.conftest import Fleet, tool_turn
from tests.stores.codecs import holding

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.workers]


def test_a_session_runs_on_workers_with_the_codec_on_and_redis_holds_no_plaintext_of_its_secret(
    codec_fleet: Fleet,
) -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    session = "codec-job"
    codec_fleet.start_worker()
    codec_fleet.script(
        session,
        [
            tool_turn(("e1", "echo", {"text": secret}), ("w1", "work", {"n": 3})),
            tool_turn(("e2", "echo", {"text": f"again {secret}"})),
            Message.assistant(f"all done: {secret}"),
        ],
    )

    codec_fleet.client.enqueue("jobs", f"please keep {secret} safe", session_id=session)
    codec_fleet.wait_for([session], timeout_s=60)

    checkpoint = codec_fleet.client.checkpoint(session)
    assert checkpoint is not None
    assert_valid_transcript(checkpoint.messages)
    results = {m.tool_call_id: m.content for m in checkpoint.messages if m.role == "tool"}
    assert secret in str(results["e1"]) and secret in str(results["e2"]) and "9" in str(results["w1"])
    assert checkpoint.messages[-1].content == f"all done: {secret}"
    assert codec_fleet.counts("runs") == {"e1": 1, "w1": 1, "e2": 1}
    assert [e.checkpoint.version for e in codec_fleet.store.checkpoints.history(session)][-1] == 1
    # The test's own probes (`<prefix>test:*`: the scripted model's answers) are the harness's, not lousho's.
    assert holding(codec_fleet.redis, secret, skip_prefix=f"{codec_fleet.prefix}test:") == []
    assert holding(codec_fleet.redis, secret) != []  # the grep does see a plaintext where there is one
    # The live events (issue #34) are sealed as the transcript is, and a reader with the key opens them.
    events = list(codec_fleet.client.events(session))
    finished = [e.data.get("result") for e in events if e.kind == "tool-call-finished"]
    assert any(secret in str(result) for result in finished) and events[-1].kind == "finished", events
