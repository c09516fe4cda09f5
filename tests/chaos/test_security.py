"""Security basics: JSON-only messages, Redis with a password and over TLS, no password in any log or error,
and one key prefix cannot decide another's approvals."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from lousho import Message, ToolCall
from lousho.errors import AgentNotServedError, ApprovalNotFoundError, SDKError, StoreUnavailableError
from lousho.fleet.settings import TASK_MODEL_TURN
from lousho.scheduler import Client
from lousho.stores.redis import RedisStore
from lousho.testing.redis_server import RedisServer
from lousho.worker import FleetSettings, broker_url
from tests.chaos.harness import ChaosFleet, Row, drop_queue, make_fleet, record

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)

PASSWORD = "Zx9!p@ss:w0rd/%-" + uuid.uuid4().hex[:8]  # URL-special characters on purpose
SYSTEM_REDIS = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def job(fleet: ChaosFleet, session: str) -> None:
    fleet.script(session, [Message.assistant(tool_calls=[ToolCall(id=f"{session}-1", name="work", arguments={"n": 3})]),
                           Message.assistant("done")])  # fmt: skip
    deadline = time.monotonic() + 15
    while True:
        try:
            fleet.client.enqueue("jobs", "go", session_id=session)
            break
        except AgentNotServedError:
            # Right after a Redis restart the worker's presence is stale until its next beat (issue #15).
            assert time.monotonic() < deadline, "the worker never showed as serving its agent again"
            time.sleep(0.2)
    fleet.wait_for([session], timeout_s=60)


# -- JSON only ------------------------------------------------------------------------------------


class Payload:
    """A pickle that would create a file when unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.path,))


@pytest.mark.timeout(120)
def test_a_pickled_message_is_refused_and_the_worker_stays_up(chaos_fleet: ChaosFleet, tmp_path: Path) -> None:
    fleet = chaos_fleet
    worker = fleet.start_worker()
    started = time.monotonic()
    marker = tmp_path / "pickle-ran"
    task_id = uuid.uuid4().hex
    body = pickle.dumps(((Payload(str(marker)), 1), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}))
    headers = {"lang": "py", "task": TASK_MODEL_TURN, "id": task_id, "root_id": task_id, "parent_id": None,
               "group": None, "retries": 0, "eta": None, "expires": None, "argsrepr": "evil", "kwargsrepr": "{}",
               "origin": "attacker"}  # fmt: skip
    with Connection(broker_url(fleet.env["LOUSHO_TEST_FLEET_REDIS"])) as connection:
        exchange = Exchange(fleet.queue, type="direct")
        producer = Producer(connection, exchange=exchange, routing_key=fleet.queue)
        producer.publish(
            body, serializer=None, content_type="application/x-python-serialize", content_encoding="binary",
            headers=headers, declare=[Queue(fleet.queue, exchange, routing_key=fleet.queue)],
        )  # fmt: skip
    job(fleet, "after-pickle")  # served after the pickle, by the same worker
    deadline = time.monotonic() + 10
    while "untrusted content" not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    problems = []
    if "Refusing to deserialize untrusted content of type pickle" not in worker.log():
        problems.append("the worker log does not show the pickle refused")
    if marker.exists():
        problems.append("the pickle was unpickled")
    if not worker.alive() or fleet.alive() != [worker]:
        problems.append("the worker died")
    record(Row("security: a pickled message", 1, "message", {"pickle published with kombu": 1}, problems,
               time.monotonic() - started, {"refused, worker kept serving": int(not problems)}))  # fmt: skip
    assert problems == [], worker.log()[-3000:]


# -- passwords ------------------------------------------------------------------------------------


@pytest.fixture
def password_redis() -> Iterator[RedisServer]:
    """A private redis-server on TCP, with `requirepass` (set once it answers: the start probe has no password)."""
    server = RedisServer(extra_args=("--port", str(free_port()), "--bind", "127.0.0.1"))
    server.start()
    server.client().config_set("requirepass", PASSWORD)
    yield server
    server.stop()


def tcp_port(server: RedisServer) -> int:
    return int(server.extra_args[server.extra_args.index("--port") + 1])


def leaks(text: str) -> bool:
    return PASSWORD in text or quote(PASSWORD, safe="") in text or PASSWORD.split("%")[0] in text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_password_protected_redis_works_and_the_password_never_shows(
    password_redis: RedisServer, transport: str, tmp_path: Path
) -> None:
    server = password_redis
    secret = quote(PASSWORD, safe="")
    if transport == "tcp":
        url = f"redis://:{secret}@127.0.0.1:{tcp_port(server)}/0"
        wrong = f"redis://:{quote('nope-' + PASSWORD, safe='')}@127.0.0.1:{tcp_port(server)}/0"
    else:
        url = f"unix://:{secret}@{server.socket_path}?db=0"
        wrong = f"unix://:{quote('nope-' + PASSWORD, safe='')}@{server.socket_path}?db=0"
    client = redis.Redis.from_url(url)
    fleet = make_fleet(url, "pw:", client, tmp_path)
    started = time.monotonic()
    seen: list[str] = []
    try:
        worker = fleet.start_worker()
        job(fleet, "with-password")
        seen.append(repr(fleet.store))
        # Errors a web app may meet: a wrong password for the store, for the broker, and Redis down.
        for make in (
            lambda: Client(broker=broker_url(url), store=RedisStore(wrong, prefix="pw:"), settings=FleetSettings(queue=fleet.queue)),
            lambda: Client(broker=broker_url(wrong), store=RedisStore(url, prefix="pw:"), settings=FleetSettings(queue=fleet.queue)),
        ):
            try:
                make().enqueue("jobs", "hi", session_id=f"s-{uuid.uuid4().hex[:6]}")
                seen.append("ACCEPTED WITH A WRONG PASSWORD")
            except Exception as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
        server.stop(kill=True, keep_data=True)
        try:
            fleet.client.status("with-password")
        except StoreUnavailableError as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
        time.sleep(2.5)  # the worker notices the broker is gone and logs its reconnection attempts
        server.start()
        server.client().config_set("requirepass", PASSWORD)
        job(fleet, "after-restart")
        seen.append(worker.log())
    finally:
        fleet.stop_all()
        drop_queue(client, fleet.queue)
        client.close()
    problems = [f"the password shows in: {text[:300]!r}" for text in seen if leaks(text)]
    problems += [text for text in seen if text.startswith("ACCEPTED")]
    if "Cannot connect to" not in seen[-1] and "Connection to broker lost" not in seen[-1]:
        problems.append("the worker never logged the outage (nothing was checked)")
    untyped = [text.split(":")[0] for text in seen[1:-1] if not text.startswith(("StoreUnavailableError", "ACCEPTED"))]
    record(Row(f"security: Redis with a password ({transport})", len(seen), "logs and errors read", {},
               problems, time.monotonic() - started,
               {"passwords found": len(problems), "untyped errors (a wrong broker password)": ", ".join(untyped) or 0}))  # fmt: skip
    assert problems == []


# -- TLS ------------------------------------------------------------------------------------------


def tls_capable(executable: str | None) -> bool:
    if executable is None:
        return False
    found = subprocess.run(["ldd", executable], capture_output=True, text=True, check=False)
    return "libssl" in found.stdout


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, str]]:
    """The machine's redis-server with TLS on a TCP port (a CA and a server certificate made here)."""
    if not tls_capable(SYSTEM_REDIS) or shutil.which("openssl") is None:
        pytest.skip("no redis-server built with TLS (or no openssl) on this machine; see docs/reliability.md")
    certs = tmp_path / "certs"
    certs.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=certs, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=lousho test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (certs / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.crt",
            "-days", "2", "-extfile", "ext.cnf")  # fmt: skip
    port = free_port()
    server = RedisServer(executable=SYSTEM_REDIS, extra_args=(
        "--tls-port", str(port), "--tls-cert-file", str(certs / "server.crt"), "--tls-key-file", str(certs / "server.key"),
        "--tls-ca-cert-file", str(certs / "ca.crt"), "--tls-auth-clients", "no"))  # fmt: skip
    server.start()
    server.client().config_set("requirepass", PASSWORD)
    yield server, f"rediss://:{quote(PASSWORD, safe='')}@localhost:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={certs / 'ca.crt'}"
    server.stop()


@pytest.mark.timeout(120)
def test_the_fleet_runs_over_tls(tls_redis: tuple[RedisServer, str], tmp_path: Path) -> None:
    server, url = tls_redis
    client = redis.Redis.from_url(url)
    fleet = make_fleet(url, "tls:", client, tmp_path)
    started = time.monotonic()
    problems = []
    try:
        worker = fleet.start_worker()
        job(fleet, "over-tls")
        if "transport:   rediss://:**@localhost" not in worker.log():
            problems.append("the worker's broker is not rediss://")
        if leaks(worker.log()):
            problems.append("the password shows in the worker log")
        port = url.split("@localhost:")[1].split("/")[0]
        for name, other in (("plain redis:// to the TLS port", f"redis://:{quote(PASSWORD, safe='')}@localhost:{port}/0"),
                            ("rediss:// without the CA", url.split("&ssl_ca_certs")[0])):  # fmt: skip
            try:
                RedisStore(other, socket_connect_timeout=2, socket_timeout=2).checkpoints.load("over-tls")
                problems.append(f"{name} was accepted")
            except StoreUnavailableError as exc:
                if leaks(str(exc)):
                    problems.append(f"{name}: the password shows in {exc}")
    finally:
        fleet.stop_all()
        drop_queue(client, fleet.queue)
        client.close()
    record(Row("security: TLS (rediss://, verified certificate)", 3, "connections", {}, problems,
               time.monotonic() - started, {"redis-server": server.executable}))  # fmt: skip
    assert problems == []


def test_a_rediss_url_is_routed_to_ssl_by_redis_py_and_kombu() -> None:
    """Runs everywhere (no server needed): what the TLS test relies on."""
    url = "rediss://:secret@redis.example:6380/0?ssl_cert_reqs=required"
    store = RedisStore(url)
    assert store.client.connection_pool.connection_class is redis.SSLConnection
    assert "secret" not in repr(store)
    with Connection(broker_url(url)) as connection:
        assert connection.transport_cls == "rediss"
        assert connection.as_uri() == "rediss://:**@redis.example:6380/0"


# -- key prefixes -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_client_of_another_prefix_cannot_resolve_an_approval(chaos_fleet: ChaosFleet, redis_url: str) -> None:
    fleet = chaos_fleet
    fleet.start_worker()
    started = time.monotonic()
    fleet.script("pay", [Message.assistant(tool_calls=[ToolCall(id="p1", name="charge", arguments={"amount": 5})]), Message.assistant("paid")])
    fleet.client.enqueue("jobs", "pay", session_id="pay")
    fleet.wait_for(["pay"], status="awaiting-approval", timeout_s=60)
    approval = fleet.client.approvals("pay")[0]
    other_prefix = f"other-{uuid.uuid4().hex[:8]}:"
    other = Client(broker=broker_url(redis_url), store=RedisStore(fleet.redis, prefix=other_prefix), settings=FleetSettings(queue=fleet.queue))
    problems = []
    try:
        other.resolve_approval(approval.id, approved=True)
        problems.append("another prefix resolved the approval")
    except ApprovalNotFoundError:
        pass
    except SDKError as exc:
        problems.append(f"{type(exc).__name__}: {exc}")
    if other.approvals() or other.status("pay").status != "unknown":
        problems.append("another prefix sees this prefix's approvals or sessions")
    if fleet.client.approvals("pay") != [approval] or "p1" in fleet.counts("runs"):
        problems.append("the approval changed or the call ran")
    fleet.client.resolve_approval(approval.id, approved=False, note="not from here")
    fleet.wait_for(["pay"], timeout_s=60)
    fleet.redis.delete(*fleet.redis.keys(f"{other_prefix}*") or ["none"])
    record(Row("security: approvals across key prefixes", 3, "cases", {}, problems, time.monotonic() - started))
    assert problems == []
