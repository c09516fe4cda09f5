"""The fleet on RabbitMQ as the broker, Redis as the store (issue #18): the fleet's crash tests (SIGKILL
mid-tool, duplicate delivery, zombie workers, an approval across a worker restart), an abort and a
sub-agent, each the very test the Redis-only fleet passes, run here on a private RabbitMQ node
(`lousho.testing.rabbitmq`). The chaos ones run at a smaller size: their bodies read their sizes
from their modules, which these tests set.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType

import pytest
from kombu import Connection

from lousho import Message
from lousho.testing.rabbitmq import RabbitMQNode
from tests.chaos import test_lost_and_duplicate_messages as lost_and_duplicate
from tests.chaos import test_zombie_workers as zombies
from tests.chaos.harness import ChaosFleet, Row, record
from tests.fleet.conftest import Fleet, tool_turn
from tests.fleet.test_fleet_approvals_and_abort import (
    test_abort_cancels_the_running_call_and_new_input_continues_the_run as abort_cancels_and_new_input_continues,
)
from tests.fleet.test_fleet_approvals_and_abort import (
    test_an_approval_is_resolved_from_another_process_and_finishes_on_another_worker as approval_across_workers,
)
from tests.fleet.test_fleet_crashes import (
    test_sessions_finish_with_every_guarantee_when_workers_are_killed as sessions_survive_sigkill,
)
from tests.fleet.test_sub_agents_fleet import (
    test_a_sub_agent_survives_the_sigkill_of_its_tool_worker_and_its_approval_resumes_both as sub_agent_survives,
)

pytestmark = [pytest.mark.slow, pytest.mark.workers]


def smaller_on_rabbitmq(module: ModuleType, monkeypatch: pytest.MonkeyPatch, **sizes: int) -> None:
    """Run a chaos scenario's body at `sizes`, its table row named as on RabbitMQ."""
    for name, value in sizes.items():
        monkeypatch.setattr(module, name, value)

    def record_on_rabbitmq(row: Row) -> Row:
        return record(dataclasses.replace(row, scenario=f"{row.scenario}, RabbitMQ broker"))

    monkeypatch.setattr(module, "record", record_on_rabbitmq)


@pytest.mark.timeout(90)
def test_every_step_goes_through_rabbitmq_and_none_through_redis(rabbitmq_fleet: Fleet) -> None:
    """The outbox (a step's script pushing its next task onto a Redis list) is off: the broker is not the
    store's Redis, so every step after the first is sent through Celery, to RabbitMQ."""
    fleet = rabbitmq_fleet
    fleet.script("one", [tool_turn(("a", "work", {"n": 2}), ("b", "work", {"n": 3})), Message.assistant("done")])
    worker = fleet.start_worker()
    fleet.client.enqueue("jobs", "go", session_id="one")
    fleet.wait_for(["one"], timeout_s=60)

    assert "Connected to amqp://guest:**@127.0.0.1" in worker.log()
    # the worker sent the two tool calls and the next model turn itself, through Celery: no outbox push
    assert fleet.counts("sends") == {"lousho.tool_call": 2, "lousho.model_turn": 1}
    assert not fleet.redis.exists(fleet.queue)  # nothing was ever pushed onto a Redis list of that name
    with Connection(fleet.env["LOUSHO_TEST_FLEET_BROKER"]) as connection:
        declared = connection.default_channel.queue_declare(fleet.queue, passive=True)
    assert declared.message_count == 0  # the queue is RabbitMQ's, and every message on it was taken


@pytest.mark.timeout(180)
def test_sessions_finish_with_every_guarantee_when_workers_are_killed_on_rabbitmq(rabbitmq_fleet: Fleet) -> None:
    sessions_survive_sigkill(rabbitmq_fleet)


@pytest.mark.timeout(120)
def test_an_approval_is_resolved_from_another_process_and_finishes_on_another_worker_on_rabbitmq(
    rabbitmq_fleet: Fleet,
) -> None:
    approval_across_workers(rabbitmq_fleet)


@pytest.mark.timeout(120)
def test_abort_cancels_the_running_call_and_new_input_continues_the_run_on_rabbitmq(rabbitmq_fleet: Fleet) -> None:
    abort_cancels_and_new_input_continues(rabbitmq_fleet)


@pytest.mark.timeout(120)
def test_a_sub_agent_survives_the_sigkill_of_its_tool_worker_on_rabbitmq(rabbitmq_fleet: Fleet, tmp_path: Path) -> None:
    sub_agent_survives(rabbitmq_fleet, tmp_path)


@pytest.mark.timeout(180)
def test_dropped_and_repeated_messages_change_nothing_on_rabbitmq(
    rabbitmq_chaos_fleet: ChaosFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    smaller_on_rabbitmq(lost_and_duplicate, monkeypatch, SESSIONS=10)
    lost_and_duplicate.test_dropped_and_repeated_messages_change_nothing(rabbitmq_chaos_fleet)


@pytest.mark.timeout(180)
def test_zombie_workers_never_land_a_stale_write_on_rabbitmq(
    rabbitmq_chaos_fleet: ChaosFleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    smaller_on_rabbitmq(zombies, monkeypatch, SESSIONS=8, PAUSES=3)
    zombies.test_zombie_workers_never_land_a_stale_write(rabbitmq_chaos_fleet, tmp_path)


@pytest.mark.timeout(90)
def test_on_quorum_queues_a_worker_killed_mid_tool_loses_nothing(rabbitmq_quorum_fleet: Fleet) -> None:
    """`FleetSettings(quorum_queues=True)`: the queue is a quorum queue, Celery's global QoS is off (quorum
    queues have none), and a SIGKILL mid-tool is survived as on a classic queue."""
    fleet = rabbitmq_quorum_fleet
    fleet.script(
        "qq", [tool_turn(("k1", "work", {"n": 4, "sleep_s": 0.3}), ("k2", "work", {"n": 5})), Message.assistant("ok")]
    )
    fleet.kill_on("tool:k1")  # its worker dies while running k1
    workers = [fleet.start_worker(), fleet.start_worker()]
    fleet.start_reaper()
    fleet.client.enqueue("jobs", "go", session_id="qq")
    fleet.wait_for(["qq"], timeout_s=60)

    assert fleet.violations() == []
    assert fleet.counts("runs") == {"k1": 2, "k2": 1}  # the killed call ran again, once; the other once
    assert any("Global QoS is disabled" in worker.log() for worker in workers)
    with Connection(fleet.env["LOUSHO_TEST_FLEET_BROKER"]) as connection:
        channel = connection.channel()
        channel.queue_declare(
            fleet.queue, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"}
        )  # as it is: accepted
        with pytest.raises(connection.channel_errors, match="inequivalent arg 'x-queue-type'"):
            channel.queue_declare(fleet.queue, durable=True, auto_delete=False, arguments={"x-queue-type": "classic"})


@pytest.mark.timeout(120)
def test_a_job_queued_before_a_rabbitmq_restart_runs_after_it_without_the_reaper(
    rabbitmq_fleet: Fleet, rabbitmq_run_node: RabbitMQNode | None
) -> None:
    """Celery's queues are durable and its messages persistent: what waits on the queue when RabbitMQ stops
    is there when it starts again (docs/topologies.md), so no reaper is needed to run it."""
    if rabbitmq_run_node is None:
        pytest.skip("the run uses the machine's RabbitMQ, which this test may not restart")
    fleet = rabbitmq_fleet
    fleet.script("kept", [tool_turn(("k", "work", {"n": 7})), Message.assistant("kept")])
    fleet.client.enqueue("jobs", "go", session_id="kept", require_worker=False)  # waits on the named queue
    rabbitmq_run_node.restart()  # `rabbitmqctl stop`, then the same node on its data folder
    with Connection(fleet.env["LOUSHO_TEST_FLEET_BROKER"]) as connection:
        declared = connection.default_channel.queue_declare(fleet.queue, passive=True)
    assert declared.message_count == 1  # the model turn's message survived the restart
    fleet.start_worker()  # no reaper runs in this test
    fleet.wait_for(["kept"], timeout_s=60)
    assert fleet.counts("runs") == {"k": 1}
