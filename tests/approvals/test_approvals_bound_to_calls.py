"""Approvals bound to the call shown (issue #17): an approval stores a digest of its call (tool, arguments,
agent fingerprint); a decision is refused with `ApprovalCallChangedError` when the call it would run is not
that one (an edited checkpoint, a tampered snapshot), and nothing changes; a decision is used once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from lousho import (
    Agent,
    AgentExecutor,
    ApprovalAlreadyResolvedError,
    ApprovalCallChangedError,
    Checkpoint,
    RunResult,
    resume_after_approval,
)
from lousho.approvals import call_digest
from lousho.cli import app
from lousho.fleet.settings import FleetSettings, broker_url
from lousho.providers import ScriptedProvider, tool_calls
from lousho.scheduler.client import Client
from lousho.stores.redis import RedisStore
from lousho.stores.sql import SqliteStore
from tests.fixtures.core import ToolLog, charge_tool, weather_tool

PAY = tool_calls(("pay", "charge_card", {"amount": 10}))


def shop(log: ToolLog) -> Agent:
    return Agent(name="shop", model="m", tools=[weather_tool(log), charge_tool(log)])


async def pause(agent: Agent, store: Any) -> RunResult:
    paused = await AgentExecutor.execute(
        agent=agent, input="buy", provider=ScriptedProvider([PAY, "done"]), session_id="s",
        checkpoint_store=store.checkpoints, approval_store=store.approvals,
    )  # fmt: skip
    assert paused.finish_reason == "awaiting-approval" and paused.approval_id is not None
    return paused


async def resolve(approval_id: str, agent: Agent, store: Any) -> RunResult:
    return await resume_after_approval(
        {"id": approval_id, "approved": True}, store.approvals, agent, ScriptedProvider(["done"]), {}, store.checkpoints
    )


def with_arguments(checkpoint: Checkpoint, call_id: str, arguments: dict[str, Any]) -> Checkpoint:
    """The checkpoint as an edit (or a fork written over the session) leaves it: the call, other arguments."""
    messages = [
        m.model_copy(update={"tool_calls": [c.model_copy(update={"arguments": arguments}) if c.id == call_id else c for c in m.tool_calls]})
        for m in checkpoint.messages
    ]  # fmt: skip
    return checkpoint.model_copy(update={"messages": messages, "version": checkpoint.version + 1})


def loaded(store: Any) -> Checkpoint:
    checkpoint: Checkpoint | None = store.checkpoints.load("s")
    assert checkpoint is not None
    return checkpoint


async def load(store: Any, what: str, key: str) -> Any:
    from lousho.checkpoint import maybe_await

    return await maybe_await(getattr(store, what).load(key))


async def test_an_approval_stores_the_digest_of_the_call_it_shows(any_store: Any, log: ToolLog) -> None:
    paused = await pause(shop(log), any_store)

    snapshot = await load(any_store, "approvals", paused.approval_id or "")

    assert snapshot.call_digest == call_digest(snapshot.tool_call, snapshot.fingerprint)
    other = snapshot.tool_call.model_copy(update={"arguments": {"amount": 1000}})
    assert call_digest(other, snapshot.fingerprint) != snapshot.call_digest


async def test_resolving_an_approval_whose_call_was_edited_is_refused_and_changes_nothing(
    any_store: Any, log: ToolLog
) -> None:
    agent = shop(log)
    paused = await pause(agent, any_store)
    stored = await load(any_store, "checkpoints", "s")
    from lousho.checkpoint import maybe_await

    await maybe_await(any_store.checkpoints.save("s", with_arguments(stored, "pay", {"amount": 1000})))
    edited = await load(any_store, "checkpoints", "s")

    with pytest.raises(ApprovalCallChangedError, match="other arguments"):
        await resolve(paused.approval_id or "", agent, any_store)

    assert await load(any_store, "checkpoints", "s") == edited
    assert (await load(any_store, "approvals", paused.approval_id or "")).status == "pending"
    assert "pay" not in log.runs


async def test_resolving_a_tampered_snapshot_is_refused_and_changes_nothing(any_store: Any, log: ToolLog) -> None:
    from lousho.checkpoint import maybe_await

    agent = shop(log)
    paused = await pause(agent, any_store)
    snapshot = await load(any_store, "approvals", paused.approval_id or "")
    tampered = snapshot.model_copy(
        update={"tool_call": snapshot.tool_call.model_copy(update={"arguments": {"amount": 1000}})}
    )
    await maybe_await(any_store.approvals.save(tampered))
    before = await load(any_store, "checkpoints", "s")

    with pytest.raises(ApprovalCallChangedError, match="stored approval's call"):
        await resolve(paused.approval_id or "", agent, any_store)

    assert await load(any_store, "checkpoints", "s") == before
    assert (await load(any_store, "approvals", paused.approval_id or "")).status == "pending"
    assert "pay" not in log.runs


async def test_a_decision_recorded_before_the_call_changed_is_not_applied_and_is_reopened(
    any_store: Any, log: ToolLog
) -> None:
    from lousho.checkpoint import maybe_await

    agent = shop(log)
    paused = await pause(agent, any_store)
    await maybe_await(any_store.approvals.decide(paused.approval_id or "", True, None))  # then the process died
    stored = await load(any_store, "checkpoints", "s")
    await maybe_await(any_store.checkpoints.save("s", with_arguments(stored, "pay", {"amount": 1000})))
    edited = await load(any_store, "checkpoints", "s")

    with pytest.raises(ApprovalCallChangedError):  # the next resume would apply the decision
        await AgentExecutor.execute(
            agent=agent, input=None, provider=ScriptedProvider(["done"]), session_id="s",
            checkpoint_store=any_store.checkpoints, approval_store=any_store.approvals,
        )  # fmt: skip

    assert await load(any_store, "checkpoints", "s") == edited
    assert (await load(any_store, "approvals", paused.approval_id or "")).status == "pending"
    assert "pay" not in log.runs


async def test_a_decision_is_used_once(any_store: Any, log: ToolLog) -> None:
    agent = shop(log)
    paused = await pause(agent, any_store)

    first = await resolve(paused.approval_id or "", agent, any_store)
    with pytest.raises(ApprovalAlreadyResolvedError):
        await resolve(paused.approval_id or "", agent, any_store)

    assert first.finish_reason == "stop" and log.runs["pay"] == 1
    assert (await load(any_store, "approvals", paused.approval_id or "")).applied_at is not None


async def test_the_fleet_client_refuses_a_decision_for_a_changed_call_and_sends_nothing(
    redis_url: str, redis_prefix: str, redis_client: redis.Redis, log: ToolLog
) -> None:
    store = RedisStore(redis_client, prefix=redis_prefix)
    queue = f"{redis_prefix}queue"
    client = Client(broker=broker_url(redis_url), store=store, settings=FleetSettings(queue=queue))
    paused = await pause(shop(log), store)
    store.checkpoints.save("s", with_arguments(loaded(store), "pay", {"amount": 1000}))
    keys = sorted(redis_client.scan_iter(match=f"{redis_prefix}*"))
    dumps = {key: redis_client.dump(key) for key in keys}

    with pytest.raises(ApprovalCallChangedError):
        client.resolve_approval(paused.approval_id or "", approved=True)

    assert sorted(redis_client.scan_iter(match=f"{redis_prefix}*")) == keys  # nothing written, nothing queued
    assert {key: redis_client.dump(key) for key in keys} == dumps
    assert redis_client.llen(queue) == 0


def test_lousho_approve_refuses_a_changed_call_with_its_error_code(tmp_path: Path, log: ToolLog) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SqliteStore(tmp_path / "runs.db")
    paused = asyncio.run(pause(shop(log), store))
    store.checkpoints.save("s", with_arguments(loaded(store), "pay", {"amount": 1000}))

    result = CliRunner().invoke(app, ["--store-url", url, "approve", paused.approval_id or ""])

    assert result.exit_code == 1, result.output
    assert "LOUSHO_APPROVAL_CALL_CHANGED" in result.stderr
    assert (store.approvals.load(paused.approval_id or "") or pytest.fail("gone")).status == "pending"
