"""Fleet-wide limits (issue #29) on real worker processes, a real Redis and the real OpenAI SDK talking to a local
fake OpenAI server: every model request a worker makes is seen by the test, on the provider's side.

- a model's rate limit holds across two worker processes: with 3 requests a window and 5 sessions, the server
  sees 3 requests while the 2 other sessions wait, then the rest once the window has moved;
- an agent's maximum of sessions in flight: with 1, the server sees each session's turns together, never two
  sessions' interleaved, over two workers; every session finishes, and waiting used up no attempt;
- the dashboard's fleet page and the Prometheus metrics show each limit, its use and the sessions waiting on it;
- a vendor's 429 with Retry-After is waited out and the same call made again: the turn saved is the 200's
  answer, the server saw the 429s and one successful request for that turn, and the turn's attempt counter
  did not grow, though the 429s outnumber the agent's `RetryPolicy.max_attempts`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator

import pytest

from lousho.dashboard import create_dashboard
from lousho.fleet.keys import FleetKeys
from lousho.fleet.limits import LimitUsage, SlotUsage, limits_usage, session_slots_key
from lousho.fleet.registry import WorkerRegistry
from lousho.testing.fake_llm_servers import FakeLLMServer, RecordedRequest, Turn, call, rate_limited, reply
from lousho.testing.workers import start_worker
from tests.fleet.conftest import ROOT, Fleet

pytest.importorskip("openai")
pytest.importorskip("prometheus_client")
pytest.importorskip("fastapi")

from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lousho.telemetry.metrics import metrics_registry

pytestmark = [pytest.mark.slow, pytest.mark.workers]  # it starts Celery worker processes


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(respond=_greet_then_note) as fake:
        yield fake


def _user_text(request: RecordedRequest) -> str:
    return next(str(m.get("content")) for m in request.messages if m.get("role") == "user")


def _greet_then_note(request: RecordedRequest) -> Turn:
    """A session whose input starts with 'two turns' asks for a note, then answers; any other answers at once.
    Each answer takes 0.3 s: sessions on two workers overlap unless something keeps them apart."""
    text = _user_text(request)
    if text.startswith("two turns") and request.messages[-1].get("role") != "tool":
        return reply(tool_calls=[call("n1", "note", {"text": text})], delay_s=0.3)
    return reply(f"Hello, {text}.", delay_s=0.3)


def _start_workers(fleet: Fleet, server: FakeLLMServer, count: int, limits: dict[str, object]) -> None:
    env = {**fleet.env, "LOUSHO_TEST_LLM_URL": server.openai_base_url, "LOUSHO_TEST_LIMITS": json.dumps(limits)}
    for n in range(count):
        worker = start_worker(
            "tests.fleet.limits_app", queue=fleet.queue, name=f"w{n + 1}", env=env, cwd=ROOT, log_dir=fleet.log_dir
        )
        fleet.workers.append(worker)


def _usage(fleet: Fleet) -> tuple[list[LimitUsage], list[SlotUsage]]:
    registry = WorkerRegistry(fleet.store)
    return limits_usage(fleet.redis, fleet.store.keys, registry.entries(), registry.server_time_ms())


def _metrics(fleet: Fleet) -> dict[tuple[str, str], float]:
    """The limits' gauges a scrape of the store's metrics shows: (name, model or agent) -> value."""
    scraped = generate_latest(metrics_registry(fleet.store, multiprocess_dir=None)).decode()
    return {
        (sample.name, sample.labels.get("model") or sample.labels.get("agent", "")): sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if sample.name.startswith(("lousho_rate_limit_", "lousho_agent_sessions_"))
    }


def _fleet_page(fleet: Fleet) -> str:
    return TestClient(create_dashboard(fleet.store, client=fleet.client)).get("/fleet").text


def _eventually(what: str, check: Callable[[], bool], fleet: Fleet, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    logs = "\n".join(f"--- {w.name} ---\n{w.log()[-2500:]}" for w in fleet.workers)
    raise AssertionError(f"never saw {what} within {timeout_s}s\n{logs}")


def test_a_models_rate_limit_holds_across_two_worker_processes(fleet: Fleet, server: FakeLLMServer) -> None:
    # A window long enough that the 3 requests and the 2 waits always fall in it, however loaded the machine
    _start_workers(fleet, server, 2, {"rpm": 3, "window_s": 20.0})
    sessions = [fleet.client.enqueue("greeter", f"guest {n}", session_id=f"rate-{n}") for n in range(5)]

    def three_made_two_waiting() -> bool:
        [rate], _ = _usage(fleet)
        return rate.waiting == 2 and len(server.requests) == 3

    # Each worker holds one waiting turn: nothing more reaches the vendor until the window moves.
    _eventually("3 requests made and 2 sessions waiting on the limit", three_made_two_waiting, fleet)
    [rate], _ = _usage(fleet)
    assert (rate.model, rate.requests_per_minute, rate.requests) == ("gpt-limits-test", 3, 3)
    assert len(server.requests) == 3
    page = _fleet_page(fleet)
    row = page[page.index('class="rate-limits"') :]
    assert re.search(r"<td>gpt-limits-test</td><td>3 / 3</td>\s*<td>\d+ / no limit</td><td>20 s</td><td>2</td>", row), (
        row
    )
    metrics = _metrics(fleet)
    assert metrics[("lousho_rate_limit_requests", "gpt-limits-test")] == 3
    assert metrics[("lousho_rate_limit_requests_max", "gpt-limits-test")] == 3
    assert metrics[("lousho_rate_limit_waiting", "gpt-limits-test")] == 2
    assert len(server.requests) == 3

    fleet.wait_for(sessions)
    assert len(server.requests) == 5  # each turn asked once, the waiting ones after the window moved
    for n, session in enumerate(sessions):
        assert fleet.client.status(session).text == f"Hello, guest {n}."
    [rate], _ = _usage(fleet)
    assert rate.waiting == 0


def test_an_agents_sessions_in_flight_never_pass_its_maximum(fleet: Fleet, server: FakeLLMServer) -> None:
    _start_workers(fleet, server, 2, {"max_sessions": 1})
    sessions = [fleet.client.enqueue("greeter", f"two turns {n}", session_id=f"slot-{n}") for n in range(3)]

    def one_in_flight_others_waiting() -> bool:
        _, [slots] = _usage(fleet)
        return slots.in_flight == 1 and slots.waiting >= 1

    _eventually("a session in flight and another waiting for a slot", one_in_flight_others_waiting, fleet)
    fleet.wait_for(sessions)

    # From the vendor's side: a session's two turns (and its tool call between them) are never interleaved
    # with another session's, though two workers could run two sessions at once.
    order = [_user_text(request) for request in server.requests]
    assert len(order) == 6
    runs = [order[i] for i in range(len(order)) if i == 0 or order[i] != order[i - 1]]
    assert sorted(runs) == sorted(f"two turns {n}" for n in range(3)), order
    for n, session in enumerate(sessions):
        status = fleet.client.status(session)
        assert (status.status, status.text) == ("finished", f"Hello, two turns {n}.")
    assert fleet.redis.zcard(session_slots_key(fleet.store.keys, "greeter")) == 0  # every slot came back
    _, [slots] = _usage(fleet)
    assert (slots.agent, slots.max_sessions, slots.in_flight) == ("greeter", 1, 0)
    metrics = _metrics(fleet)
    assert metrics[("lousho_agent_sessions_in_flight_max", "greeter")] == 1
    assert metrics[("lousho_agent_sessions_in_flight", "greeter")] == 0
    page = _fleet_page(fleet)
    assert "<td>greeter</td><td>0 / 1</td>" in page[page.index('class="session-limits"') :]


def test_a_vendors_429_is_waited_out_and_the_same_call_made_again(fleet: Fleet) -> None:
    retry_after_s = 0.2
    charge = reply(tool_calls=[call("c1", "charge", {"amount": 5})])
    script: list[Turn | str] = [rate_limited(retry_after_s)] * 4 + [charge, "Charged."]
    with FakeLLMServer(script) as server:
        _start_workers(fleet, server, 1, {})
        session = fleet.client.enqueue("greeter", "charge me 5", session_id="busy-vendor")
        fleet.wait_for([session], status="awaiting-approval")

        assert len(server.requests) == 5  # four 429s, then the one request that was answered
        checkpoint = fleet.client.checkpoint(session)
        assert checkpoint is not None
        [asked] = checkpoint.messages[-1].tool_calls  # the saved turn is the 200's answer
        assert (asked.name, asked.arguments) == ("charge", {"amount": 5})
        # The task's start was counted once, as it took the lease; waiting out the 429s counted nothing more
        # (four of them: more than RetryPolicy.max_attempts, 3, yet the turn was not failed).
        assert fleet.redis.hget(FleetKeys(fleet.store).attempts(session), "turn:1") == b"1"

        [pending] = fleet.client.approvals(session)
        fleet.client.resolve_approval(pending.id, approved=True)
        fleet.wait_for([session])
        assert fleet.client.status(session).text == "Charged."
        assert len(server.requests) == 6
