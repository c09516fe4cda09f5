"""Passwords in configuration URLs never show (issue #21): not in the `lousho` command's errors, the worker's
start, `repr()` of the settings, the environment they hand to a child, nor any error the library raises;
the host always does, so a reader can still tell which URL is meant. CLI runs are real subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from lousho.demo import fleet_view
from lousho.demo.fleet import FleetDemo
from lousho.errors import ConfigurationError, SDKError, StoreUnavailableError
from lousho.redaction import redact_url
from lousho.scheduler import Client
from lousho.settings import LoushoSettings, store_from_url
from lousho.stores.redis import RedisStore
from lousho.stores.sql import SqlStore
from lousho.testing.redis_server import RedisServer
from lousho.worker import FleetSettings, broker_url
from tests.ops.conftest import LOUSHO, ROOT, run_clean

SECRET = "s3cr3t-PW-9f"


@pytest.fixture
def password_redis() -> Iterator[str]:
    """The socket of a private redis-server that requires SECRET (set once it answers: its start probe has none)."""
    with RedisServer() as server:
        server.client().config_set("requirepass", SECRET)
        yield server.socket_path


def clean_env(**values: str) -> dict[str, str]:
    """This environment without any LOUSHO_ setting or REDIS_URL of the caller's, plus `values`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"}
    return {**env, **values}


def assert_hidden(text: str, *visible: str) -> None:
    assert SECRET not in text, text
    for fragment in visible:
        assert fragment in text, (fragment, text)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{SECRET}@cache.example:6379/0", "redis://:***@cache.example:6379/0"),
        (f"rediss://default:{SECRET}@cache.example:6380/2?ssl_cert_reqs=none", "rediss://default:***@cache.example:6380/2?ssl_cert_reqs=none"),
        (f"unix://:{SECRET}@/run/redis.sock?db=3", "unix://:***@/run/redis.sock?db=3"),
        (f"unix:///run/redis.sock?db=3&password={SECRET}", "unix:///run/redis.sock?db=3&password=***"),
        (f"postgresql+psycopg://app:{SECRET}@db.example:5432/runs", "postgresql+psycopg://app:***@db.example:5432/runs"),
        (f"postgresql://app@db.example/runs?sslpassword={SECRET}&sslmode=require", "postgresql://app@db.example/runs?sslpassword=***&sslmode=require"),
        (f"mysql://app:p@ss-{SECRET}@db.example/runs", "mysql://app:***@db.example/runs"),  # an unescaped @ in it
        (f"redis://:{SECRET}/0@cache.example/0", "redis://:***@cache.example/0"),
        (f"redis://:{SECRET}@[::1]:6379/0", "redis://:***@[::1]:6379/0"),
        (f"not a url u:{SECRET}@cache.example", "not a url u:***@cache.example"),
        ("sqlite:///data/a@b.db", "sqlite:///data/a@b.db"),
        ("redis://cache.example:6379/0", "redis://cache.example:6379/0"),
        ("redis://:@cache.example", "redis://:@cache.example"),
    ],
)  # fmt: skip
def test_redact_url_masks_every_password_and_keeps_what_tells_urls_apart(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.slow  # 2-7 s: out of `scripts/check --fast` (issue #33)
def test_no_error_of_the_command_shows_a_password(password_redis: str) -> None:
    wrong = f"unix://:wrong-{SECRET}@{password_redis}?db=0"
    cases: list[tuple[list[str], dict[str, str], str]] = [
        (["--store-url", f"mysql://u:{SECRET}@db.example/app"], {}, "mysql://u:***@db.example/app"),
        (["--store-url", f"garbage u:{SECRET}@db.example"], {}, "@db.example"),
        ([], {"LOUSHO_STORE_URL": f"mysql://u:{SECRET}@db.example/app"}, "mysql://u:***@db.example/app"),
        (["--store-url", f"postgresql://u:{SECRET}@127.0.0.1:1/app?sslpassword={SECRET}"], {}, "127.0.0.1:1/app"),
        (["--store-url", f"postgresql://u:{SECRET}@nohost.invalid/app"], {}, "nohost.invalid"),
        (["--redis-url", f"redis://:{SECRET}@127.0.0.1:1/0"], {}, "127.0.0.1:1"),
        (["--redis-url", f"redis://:{SECRET}/0@127.0.0.1/0"], {}, "redis://:***@127.0.0.1/0"),
        (["--redis-url", wrong], {}, password_redis),
        ([], {"LOUSHO_REDIS_URL": wrong}, password_redis),
        ([], {"REDIS_URL": wrong}, password_redis),
    ]
    for flags, env, shown in cases:
        result = run_clean([LOUSHO, *flags, "sessions"], env=clean_env(**env), timeout_s=60)
        assert result.returncode == 1, (flags, env, result.stdout, result.stderr)
        assert result.stderr.startswith("error: [LOUSHO_") and "Traceback" not in result.stderr, result.stderr
        assert_hidden(result.stdout + result.stderr, shown)


@pytest.mark.workers
def test_the_worker_command_never_shows_the_password(password_redis: str, tmp_path: Path) -> None:
    url = f"unix://:{SECRET}@{password_redis}?db=0"
    refused = run_clean(
        [LOUSHO, "worker", "--app", "lousho.demo.fleet_app:app"],
        env=clean_env(LOUSHO_REDIS_URL=url, LOUSHO_STORE_URL=f"postgresql://u:{SECRET}@db.example/app"),
        cwd=ROOT,
        timeout_s=60,
    )
    assert refused.returncode == 1
    assert_hidden(refused.stdout + refused.stderr, "LOUSHO_CONFIGURATION", "postgresql://u:***@db.example/app")

    log = tmp_path / "worker.log"
    queue = f"redaction-{uuid.uuid4().hex[:8]}"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [LOUSHO, "worker", "--app", "lousho.demo.fleet_app:app", "-P", "solo", "-Q", queue, "-n", f"{queue}@%h"],
            env=clean_env(LOUSHO_REDIS_URL=url, LOUSHO_QUEUE=queue),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while " ready." not in log.read_text(errors="replace"):
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
    # Celery's banner and its "Connected to" line: the broker, its password masked by kombu.
    assert_hidden(log.read_text(errors="replace"), f"redis+socket://:**@{password_redis}")


def test_settings_show_their_urls_redacted_and_still_hand_the_real_ones_to_a_child() -> None:
    settings = LoushoSettings(
        redis_url=f"redis://:{SECRET}@cache.example:6379/0", store_url=f"postgresql://app:{SECRET}@db.example/runs"
    )
    env = settings.env()
    for shown in (repr(settings), str(settings), repr(env), str(env), f"{env}"):
        assert_hidden(shown, "redis://:***@cache.example:6379/0", "postgresql://app:***@db.example/runs")
    assert env["LOUSHO_REDIS_URL"] == settings.redis_url
    assert {**os.environ, **env}["LOUSHO_STORE_URL"] == settings.store_url


def test_no_error_of_the_library_shows_a_password() -> None:
    cases: list[tuple[Callable[[], Any], type[SDKError], str]] = [
        (lambda: store_from_url(f"mysql://u:{SECRET}@db.example/app"), ConfigurationError, "db.example"),
        (lambda: store_from_url(f"file://u:{SECRET}@files.example/runs"), ConfigurationError, "files.example/runs"),
        (lambda: store_from_url(f"sqlite:///runs.db?password={SECRET}"), ConfigurationError, "runs.db?password=***"),
        (lambda: LoushoSettings(store_url=f"postgresql://u:{SECRET}@db.example/app").redis_store(), ConfigurationError, "db.example"),
        (lambda: RedisStore(f"redis://:{SECRET}/0@cache.example/0"), ConfigurationError, "cache.example"),
        (lambda: RedisStore(f"redis://:{SECRET}@127.0.0.1:1/0").checkpoints.load("s"), StoreUnavailableError, "127.0.0.1:1"),
        (lambda: SqlStore(f"postgresql+psycopg://u:{SECRET}@db.example:notaport/app"), ConfigurationError, "db.example"),
        # A password that a driver would cut short, leaving the rest in the host or socket path it shows.
        (lambda: SqlStore(f"postgresql+psycopg://u:x@{SECRET}@db.example/app"), ConfigurationError, "db.example/app"),
        (lambda: RedisStore(f"unix://:{SECRET}/x@/run/redis.sock?db=0"), ConfigurationError, "/run/redis.sock"),
    ]  # fmt: skip
    for make, error, host in cases:
        with pytest.raises(error) as caught:
            make()
        assert_hidden(str(caught.value), host)
    store = SqlStore(f"postgresql+psycopg://app@db.example/runs?password={SECRET}")
    try:
        assert_hidden(repr(store), "db.example/runs?password=***")
    finally:
        store.close()


def test_a_user_name_is_not_masked_out_of_the_driver_message() -> None:
    with pytest.raises(StoreUnavailableError) as caught:
        RedisStore(f"redis://u:{SECRET}@127.0.0.1:1/0").checkpoints.load("s")
    assert_hidden(str(caught.value), "Connection refused")


def test_a_wrong_broker_password_is_a_typed_error_without_the_password(password_redis: str) -> None:
    store = RedisStore(f"unix://:{SECRET}@{password_redis}?db=0", prefix="redaction:")
    broker = broker_url(f"unix://:wrong-{SECRET}@{password_redis}?db=0")
    client = Client(broker=broker, store=store, settings=FleetSettings(queue="redaction"))  # sent ahead of workers
    with pytest.raises(StoreUnavailableError) as caught:
        client.enqueue("helper", "hi", session_id="s1", require_worker=False)
    assert_hidden(str(caught.value), f"redis+socket://:***@{password_redis}", "'s1'")
    assert store.checkpoints.load("s1") is not None  # saved first: the reaper sends it once the broker takes it


def test_the_fleet_demo_prints_a_shared_redis_without_its_password(password_redis: str, tmp_path: Path) -> None:
    output = StringIO()
    url = f"unix://:{SECRET}@{password_redis}?db=0"
    settings = LoushoSettings(redis_url=url)
    demo = FleetDemo(Console(file=output, width=300), settings, sessions={}, log_dir=str(tmp_path))
    fleet_view.how_to_look(demo, "s1")
    assert_hidden(output.getvalue(), f"LOUSHO_REDIS_URL / REDIS_URL as this demo: unix://:***@{password_redis}?db=0")


def test_a_unix_broker_url_keeps_its_password_whole() -> None:
    # A '?' in the password is not where the query starts: cut there, the URL kept the password where
    # no redaction could find it.
    assert (
        broker_url(f"unix://:a?{SECRET}@/run/redis.sock?db=2")
        == f"redis+socket://:a?{SECRET}@/run/redis.sock?virtual_host=2"
    )
    assert broker_url("unix:///run/a@b/redis.sock?db=3") == "redis+socket:///run/a@b/redis.sock?virtual_host=3"
