"""The dashboard's pages over SQLite and a fleet's Redis, with FastAPI's TestClient (issue #19):
what each page shows, decisions and forks from forms, read-only mode, the auth hook, and CSRF refusal."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.testclient import TestClient

import lousho
from lousho.checkpoint import Checkpoint
from lousho.dashboard import create_dashboard, dashboard_router
from lousho.dashboard.views import PAGE_ROWS
from lousho.errors import ConfigurationError
from lousho.fleet.protocol import speaks
from lousho.fleet.registry import WorkerRegistry
from lousho.formats import MESSAGE_PROTOCOL, written_formats
from lousho.operations import age_text, sync
from lousho.scheduler.client import Client
from lousho.stores.redis import RedisStore
from lousho.stores.sql import SqliteStore
from lousho.worker import FleetSettings, broker_url
from tests.dashboard.conftest import fill

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["sqlite", "redis"])
def dashboard(request: pytest.FixtureRequest) -> tuple[Any, Any, TestClient]:
    """(store, fleet client or None, browser-like TestClient) over each store kind."""
    if request.param == "sqlite":
        store, client = request.getfixturevalue("sqlite_store"), None
    else:
        store, client = request.getfixturevalue("fleet_store")
    return store, client, TestClient(create_dashboard(store, client=client))


def token_of(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found, "every form carries the CSRF token"
    return found.group(1)


def test_the_sessions_page_lists_filters_and_searches_sessions(dashboard: tuple[Any, Any, TestClient]) -> None:
    _, _, browser = dashboard
    page = browser.get("/").text
    assert 'data-session="trip"' in page and 'data-session="pay"' in page
    finished = browser.get("/", params={"status": "finished"}).text
    assert 'data-session="trip"' in finished and 'data-session="pay"' not in finished
    assert 'data-session="pay"' in browser.get("/rows", params={"q": "pa"}).text
    assert 'data-session="trip"' not in browser.get("/rows", params={"q": "pa"}).text
    assert browser.get("/", params={"status": "bogus"}).status_code == 400


def test_the_session_page_shows_each_call_beside_its_result_usage_and_fingerprint(
    dashboard: tuple[Any, Any, TestClient],
) -> None:
    store, _, browser = dashboard
    page = browser.get("/sessions/trip").text
    call = page[page.index('id="call-call_weather"') :]
    assert call.index("weather") < call.index("&#34;forecast&#34;: &#34;sun&#34;") < call.index("</div>\n      </div>")
    checkpoint = sync(store.checkpoints.load("trip"))
    assert f"{checkpoint.usage.total_tokens} tokens" in page
    assert checkpoint.fingerprint.digest in page
    assert browser.get("/sessions/nobody").status_code == 404


def test_approving_from_the_page_records_the_decision_with_its_note(dashboard: tuple[Any, Any, TestClient]) -> None:
    store, client, browser = dashboard
    page = browser.get("/approvals").text
    (approval,) = sync(store.approvals.pending("pay"))
    assert approval.id in page and "charge_card" in page
    answer = browser.post(
        f"/approvals/{approval.id}", data={"csrf_token": token_of(page), "decision": "approve", "note": "ok by ops"}
    )
    assert answer.status_code == 200 and f"approved {approval.id}" in answer.text
    decided = sync(store.approvals.load(approval.id))
    assert (decided.status, decided.note) == ("approved", "ok by ops")
    if client is not None:  # on a fleet the decision woke the run, as `lousho approve` does
        assert client.store.client.llen(client.settings.queue) == 1


def test_forking_from_the_history_page_patches_the_result_and_compare_shows_where(
    dashboard: tuple[Any, Any, TestClient],
) -> None:
    store, _, browser = dashboard
    page = browser.get("/sessions/trip/history").text
    save = sync(store.checkpoints.history("trip"))[-2].checkpoint.version  # the save with the weather result
    form = {"csrf_token": token_of(page), "save": str(save), "tool_call_id": "call_weather"}
    answer = browser.post("/sessions/trip/fork", data={**form, "tool_result": '{"forecast": "snow"}'})
    assert answer.status_code == 200 and "forked trip" in answer.text
    assert 'href="http://testserver/compare?a=trip&amp;b=trip.fork-1"' in answer.text  # the fork's page links it
    forked = sync(store.checkpoints.load("trip.fork-1"))
    assert forked.messages[-1].result() == {"forecast": "snow"}
    assert sync(store.checkpoints.load("trip")).messages[3].result() == {"city": "Oslo", "forecast": "sun"}
    compared = browser.get("/compare", params={"a": "trip", "b": "trip.fork-1"}).text
    assert "first divergence at step 1" in compared and 'id="first-divergence"' in compared
    bad = browser.post("/sessions/trip/fork", data={**form, "tool_result": "{not json"})
    assert bad.status_code == 400 and "not JSON" in bad.text
    assert sync(store.checkpoints.load("trip.fork-2")) is None


def test_a_cross_site_post_is_refused_and_changes_nothing(sqlite_store: Any) -> None:
    browser = TestClient(create_dashboard(sqlite_store))
    page = browser.get("/approvals").text
    (approval,) = sync(sqlite_store.approvals.pending("pay"))
    url, form = f"/approvals/{approval.id}", {"decision": "approve", "csrf_token": token_of(page)}
    assert browser.post(url, data={**form, "csrf_token": "forged" * 8}).status_code == 403
    assert browser.post(url, data=form, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert browser.post(url, data=form, headers={"Origin": "https://evil.example"}).status_code == 403
    assert TestClient(browser.app).post(url, data=form).status_code == 403  # no cookie: another browser
    assert sync(sqlite_store.approvals.load(approval.id)).status == "pending"
    behind_a_proxy = {"Origin": "https://ops.example", "X-Forwarded-Host": "ops.example"}
    assert browser.post(url, data=form, headers=behind_a_proxy).status_code == 200


def test_read_only_mode_refuses_every_post_with_403(sqlite_store: Any) -> None:
    browser = TestClient(create_dashboard(sqlite_store, read_only=True))
    page = browser.get("/approvals").text
    assert "read-only" in page and "csrf_token" not in page  # no forms to fill
    (approval,) = sync(sqlite_store.approvals.pending("pay"))
    token = browser.get("/sessions/pay").cookies.get("lousho_csrf") or browser.cookies.get("lousho_csrf")
    answer = browser.post(f"/approvals/{approval.id}", data={"decision": "approve", "csrf_token": token})
    assert answer.status_code == 403
    assert browser.post("/sessions/trip/fork", data={"save": "1", "csrf_token": token}).status_code == 403
    assert sync(sqlite_store.approvals.load(approval.id)).status == "pending"


def test_the_auth_dependency_guards_every_route_of_a_mounted_router(sqlite_store: Any) -> None:
    def require_admin(request: Request) -> None:
        if request.headers.get("x-user") != "admin":
            raise HTTPException(401, "who are you?")

    app = FastAPI()
    app.include_router(dashboard_router(sqlite_store, auth=require_admin), prefix="/ops")
    browser = TestClient(app)
    for url in ("/ops/", "/ops/sessions/trip", "/ops/approvals", "/ops/fleet", "/ops/static/dashboard.css"):
        assert browser.get(url).status_code == 401
    page = browser.get("/ops/sessions/trip", headers={"x-user": "admin"})
    assert page.status_code == 200 and 'href="http://testserver/ops/sessions/trip/history"' in page.text


def test_a_dashboard_mounted_as_a_sub_app_links_under_its_mount(sqlite_store: Any) -> None:
    app = FastAPI()
    app.mount("/dash", create_dashboard(sqlite_store))
    page = TestClient(app).get("/dash/").text
    assert 'href="http://testserver/dash/sessions/trip"' in page


def test_the_fleet_page_shows_queues_in_flight_and_parked_sessions(fleet_store: tuple[Any, Any]) -> None:
    store, client = fleet_store
    client.enqueue("planner", "hello", session_id="queued", require_worker=False)
    store.client.hset(store.keys.parked, "trip", "LOUSHO_POISON: killed its worker 3 times")
    browser = TestClient(create_dashboard(store, client=client))
    page = browser.get("/fleet").text
    queue = page[page.index('class="queues"') :]
    assert re.search(rf"<td>{client.settings.queue}</td><td>1</td>", queue)
    assert 'href="http://testserver/sessions/queued"' in page[page.index('class="inflight"') :]
    assert "killed its worker 3 times" in page[page.index('class="parked"') :]
    assert "parked: LOUSHO_POISON" in browser.get("/", params={"status": "parked"}).text
    assert 'data-session="trip"' not in browser.get("/", params={"status": "finished"}).text  # shown as parked


def test_a_fleet_store_without_a_client_is_refused_unless_read_only(fleet_store: tuple[Any, Any]) -> None:
    store, _ = fleet_store
    with pytest.raises(ConfigurationError, match="client="):
        create_dashboard(store)
    assert TestClient(create_dashboard(store, read_only=True)).get("/fleet").status_code == 200


def test_an_interrupted_call_approval_shows_its_kind_and_records_the_typed_result(
    dashboard: tuple[Any, Any, TestClient],
) -> None:
    store, _, browser = dashboard
    (approval,) = sync(store.approvals.pending("pay"))
    sync(store.approvals.save(approval.model_copy(update={"kind": "interrupted"})))
    page = browser.get("/approvals").text
    row = page[page.index(f'data-approval="{approval.id}"') :]
    assert "<td>interrupted</td>" in row and 'name="action"' in row
    form = {"csrf_token": token_of(page), "decision": "approve", "note": "it ran", "action": "record"}
    bad = browser.post(f"/approvals/{approval.id}", data={**form, "result": "{not json"})
    assert bad.status_code == 400 and sync(store.approvals.load(approval.id)).status == "pending"
    answer = browser.post(f"/approvals/{approval.id}", data={**form, "result": '{"charged": 40}'})
    assert answer.status_code == 200 and "approved (record)" in answer.text
    decided = sync(store.approvals.load(approval.id))
    assert (decided.action, decided.result, decided.note) == ("record", {"charged": 40}, "it ran")


@pytest.mark.parametrize(
    ("page", "shown"),
    [
        ("/", 'data-session="pay"'),
        ("/sessions/trip", "Pack sunscreen."),
        ("/sessions/trip/history", 'name="save"'),
        ("/approvals", "charge_card"),
        ("/compare?a=trip&b=pay", "first divergence at step 1"),
    ],
)
def test_every_page_renders_over_every_built_in_store(any_store: Any, page: str, shown: str) -> None:
    asyncio.run(fill(any_store))
    client = None
    if isinstance(any_store, RedisStore):
        client = Client(broker=broker_url("redis://127.0.0.1:1/0"), store=any_store, settings=FleetSettings())
    answer = TestClient(create_dashboard(any_store, client=client)).get(page)
    assert answer.status_code == 200 and shown in answer.text


def test_sub_agent_sessions_are_linked_both_ways_and_a_changed_fingerprint_shows_as_drift(sqlite_store: Any) -> None:
    trip = sync(sqlite_store.checkpoints.load("trip"))
    child = trip.model_copy(update={"session_id": "trip.sub-call_weather", "parent_session_id": "trip", "version": 1})
    sync(sqlite_store.checkpoints.save("trip.sub-call_weather", child))
    changed = trip.fingerprint.model_copy(update={"model": "other-model", "digest": "0" * 16})
    sync(
        sqlite_store.checkpoints.save(
            "trip", trip.model_copy(update={"fingerprint": changed, "version": trip.version + 1})
        )
    )
    browser = TestClient(create_dashboard(sqlite_store))
    parent = browser.get("/sessions/trip").text
    call = parent[parent.index('id="call-call_weather"') :]
    assert 'href="http://testserver/sessions/trip.sub-call_weather">sub-agent session' in call
    assert '<span class="drift">model &#39;test-model&#39; -&gt; &#39;other-model&#39;</span>' in parent
    assert (
        'sub-agent of <a href="http://testserver/sessions/trip">' in browser.get("/sessions/trip.sub-call_weather").text
    )


def test_a_fork_from_the_form_can_rewrite_a_message_and_a_bad_index_changes_nothing(sqlite_store: Any) -> None:
    browser = TestClient(create_dashboard(sqlite_store))
    page = browser.get("/sessions/trip/history").text
    first = sync(sqlite_store.checkpoints.history("trip"))[-1].checkpoint.version  # the oldest save: input only
    form = {"csrf_token": token_of(page), "save": str(first), "message_index": "1"}
    answer = browser.post("/sessions/trip/fork", data={**form, "message_content": "Plan my trip to Bergen"})
    assert answer.status_code == 200
    forked = sync(sqlite_store.checkpoints.load("trip.fork-1"))
    assert forked.messages[1].content == "Plan my trip to Bergen"
    assert sync(sqlite_store.checkpoints.load("trip")).messages[1].content == "Plan my trip"
    bad = browser.post("/sessions/trip/fork", data={**form, "message_index": "0", "message_content": "x"})
    assert bad.status_code == 400 and "not a user or assistant message" in bad.text
    assert sync(sqlite_store.checkpoints.load("trip.fork-2")) is None


def test_the_sessions_list_is_paged_and_the_live_rows_follow_the_page(sqlite_store: Any) -> None:
    for n in range(PAGE_ROWS + 3):
        sync(sqlite_store.checkpoints.save(f"bulk-{n:04}", Checkpoint(session_id=f"bulk-{n:04}", version=1)))
    browser = TestClient(create_dashboard(sqlite_store))
    first = browser.get("/", params={"q": "bulk-"}).text
    assert first.count('data-session="bulk-') == PAGE_ROWS and f"of {PAGE_ROWS + 3}" in first
    assert 'id="next-page"' in first
    # newest save first (issue #32): the last one saved heads the first page, the first ones end the last
    assert first.index('data-session="bulk-0102"') < first.index('data-session="bulk-0101"')
    rest = browser.get("/rows", params={"q": "bulk-", "start": PAGE_ROWS})
    assert rest.text.count('data-session="bulk-') == 3 and 'data-session="bulk-0000"' in rest.text
    assert rest.headers["X-Lousho-Shown"] == f"{PAGE_ROWS + 1}-{PAGE_ROWS + 3} of {PAGE_ROWS + 3}"


def test_what_a_run_wrote_is_shown_as_text_never_as_markup(sqlite_store: Any) -> None:
    trip = sync(sqlite_store.checkpoints.load("trip"))
    hostile = trip.messages[-1].model_copy(update={"content": "<script>alert('x')</script>"})
    sync(
        sqlite_store.checkpoints.save(
            "trip", trip.model_copy(update={"messages": [*trip.messages[:-1], hostile], "version": trip.version + 1})
        )
    )
    browser = TestClient(create_dashboard(sqlite_store))
    assert "<script>alert" not in browser.get("/").text  # the list shows no message (it opens no payload)
    for url in ("/sessions/trip", "/compare?a=trip&b=pay"):
        page = browser.get(url).text
        assert "<script>alert" not in page and "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page


def test_a_running_sessions_page_follows_its_saves_and_a_finished_one_does_not(
    dashboard: tuple[Any, Any, TestClient],
) -> None:
    store, _, browser = dashboard
    assert "data-follow" in browser.get("/sessions/pay").text  # awaiting approval: it may move
    assert "data-follow" not in browser.get("/sessions/trip").text
    pay = sync(store.checkpoints.load("pay"))
    assert browser.get("/sessions/pay/version").json() == {"version": pay.version, "status": "awaiting-approval"}
    assert browser.get("/sessions/nobody/version").status_code == 404


def test_the_dashboard_serves_the_stores_metrics_at_slash_metrics_unless_told_not_to(sqlite_store: Any) -> None:
    pytest.importorskip("prometheus_client", reason="the metrics extra (prometheus_client) is not installed")
    scrape = TestClient(create_dashboard(sqlite_store)).get("/metrics").text
    assert 'lousho_sessions{status="finished"} 1.0' in scrape and "lousho_approvals_waiting 1.0" in scrape
    assert TestClient(create_dashboard(sqlite_store, metrics=False)).get("/metrics").status_code == 404


def test_an_approvals_wait_is_shown_as_an_age() -> None:
    now = datetime(2026, 1, 2, 12, 0, 0, tzinfo=UTC)
    assert age_text("2026-01-02T11:59:18+00:00", now) == "42 s"
    assert age_text("2026-01-02T11:55:00+00:00", now) == "5 min"
    assert age_text("2026-01-02T09:00:00", now) == "3 h"  # naive: UTC
    assert age_text("2025-12-31T12:00:00+00:00", now) == "2 d"
    assert age_text("not a time", now) == "?"


def test_the_fleet_page_names_a_session_leases_holder_by_pid_and_host(fleet_store: tuple[Any, Any]) -> None:
    store, client = fleet_store
    client.enqueue("planner", "hello", session_id="leased", require_worker=False)
    store.client.set(store.keys.session_key("leased", "lease"), "web-7|4242-0123456789abcdef", px=30_000)
    page = TestClient(create_dashboard(store, client=client)).get("/fleet").text
    row = page[page.index('href="http://testserver/sessions/leased"') :]
    assert "<td>pid 4242 on web-7</td>" in row[: row.index("</tr>")]


def test_the_fleet_page_shows_the_lousho_and_protocols_of_each_worker_of_a_rolling_upgrade(
    fleet_store: tuple[Any, Any],
) -> None:
    """Mid-upgrade, two releases serve one queue (issue #35): a 0.1.0 worker's entry states no version."""
    store, client = fleet_store
    registry = WorkerRegistry(store)
    live = {"queues": [client.settings.queue], "agents": ["planner"], "expires_ms": registry.server_time_ms() + 60_000}
    store.client.hset(registry.key_of("old|1"), "old|1", json.dumps(live))  # as 0.1.0 publishes it
    store.client.hset(registry.key_of("new|2"), "new|2", json.dumps({**live, **speaks()}))  # as this code does
    page = TestClient(create_dashboard(store, client=client)).get("/fleet").text
    workers = page[page.index('class="workers"') : page.index('class="queues"')]
    assert '<td class="muted">old|1</td>' in workers and "0.1.0 (unstated); messages 1</td>" in workers
    formats = ", ".join(f"{name} {number}" for name, number in written_formats().items())
    protocols = "1" if MESSAGE_PROTOCOL == 1 else f"1-{MESSAGE_PROTOCOL}"
    assert f"{lousho.__version__}; messages {protocols}; {formats}</td>" in workers


# issue #32: the operations layer's items, as the pages show them


def test_the_approvals_page_shows_a_sub_agents_inner_call_as_the_command_does(tmp_path: Path) -> None:
    from tests.ops.test_operations import sub_agent_pause

    store = SqliteStore(tmp_path / "jobs.db")
    sub_agent_pause(store)
    page = TestClient(create_dashboard(store)).get("/approvals").text
    row = page[page.index("data-approval=") :]
    row = row[: row.index("</tr>")]
    assert "<b>charge</b>" in row and "&#34;amount&#34;: 5" in row.replace('"', "&#34;")  # the call that waits
    assert "sub-agent of" in row and "trip.sub-h1" in row
    assert "<b>helper</b>" not in row  # not the parent's call
    store.close()


def test_the_approvals_rows_are_live_and_the_navigation_counts_the_pending(
    dashboard: tuple[Any, Any, TestClient],
) -> None:
    store, client, browser = dashboard
    page = browser.get("/").text
    assert re.search(r'id="pending-count"[^>]*>1</span>', page), page[:2000]
    assert 'data-rows-url="http://testserver/approvals/rows"' in browser.get("/approvals").text
    rows = browser.get("/approvals/rows")
    assert rows.headers["X-Lousho-Pending"] == "1" and "charge_card" in rows.text
    assert browser.get("/approvals/count").json() == {"pending": 1}

    [pending] = sync(store.approvals.pending(None))
    if client is not None:
        client.resolve_approval(pending.id, approved=True)
    else:
        from lousho.approvals import ApprovalDecision, decide

        sync(decide(store.approvals, ApprovalDecision(id=pending.id, approved=True)))
    assert browser.get("/approvals/count").json() == {"pending": 0}  # decided elsewhere: the page follows
    assert "no approval is pending" in browser.get("/approvals/rows").text


def test_a_fork_with_its_own_name_links_back_to_its_source(sqlite_store: Any) -> None:
    from lousho.operations import ForkRequest, Target, fork

    fork(Target(sqlite_store), ForkRequest(session_id="trip", from_step=1, new_session_id="trip-porto"))
    page = TestClient(create_dashboard(sqlite_store)).get("/sessions/trip-porto").text
    assert 'href="http://testserver/sessions/trip"' in page[page.index("forked from") :]
    assert "compare-with-source" in page


def test_the_fleet_page_drops_calls_of_a_dead_process_or_a_session_that_moved_on(
    fleet_store: tuple[Any, Any], redis_url: str
) -> None:
    import os

    import redis

    from lousho.fleet.liveness import HOST, connection_name
    from lousho.operations import Target, fleet_status

    store, client = fleet_store
    worker = redis.Redis.from_url(redis_url)  # a live worker process: its connection named as a worker's is
    worker.client_setname(connection_name(HOST, os.getpid()))
    now_ms = int(store.client.time()[0]) * 1000
    for session in ("s-live", "s-dead"):
        store.client.zadd(store.keys.inflight_of(session), {session: now_ms + 60_000})
    store.client.zadd(store.keys.running, {
        f"{HOST}|{os.getpid()}|s-live|1:call_a": now_ms,   # running
        f"{HOST}|999999|s-dead|1:call_b": now_ms,          # its process is gone (SIGKILLed)
        f"{HOST}|{os.getpid()}|s-done|1:call_c": now_ms,   # its session moved on (not in flight)
    })  # fmt: skip
    try:
        running = fleet_status(Target(store, client))
        assert running is not None and [(r.session_id, r.call) for r in running.running] == [("s-live", "1:call_a")]
        page = TestClient(create_dashboard(store, client=client)).get("/fleet").text
        assert "call_a" in page and "call_b" not in page and "call_c" not in page
    finally:
        worker.close()


def test_the_fleet_page_names_each_worker_by_its_node_name(fleet_store: tuple[Any, Any]) -> None:
    store, client = fleet_store
    registry = WorkerRegistry(store)
    expires = registry.server_time_ms() + 60_000
    for worker_id, name in (("web-7|11", "q-11@web-7"), ("web-7|12", "q-12@web-7")):
        entry = {"queues": ["q"], "agents": ["planner"], "expires_ms": expires, "name": name}
        store.client.hset(registry.key_of(worker_id), worker_id, json.dumps(entry))
    page = TestClient(create_dashboard(store, client=client)).get("/fleet").text
    workers = page[page.index('class="workers"') : page.index("</table>", page.index('class="workers"'))]
    assert "<td>q-11@web-7</td>" in workers and "<td>q-12@web-7</td>" in workers


def test_two_worker_commands_get_two_node_names() -> None:
    from lousho.cli.fleet import default_node_name

    first = default_node_name(None, "lousho.demo.fleet_app:app", 101)
    second = default_node_name(None, "lousho.demo.fleet_app:app", 102)
    assert first == "fleet_app-101@%h" and second == "fleet_app-102@%h"
    assert default_node_name("lousho:queue:booker", "app:app", 7) == "lousho-queue-booker-7@%h"


def test_a_session_is_deleted_from_its_page_only_once_confirmed(dashboard: tuple[Any, Any, TestClient]) -> None:
    store, _, browser = dashboard
    page = browser.get("/sessions/trip").text
    token = token_of(page)
    unconfirmed = browser.post("/sessions/trip/delete", data={"csrf_token": token})
    assert unconfirmed.status_code == 400 and sync(store.checkpoints.load("trip")) is not None
    done = browser.post("/sessions/trip/delete", data={"csrf_token": token, "confirm": "on"}, follow_redirects=True)
    assert done.status_code == 200 and "deleted trip" in done.text
    assert sync(store.checkpoints.load("trip")) is None
    missing = browser.get("/sessions/trip")
    assert missing.status_code == 404 and "No session &#39;trip&#39; in this store" in missing.text
    assert "Store(" not in missing.text  # no store repr on the page


def test_the_compare_page_shows_the_steps_once_and_then_what_drifted(sqlite_store: Any) -> None:
    from lousho.operations import ForkRequest, Target, fork

    fork(Target(sqlite_store), ForkRequest(session_id="trip", from_step=1, new_session_id="trip-b",
                                           tool_results=[{"tool_call_id": "call_weather", "result": {"sky": "rain"}}]))  # fmt: skip
    page = TestClient(create_dashboard(sqlite_store)).get("/compare", params={"a": "trip", "b": "trip-b"}).text
    assert page.count('class="compare"') == 1 and "* step 1" not in page  # the step table, not a second diff
    assert "<h2>Drift</h2>" in page
    history = TestClient(create_dashboard(sqlite_store)).get("/sessions/trip/history").text
    assert re.search(r">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC<", history) and not re.search(
        r">[^<]*T\d\d:\d\d:\d\d\.\d+", history
    )


def _age_in_sqlite(path: Path, session_id: str, hours: int) -> None:
    """As if `session_id` was last saved `hours` ago: the head's time, which listings and prune read."""
    import sqlite3
    from datetime import timedelta

    then = (datetime.now(UTC) - timedelta(hours=hours)).replace(tzinfo=None).isoformat(sep=" ")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE lousho_checkpoints SET updated_at = ? WHERE session_id = ?", (then, session_id))


def test_the_sessions_page_shows_each_sessions_age_newest_first(sqlite_store: Any, tmp_path: Path) -> None:
    """Issue #32: an age column, sessions sorted newest first (they were sorted by id, with no age)."""
    for session_id in ("aa-old", "zz-new"):
        sync(sqlite_store.checkpoints.save(session_id, Checkpoint(session_id=session_id, version=1)))
    _age_in_sqlite(tmp_path / "dash.db", "aa-old", 3)
    page = TestClient(create_dashboard(sqlite_store)).get("/").text
    assert "<th>saved</th>" in page
    assert page.index('data-session="zz-new"') < page.index('data-session="aa-old"')
    old_row = page[page.index('data-session="aa-old"') :].split("</tr>")[0]
    assert "3 h ago" in old_row


def test_sessions_are_pruned_from_the_sessions_page_after_a_confirmation_step(
    sqlite_store: Any, tmp_path: Path
) -> None:
    """`lousho prune` on the dashboard (issue #32): the form shows what it would delete, then deletes it once its
    box is ticked, through `lousho.operations.prune_sessions`."""
    for session_id in ("stuck", "fresh"):
        sync(sqlite_store.checkpoints.save(session_id, Checkpoint(session_id=session_id, version=1)))
    _age_in_sqlite(tmp_path / "dash.db", "stuck", 2)
    browser = TestClient(create_dashboard(sqlite_store))
    page = browser.get("/").text
    assert 'id="prune"' in page
    form = {"csrf_token": token_of(page), "status": "in-progress", "older_than": "1h"}

    preview = browser.post("/prune", data=form)
    assert preview.status_code == 200
    candidates = preview.text.split('id="prune-candidates"')[1].split("</ul>")[0]
    assert ">stuck<" in candidates and "fresh" not in candidates
    assert sync(sqlite_store.checkpoints.load("stuck")) is not None  # a preview deletes nothing

    done = browser.post("/prune", data={**form, "confirm": "on"}, follow_redirects=True)
    assert done.status_code == 200 and "pruned 1 session(s): stuck" in done.text
    assert sync(sqlite_store.checkpoints.load("stuck")) is None
    assert sync(sqlite_store.checkpoints.load("fresh")) is not None

    bad = browser.post("/prune", data={**form, "older_than": "soon"})
    assert bad.status_code == 400 and "30s, 15m, 12h, 7d or 2w" in bad.text
    read_only = TestClient(create_dashboard(sqlite_store, read_only=True))
    assert 'id="prune"' not in read_only.get("/").text
    assert read_only.post("/prune", data={**form, "confirm": "on"}).status_code == 403


def test_a_live_tables_poll_leaves_the_flash_message_for_the_page(dashboard: tuple[Any, Any, TestClient]) -> None:
    """Issue #32: the sessions and approvals tables poll their rows every 2 s; a poll that lands between a POST's
    redirect and the page used to take the flash message, and the page then showed none. Only a full page
    takes it, once."""
    _, _, browser = dashboard
    token = token_of(browser.get("/sessions/trip").text)
    deleted = browser.post("/sessions/trip/delete", data={"csrf_token": token, "confirm": "on"}, follow_redirects=False)
    assert deleted.status_code == 303
    for poll in ("/rows", "/approvals/rows"):
        answer = browser.get(poll)
        assert answer.status_code == 200 and "deleted trip" not in answer.text
        assert "lousho_flash" not in answer.headers.get("set-cookie", "")  # left for the page
    page = browser.get("/").text
    assert "deleted trip" in page
    assert "deleted trip" not in browser.get("/").text  # shown once


@pytest.mark.workers  # a real worker runs the session the pages are asked to delete
def test_the_prune_page_keeps_a_live_session_and_its_delete_asks_a_second_confirmation(fleet: Any) -> None:
    """A session whose tool call runs: the prune page lists it as kept and why, and deletes nothing; its delete
    button answers with a second confirmation (the `force` box), which aborts the run and then deletes it."""
    from tests.fixtures.live_sessions import session_keys_left, start_gated_run

    target = start_gated_run(fleet, "busy", "g1")
    browser = TestClient(create_dashboard(target.bundle, client=fleet.client))
    form = {"csrf_token": token_of(browser.get("/").text), "status": "in-progress", "older_than": "0s"}

    preview = browser.post("/prune", data=form)
    kept = preview.text.split('id="prune-kept"')[1].split("</ul>")[0]
    assert ">busy<" in kept and "tool calls" in kept and "tool-call-running" in kept
    assert 'id="prune-candidates"' not in preview.text
    done = browser.post("/prune", data={**form, "confirm": "on"}, follow_redirects=True)
    assert "pruned 0 session(s): none; kept 1 live: busy" in done.text
    assert fleet.store.checkpoints.load("busy") is not None

    token = token_of(browser.get("/sessions/busy").text)
    asked = browser.post("/sessions/busy/delete", data={"csrf_token": token, "confirm": "on"})
    assert asked.status_code == 409 and 'id="delete-force"' in asked.text and "tool calls" in asked.text
    assert fleet.store.checkpoints.load("busy") is not None  # nothing deleted before the second confirmation
    forced = browser.post(
        "/sessions/busy/delete", data={"csrf_token": token_of(asked.text), "confirm": "on", "force": "on"},
        follow_redirects=True,
    )  # fmt: skip
    assert forced.status_code == 200 and "deleted busy (its run aborted first)" in forced.text
    assert session_keys_left(fleet.store, "busy") == []
