"""The dashboard's defences (issue #31, finding 5): the headers every answer carries, a CSRF token signed with the
dashboard's secret (a cookie someone planted is not enough), flash messages the server signed (never `?note=`),
and `/metrics` behind the auth hook unless the operator opts out. The browser test (test_dashboard_browser.py)
shows the Content-Security-Policy leaves the dashboard's own scripts and styles working."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient

from lousho.dashboard import create_dashboard
from lousho.dashboard.security import CSRF_COOKIE, FLASH_COOKIE, SECRET_ENV, DashboardSecret
from lousho.operations import sync

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]

HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options")


def token_of(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found, "every form carries the CSRF token"
    return found.group(1)


def refuse_everyone() -> None:
    raise HTTPException(401, "nobody may look")


@pytest.mark.parametrize(
    "url", ["/", "/sessions/trip", "/approvals", "/rows", "/static/dashboard.css", "/sessions/nobody"]
)
def test_every_answer_carries_the_content_security_policy_and_the_framing_and_sniffing_headers(
    sqlite_store: Any, url: str
) -> None:
    answer = TestClient(create_dashboard(sqlite_store)).get(url)

    assert {h: answer.headers.get(h) is not None for h in HEADERS} == dict.fromkeys(HEADERS, True)
    policy = answer.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
    assert (answer.headers["X-Frame-Options"], answer.headers["X-Content-Type-Options"]) == ("DENY", "nosniff")


def test_a_refusal_by_the_auth_hook_carries_the_headers_too(sqlite_store: Any) -> None:
    answer = TestClient(create_dashboard(sqlite_store, auth=refuse_everyone)).get("/")

    assert answer.status_code == 401 and answer.headers["X-Frame-Options"] == "DENY"


def test_no_page_holds_inline_script_or_inline_event_handlers_the_policy_would_block(sqlite_store: Any) -> None:
    browser = TestClient(create_dashboard(sqlite_store))
    for url in ("/", "/sessions/trip", "/sessions/trip/history", "/approvals", "/compare"):
        page = browser.get(url).text
        assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", page) == [], url
        assert re.findall(r"\son[a-z]+=", page) == [] and " style=" not in page, url


def test_a_forged_csrf_cookie_with_a_matching_field_is_refused_and_changes_nothing(sqlite_store: Any) -> None:
    browser = TestClient(create_dashboard(sqlite_store))
    (approval,) = sync(sqlite_store.approvals.pending("pay"))
    forged = "a" * 43  # what an attacker who can set a cookie for the host sets, and posts in the field
    browser.cookies.set(CSRF_COOKIE, forged)

    answer = browser.post(f"/approvals/{approval.id}", data={"decision": "approve", "csrf_token": forged})

    assert answer.status_code == 403 and "not this dashboard's" in answer.text
    assert sync(sqlite_store.approvals.load(approval.id)).status == "pending"


def test_a_token_signed_with_another_secret_is_refused(sqlite_store: Any) -> None:
    browser = TestClient(create_dashboard(sqlite_store, secret="ours"))
    (approval,) = sync(sqlite_store.approvals.pending("pay"))
    theirs = str(DashboardSecret("theirs").csrf.dumps("nonce"))
    browser.cookies.set(CSRF_COOKIE, theirs)

    answer = browser.post(f"/approvals/{approval.id}", data={"decision": "approve", "csrf_token": theirs})

    assert answer.status_code == 403
    assert sync(sqlite_store.approvals.load(approval.id)).status == "pending"


def test_processes_given_the_same_secret_accept_each_others_tokens(
    sqlite_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "one secret for every process")
    first, second = TestClient(create_dashboard(sqlite_store)), TestClient(create_dashboard(sqlite_store))
    token = token_of(first.get("/approvals").text)
    (approval,) = sync(sqlite_store.approvals.pending("pay"))
    second.cookies.set(CSRF_COOKIE, token)

    answer = second.post(f"/approvals/{approval.id}", data={"decision": "approve", "csrf_token": token})

    assert answer.status_code == 200 and sync(sqlite_store.approvals.load(approval.id)).status == "approved"


def test_note_in_the_url_is_ignored_and_a_forged_flash_cookie_is_not_shown(sqlite_store: Any) -> None:
    browser = TestClient(create_dashboard(sqlite_store))

    for url in (
        "/approvals?note=Your+session+expired.+Log+in+at+evil.example",
        "/sessions/trip?note=evil.example",
        "/?note=evil.example",  # the sessions list too, where a delete's flash lands (issue #32)
    ):
        page = browser.get(url).text
        assert "evil.example" not in page and 'class="note"' not in page
    browser.cookies.set(FLASH_COOKIE, "Log in at evil.example")
    assert "evil.example" not in browser.get("/approvals").text


def test_what_a_post_did_is_shown_once_from_a_signed_flash_message(sqlite_store: Any) -> None:
    browser = TestClient(create_dashboard(sqlite_store))
    page = browser.get("/approvals").text
    (approval,) = sync(sqlite_store.approvals.pending("pay"))

    answer = browser.post(f"/approvals/{approval.id}", data={"decision": "approve", "csrf_token": token_of(page)},
                          follow_redirects=False)  # fmt: skip

    assert (
        answer.status_code == 303
        and "note" not in answer.headers["location"]
        and "approved" not in answer.headers["location"]
    )
    shown = browser.get(answer.headers["location"]).text
    assert re.search(rf'class="note"[^>]*>approved {approval.id}', shown)
    assert 'class="note"' not in browser.get("/approvals").text  # once


def test_metrics_are_refused_by_the_auth_hook_unless_the_operator_opts_out(sqlite_store: Any) -> None:
    pytest.importorskip("prometheus_client", reason="the metrics extra")  # installed by .[dev]: this runs in CI
    guarded = TestClient(create_dashboard(sqlite_store, auth=refuse_everyone))
    public = TestClient(create_dashboard(sqlite_store, auth=refuse_everyone, metrics_public=True))

    assert [guarded.get(url).status_code for url in ("/metrics", "/metrics/")] == [401, 401]
    scrape = public.get("/metrics")
    assert scrape.status_code == 200 and "lousho_sessions" in scrape.text


def test_the_observability_pages_auth_and_metrics_example_runs_as_shown() -> None:
    pytest.importorskip("prometheus_client", reason="the metrics extra")
    from tests.docs.walkthrough import python_blocks

    [example] = [block for block in python_blocks(ROOT / "docs" / "observability.md") if "metrics_public" in block]
    namespace: dict[str, Any] = {}
    exec(compile(example, "observability.md (dashboard)", "exec"), namespace)
    app, scraped = TestClient(namespace["app"]), TestClient(namespace["scraped"])

    assert (
        app.get("/ops/metrics").status_code == 401 and app.get("/ops/", headers={"x-user": "admin"}).status_code == 200
    )
    assert app.get("/ops/metrics", headers={"x-user": "admin"}).status_code == 200
    assert scraped.get("/metrics").status_code == 200 and scraped.get("/").status_code == 401
