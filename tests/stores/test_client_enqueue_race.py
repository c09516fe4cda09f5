"""`Client.enqueue` on a session a worker saves meanwhile (issue #33: a chaos run under load met it). The input goes
onto what the worker saved; nothing the worker wrote is lost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lousho.checkpoint import Checkpoint
from lousho.errors import CheckpointConflictError
from lousho.fleet.settings import FleetSettings
from lousho.messages import Message
from lousho.scheduler import Client
from lousho.scheduler.client import ENQUEUE_ATTEMPTS
from lousho.stores.redis import RedisStore


def saving_between(client: Client, store: RedisStore, times: int) -> Callable[[str], Checkpoint | None]:
    """The client's `load`, after which a 'worker' (`store`) saves the session once more, `times` times in all."""
    load = client.store.checkpoints.load
    left = [times]

    def load_then_a_worker_saves(session_id: str) -> Checkpoint | None:
        loaded = load(session_id)
        if left[0] and loaded is not None:
            left[0] -= 1
            worker = loaded.model_copy(
                update={"version": loaded.version + 1, "messages": [*loaded.messages, Message.assistant("step")]}
            )
            store.checkpoints.save(session_id, worker)
        return loaded

    return load_then_a_worker_saves


@pytest.fixture
def client(redis_store: RedisStore) -> Client:
    client = Client(broker="memory://", store=redis_store, settings=FleetSettings())
    client.enqueue("agent", "hello", session_id="busy", require_worker=False)
    return client


def test_input_enqueued_while_a_worker_saves_the_session_goes_onto_the_workers_save(
    client: Client, redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client.store.checkpoints, "load", saving_between(client, redis_store, 2))
    client.enqueue("agent", "and then?", session_id="busy", require_worker=False)
    monkeypatch.undo()

    stored = redis_store.checkpoints.load("busy")
    assert stored is not None and stored.version == 4  # the first save, the worker's two, then the input
    assert [m.content for m in stored.messages if m.role == "assistant"] == ["step", "step"]
    assert [m.content for m in stored.pending_input] == ["hello", "and then?"]


def test_enqueue_gives_up_with_the_conflict_when_a_worker_saves_before_every_try(
    client: Client, redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client.store.checkpoints, "load", saving_between(client, redis_store, ENQUEUE_ATTEMPTS))
    with pytest.raises(CheckpointConflictError):
        client.enqueue("agent", "and then?", session_id="busy", require_worker=False)
    monkeypatch.undo()

    stored: Any = redis_store.checkpoints.load("busy")
    assert stored.version == 1 + ENQUEUE_ATTEMPTS
    assert [m.content for m in stored.pending_input] == ["hello"], "the refused input is not written"
