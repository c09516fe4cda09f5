"""A web app's `Client` when RabbitMQ does not take its messages and the store's Redis is up (issue #18).

With a Redis broker, the broker and the store fail together; with RabbitMQ one can be down while the
other is up. What the `Client` wrote to the store stays written, and the web app gets a typed error
(never kombu's) or, where the reaper sends the wake-up itself, a logged warning and no error: a second
call would wrongly find the approval already decided."""

from __future__ import annotations

import logging
import socket

import pytest

from lousho import Message
from lousho.errors import StoreUnavailableError
from lousho.scheduler import Client
from lousho.settings import LoushoSettings
from lousho.worker import FleetSettings
from tests.fleet.conftest import Fleet, tool_turn

pytestmark = pytest.mark.workers  # it starts Celery worker processes (tests/fixtures/workers.py)


def unreachable_broker() -> str:
    """An AMQP URL on a local port nothing listens on (a broker that is down)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"amqp://guest:secret-pw@127.0.0.1:{port}//"


def client_without_broker(fleet: Fleet) -> Client:
    return Client(
        broker=unreachable_broker(), store=fleet.store, settings=FleetSettings(queue=fleet.queue, lease_ttl_s=2.0)
    )


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_an_approval_decided_while_the_broker_is_down_is_kept_and_the_reaper_resumes_the_run(
    rabbitmq_fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = rabbitmq_fleet
    fleet.script("pay", [tool_turn(("c1", "charge", {"amount": 12})), Message.assistant("paid")])
    fleet.start_worker()
    fleet.client.enqueue("jobs", "pay", session_id="pay")
    fleet.wait_for(["pay"], status="awaiting-approval", timeout_s=60)
    [approval] = fleet.client.approvals("pay")

    offline = client_without_broker(fleet)
    with caplog.at_level(logging.WARNING, logger="lousho.client"):
        offline.resolve_approval(approval.id, approved=True)  # no error: the decision is saved
    offline.app.close()
    assert "did not take the message of session 'pay'" in caplog.text
    assert "secret-pw" not in caplog.text
    assert fleet.client.approvals("pay") == []

    fleet.start_reaper()  # the reaper, on the broker that is up, sends the wake-up the web app could not
    fleet.wait_for(["pay"], timeout_s=60)
    assert fleet.counts("runs") == {"c1": 1}


@pytest.mark.timeout(60)
def test_an_abort_while_the_broker_is_down_sets_the_flag_and_says_so_with_a_typed_error(rabbitmq_fleet: Fleet) -> None:
    fleet = rabbitmq_fleet
    fleet.client.enqueue("jobs", "go", session_id="ab", require_worker=False)  # in progress, no worker yet
    offline = client_without_broker(fleet)
    with pytest.raises(StoreUnavailableError, match="call abort\\(\\) again") as raised:
        offline.abort("ab")
    offline.app.close()
    assert "secret-pw" not in str(raised.value)
    assert fleet.client.status("ab").aborted  # the flag that stops running tools is set


@pytest.mark.timeout(60)
def test_a_resume_while_the_broker_is_down_raises_nothing_and_the_session_stays_due(rabbitmq_fleet: Fleet) -> None:
    fleet = rabbitmq_fleet
    fleet.client.enqueue("jobs", "go", session_id="re", require_worker=False)
    offline = client_without_broker(fleet)
    offline.resume("re")
    offline.app.close()
    assert fleet.client.status("re").status == "in-progress"
    assert "re" in [session for session, _ in fleet.client.inflight.due(due_before_ms=10**15, limit=100)]


def test_lousho_broker_url_names_the_broker_of_every_app_and_is_never_shown_with_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOUSHO_BROKER_URL", "amqp://fleet:secret-pw@rabbitmq:5672//")
    monkeypatch.setenv("LOUSHO_REDIS_URL", "redis://127.0.0.1:6379/0")
    settings = LoushoSettings()
    assert settings.broker() == "amqp://fleet:secret-pw@rabbitmq:5672//"  # not the Redis
    assert settings.env()["LOUSHO_BROKER_URL"] == "amqp://fleet:secret-pw@rabbitmq:5672//"  # a worker gets it
    assert "secret-pw" not in repr(settings) and "secret-pw" not in repr(settings.env())
    monkeypatch.delenv("LOUSHO_BROKER_URL")
    assert LoushoSettings().broker() == "redis://127.0.0.1:6379/0"  # unset: the Redis is the broker
