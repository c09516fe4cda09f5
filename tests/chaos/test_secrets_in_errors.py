"""Passwords in configuration errors (issue #21): generated passwords, URL-special characters included, in
URLs of every scheme lousho takes (and some it does not), given to every entry point of configuration: the
settings object, `store_from_url`, `RedisStore`, the fleet's store, a `Client` whose broker has a wrong
password, and the `lousho` command (flags and environment variables). Every message, log record, repr and
formatted traceback that comes out is read; a violation is one that holds any piece of a password."""

from __future__ import annotations

import logging
import random
import re
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from typer.testing import CliRunner

from lousho.cli import app
from lousho.errors import SDKError
from lousho.scheduler import Client
from lousho.settings import LoushoSettings, store_from_url
from lousho.stores.redis import RedisStore
from lousho.testing.redis_server import RedisServer
from lousho.worker import broker_url
from tests.chaos.harness import SEED, Row, pick, record

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

PASSWORDS_PER_FORM = pick(1, 6)
GOOD_PASSWORD = "the-right-one-" + uuid.uuid4().hex[:8]
SEPARATORS = ["-", "@", "/", ":", "#", "?", "%", "&", "=", "!", "+", "@@"]
NO_CONFIG = {"LOUSHO_REDIS_URL": None, "REDIS_URL": None, "LOUSHO_STORE_URL": None}
Form = Callable[[str, str], str]
"""A URL from (password, the protected Redis's socket path)."""

FORMS: dict[str, Form] = {
    "redis": lambda pw, sock: f"redis://app:{pw}@127.0.0.1:1/0",
    "rediss": lambda pw, sock: f"rediss://:{pw}@127.0.0.1:1/0?ssl_cert_reqs=none",
    "unix": lambda pw, sock: f"unix://:{pw}@{sock}?db=0",
    "unix ?password=": lambda pw, sock: f"unix://{sock}?db=0&password={quote(pw, safe='')}",
    "sqlite": lambda pw, sock: f"sqlite://app:{pw}@127.0.0.1/runs.db",
    "sqlite ?password=": lambda pw, sock: f"sqlite:///runs.db?password={quote(pw, safe='')}",
    "postgresql": lambda pw, sock: f"postgresql://app:{pw}@127.0.0.1:1/runs",
    "postgres": lambda pw, sock: f"postgres://app:{pw}@127.0.0.1:1/runs",
    "postgresql+psycopg": lambda pw, sock: f"postgresql+psycopg://app:{pw}@127.0.0.1:1/runs?sslpassword={quote(pw, safe='')}",
    "file": lambda pw, sock: f"file://app:{pw}@127.0.0.1/runs",
    "mysql": lambda pw, sock: f"mysql://app:{pw}@127.0.0.1:3306/runs",
    "garbage": lambda pw, sock: f"garbage app:{pw}@127.0.0.1",
    "no //": lambda pw, sock: f"redis:app:{pw}@127.0.0.1:1/0",
}  # fmt: skip


def make_password(rng: random.Random) -> tuple[str, list[str]]:
    """A password of distinctive tokens (what the check looks for) joined by URL-special characters."""
    tokens = [f"pw{rng.getrandbits(40):010x}" for _ in range(rng.randint(1, 3))]
    password = tokens[0]
    for token in tokens[1:]:
        password += rng.choice(SEPARATORS) + token
    return (quote(password, safe="") if rng.random() < 0.3 else password), tokens


def outcome(action: Callable[[], Any]) -> Iterator[str]:
    """What a user may see of `action`: the repr of what it returns, or the error's text and traceback."""
    try:
        result = action()
        yield repr(result)
        load = getattr(getattr(result, "checkpoints", None), "load", None)
        if load is not None:  # a store: its first call meets the backend (refused, unreachable, wrong password)
            yield from outcome(lambda: load("s"))
        close = getattr(result, "close", None)
        if callable(close):
            close()
    except Exception as exc:
        yield f"{'typed' if isinstance(exc, SDKError) else 'UNTYPED'} {type(exc).__name__}: {exc}"
        yield "".join(traceback.format_exception(exc))


def cli(*args: str, **env: str) -> Iterator[str]:
    result = CliRunner().invoke(app, list(args), env={**NO_CONFIG, **env})
    yield result.stdout + result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        yield "".join(traceback.format_exception(result.exception))


def entry_points(url: str, store: RedisStore) -> dict[str, Callable[[], Iterator[str]]]:
    def settings() -> Iterator[str]:
        made = LoushoSettings(redis_url=url, store_url=url)
        yield from (repr(made), str(made), repr(made.env()), f"{made.env()}")

    points: dict[str, Callable[[], Iterator[str]]] = {
        "LoushoSettings": settings,
        "store_from_url": lambda: outcome(lambda: store_from_url(url)),
        "RedisStore": lambda: outcome(lambda: RedisStore(url, socket_connect_timeout=2)),
        "fleet store (LOUSHO_STORE_URL)": lambda: outcome(lambda: LoushoSettings(store_url=url).redis_store()),
        "fleet store (LOUSHO_REDIS_URL)": lambda: outcome(lambda: LoushoSettings(redis_url=url).redis_store()),
        "lousho --store-url": lambda: cli("--store-url", url, "sessions"),
        "lousho --redis-url": lambda: cli("--redis-url", url, "sessions"),
        "LOUSHO_STORE_URL": lambda: cli("sessions", LOUSHO_STORE_URL=url),
        "LOUSHO_REDIS_URL": lambda: cli("sessions", LOUSHO_REDIS_URL=url),
        "REDIS_URL": lambda: cli("sessions", REDIS_URL=url),
    }
    if url.startswith(("redis://", "rediss://", "unix://")):
        points["Client(broker=...).enqueue"] = lambda: outcome(
            lambda: Client(broker=broker_url(url), store=store).enqueue("jobs", "hi")
        )
    return points


class Records(logging.Handler):
    """Every log record of the run, formatted as a log file would hold it (tracebacks included)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def protected_redis() -> Iterator[RedisServer]:
    """A private redis-server that requires GOOD_PASSWORD (set once it answers: its start probe has none)."""
    with RedisServer() as server:
        server.client().config_set("requirepass", GOOD_PASSWORD)
        yield server


@pytest.mark.timeout(300)
def test_no_password_shows_in_any_configuration_error(
    protected_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a URL taken for a path makes its files here
    rng = random.Random(SEED)
    sock = protected_redis.socket_path
    store = RedisStore(f"unix://:{GOOD_PASSWORD}@{sock}?db=0", prefix=f"secrets-{uuid.uuid4().hex[:8]}:")
    records = Records()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    started = time.monotonic()
    read, untyped, violations = 0, 0, []
    try:
        for form_name, form in FORMS.items():
            for _ in range(PASSWORDS_PER_FORM):
                password, tokens = make_password(rng)
                url = form(password, sock)
                leak = re.compile("|".join(tokens))
                for point, texts in entry_points(url, store).items():
                    for text in [*texts(), *records.lines]:
                        read += 1
                        untyped += text.startswith("UNTYPED")
                        if leak.search(text):
                            violations.append(f"{point}, {form_name} URL {leak.sub('<PASSWORD>', url)}: " + "; ".join(line.strip() for line in leak.sub("<PASSWORD>", text).splitlines() if "<PASSWORD>" in line))
                    records.lines.clear()
    finally:
        root.removeHandler(records)
        root.setLevel(old_level)
        store.close()
    record(Row("passwords in configuration errors", read, "messages, logs and reprs read",
               {"URLs with a password": len(FORMS) * PASSWORDS_PER_FORM}, violations, time.monotonic() - started,
               {"URL forms": len(FORMS), "untyped errors": untyped}))  # fmt: skip
    assert violations == []
