"""The store contract suite: pytest classes the author of a store subclasses to check it.

    from lousho.testing.store_contract import CheckpointStoreContract

    class TestMyStore(CheckpointStoreContract):
        @pytest.fixture
        def store(self):
            yield MyStore()          # a fresh, empty store for every test

`store` may be a bundle (with `.checkpoints` and `.approvals`) or a bare checkpoint
store. Override `store_factory` instead (a callable taking optional `history_limit=`)
to also run the history-ring bounds. Each class is one part of the contract:

- `CheckpointStoreContract`: required of every store (`save`, `load`, `delete`).
- `VersionedStoreContract`: compare-and-set on `checkpoint.version`.
- `HistoryStoreContract`: the optional `history()` ring.
- `ApprovalStoreContract`: the approval store (`store.approvals`).
- `StoreContract`: all four, what the built-in stores pass.

Store methods may be sync or async; awaitables run on an event loop owned by the test
(no pytest-asyncio needed). The optional hooks `write_raw` / `read_raw` let the suite
plant old, corrupt and foreign records; tests that need a hook skip without it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from lousho.approvals import ApprovalSnapshot
from lousho.checkpoint import Checkpoint, get_checkpoint_history, maybe_await
from lousho.errors import (
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    CheckpointConflictError,
    CorruptCheckpointError,
)
from lousho.fingerprint import AgentFingerprint
from lousho.messages import Message, ToolCall, Usage

__all__ = [
    "ApprovalStoreContract",
    "CheckpointStoreContract",
    "HistoryStoreContract",
    "StoreContract",
    "StoreContractBase",
    "VersionedStoreContract",
    "sample_checkpoint",
    "sample_snapshot",
]

WRITERS = 8
"""Threads racing in the concurrency tests."""


def sample_checkpoint(session_id: str, version: int = 1, step: int = 0, **update: Any) -> Checkpoint:
    """A checkpoint using every field: tool calls and results, usage, non-ASCII business_state, fingerprint."""
    fields: dict[str, Any] = {
        "session_id": session_id,
        "version": version,
        "step_index": step,
        "status": "awaiting-approval",
        "agent_name": "booker",
        "messages": [
            Message.system("You book tables."),
            Message.user('Table for 2, ce soir \U0001f377 "by the window"'),
            Message.assistant("Checking", [ToolCall(id="call_1", name="find", arguments={"party": 2, "tags": [None]})]),
            Message(role="tool", content='{"table": 7}', tool_call_id="call_1", name="find"),
            Message.assistant(tool_calls=[ToolCall(id="call_2", name="book", arguments={"table": 7})]),
        ],
        "usage": Usage(input_tokens=120, output_tokens=33),
        "run_start": 1,
        "run_input_count": 1,
        "pending_input": [Message.user("and a highchair")],
        "business_state": {
            "cart": [1, 2.5, "x", None],
            "nested": {"ok": True},
            "text": "\u00fcn\u00efc\u00f8d\u00e9\n",
        },
        "approval_id": "appr_1",
        "fingerprint": AgentFingerprint(
            model="gpt-4o-mini", tools={"find": "a" * 64, "book": "b" * 64}, instructions="c" * 64, digest="0" * 12
        ),
        "run_config": {"ctx": {"tenant": "acme"}, "model": "gpt-4o-mini"},
    }
    fields.update(update)
    return Checkpoint(**fields)


def sample_snapshot(
    approval_id: str, session_id: str = "s-approvals", created_at: str | None = None
) -> ApprovalSnapshot:
    """A pending approval snapshot with remaining calls, a checkpoint and metadata."""
    call = ToolCall(id="call_2", name="book", arguments={"table": 7})
    extra = {"created_at": created_at} if created_at else {}
    return ApprovalSnapshot(
        id=approval_id,
        session_id=session_id,
        agent_name="booker",
        tool_call=call,
        remaining_tool_calls=[ToolCall(id="call_3", name="notify", arguments={"to": "guest"})],
        checkpoint=sample_checkpoint(session_id, approval_id=approval_id),
        max_steps=10,
        metadata={"tenant": "acme"},
        **extra,
    )


def race(count: int, action: Callable[[int], Any]) -> list[Any]:
    """Run `action(i)` in `count` threads released together; each result or the exception it raised.

    An awaitable result runs on the thread's own event loop (a store bound to one loop
    cannot be raced this way)."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def worker(index: int) -> None:
        barrier.wait()
        try:
            value = action(index)
            results[index] = asyncio.run(maybe_await(value)) if hasattr(value, "__await__") else value
        except BaseException as error:  # the test inspects what each writer got
            results[index] = error

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


class StoreContractBase:
    """Fixtures and hooks shared by every part of the contract."""

    @pytest.fixture
    def store_factory(self) -> Callable[..., Any]:
        """Override: a callable returning a fresh store; it must accept `history_limit=` to test the ring."""
        pytest.skip("override the `store_factory` fixture (or `store`) to run this part of the store contract")

    @pytest.fixture
    def store(self, store_factory: Callable[..., Any]) -> Any:
        """Override: a fresh, empty store (a bundle or a bare checkpoint store)."""
        return store_factory()

    @pytest.fixture
    def checkpoints(self, store: Any) -> Any:
        return getattr(store, "checkpoints", store)

    @pytest.fixture(autouse=True)
    def _contract_loop(self) -> Iterator[None]:
        """One event loop per test for async store methods, closed after the store fixtures."""
        self._loop = asyncio.new_event_loop()
        yield
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def call(self, value: Any) -> Any:
        """The result of a store method, awaited on the test's loop when it is async."""
        return self._loop.run_until_complete(maybe_await(value)) if hasattr(value, "__await__") else value

    def write_raw(self, checkpoints: Any, session_id: str, raw: str | bytes) -> None:
        """Optional hook: store `raw` as the session's latest checkpoint, unchecked (raise NotImplementedError for
        a kind of value the store cannot hold, e.g. bytes in a text column)."""
        raise NotImplementedError

    def read_raw(self, checkpoints: Any, session_id: str) -> str | bytes | None:
        """Optional hook: the session's latest checkpoint as stored."""
        raise NotImplementedError

    def plant(self, checkpoints: Any, session_id: str, raw: str | bytes) -> None:
        try:
            self.write_raw(checkpoints, session_id, raw)
        except NotImplementedError:
            pytest.skip("implement write_raw() to check how the store reads records it did not write")

    def history_of(self, checkpoints: Any) -> Callable[..., Any]:
        history = getattr(checkpoints, "history", None)
        if history is None:
            pytest.skip("this store keeps no history (it has no history() method)")
        return history  # type: ignore[no-any-return]


_CORRUPT: dict[str, Callable[[str], str | bytes]] = {
    "not-json": lambda s: '{"session_id": "' + s + '", "messages": [',
    "not-utf8": lambda s: b"\xff\xfe\x00\x81 not text",
    "not-an-object": lambda s: "[1, 2, 3]",
    "wrong-shape": lambda s: json.dumps({"session_id": s, "messages": "not a list", "step_index": "two"}),
    "newer-schema": lambda s: sample_checkpoint(s).model_copy(update={"schema_version": 999}).model_dump_json(),
    "foreign-session": lambda s: sample_checkpoint("someone-else").model_dump_json(),
}


class CheckpointStoreContract(StoreContractBase):
    """Required of every checkpoint store: save, load and delete."""

    def test_load_of_unknown_session_is_none(self, checkpoints: Any) -> None:
        assert self.call(checkpoints.load("never-saved")) is None

    def test_save_then_load_round_trips_every_field(self, checkpoints: Any) -> None:
        saved = sample_checkpoint("s-roundtrip")
        self.call(checkpoints.save("s-roundtrip", saved))
        loaded = self.call(checkpoints.load("s-roundtrip"))
        assert isinstance(loaded, Checkpoint), f"load() returned {loaded!r}"
        assert loaded.model_dump() == saved.model_dump()

    def test_save_overwrites(self, checkpoints: Any) -> None:
        self.call(checkpoints.save("s-over", sample_checkpoint("s-over", version=1, step=0)))
        second = sample_checkpoint("s-over", version=2, step=1, status="finished", finish_reason="stop")
        self.call(checkpoints.save("s-over", second))
        assert self.call(checkpoints.load("s-over")) == second

    def test_delete_removes_and_the_session_can_start_again(self, checkpoints: Any) -> None:
        self.call(checkpoints.save("s-del", sample_checkpoint("s-del")))
        self.call(checkpoints.delete("s-del"))
        assert self.call(checkpoints.load("s-del")) is None
        self.call(checkpoints.delete("s-del"))  # deleting what is gone is not an error
        self.call(checkpoints.save("s-del", sample_checkpoint("s-del", version=1, step=5)))
        assert self.call(checkpoints.load("s-del")).step_index == 5

    def test_sessions_are_isolated(self, checkpoints: Any) -> None:
        self.call(checkpoints.save("s-a", sample_checkpoint("s-a", business_state={"who": "a"})))
        self.call(checkpoints.save("s-b", sample_checkpoint("s-b", business_state={"who": "b"})))
        self.call(checkpoints.delete("s-a"))
        assert self.call(checkpoints.load("s-a")) is None
        assert self.call(checkpoints.load("s-b")).business_state == {"who": "b"}

    def test_get_checkpoint_history_is_none_only_without_history(self, checkpoints: Any) -> None:
        self.call(checkpoints.save("s-gh", sample_checkpoint("s-gh")))
        found = self._loop.run_until_complete(get_checkpoint_history(checkpoints, "s-gh"))
        assert (found is None) == (getattr(checkpoints, "history", None) is None)

    def test_record_without_status_loads_as_in_progress(self, checkpoints: Any) -> None:
        record = sample_checkpoint("s-old").model_dump(mode="json")
        del record["status"]
        self.plant(checkpoints, "s-old", json.dumps(record))
        assert self.call(checkpoints.load("s-old")).status == "in-progress"

    @pytest.mark.parametrize("kind", sorted(_CORRUPT))
    def test_unreadable_record_raises_and_is_left_unchanged(self, checkpoints: Any, kind: str) -> None:
        raw = _CORRUPT[kind]("s-bad")
        self.plant(checkpoints, "s-bad", raw)
        for _ in range(2):  # a failed load changes nothing: the second one fails the same way
            with pytest.raises(CorruptCheckpointError) as caught:
                self.call(checkpoints.load("s-bad"))
            assert caught.value.session_id == "s-bad" and "'s-bad'" in str(caught.value)
        try:
            stored = self.read_raw(checkpoints, "s-bad")
        except NotImplementedError:
            return
        as_bytes = stored.encode() if isinstance(stored, str) else stored
        assert as_bytes == (raw.encode() if isinstance(raw, str) else raw), "the stored value was changed"


class VersionedStoreContract(StoreContractBase):
    """Compare-and-set: a save must carry the stored version plus one (a new session: version 1)."""

    def _conflicts(self, checkpoints: Any, checkpoint: Checkpoint) -> CheckpointConflictError:
        with pytest.raises(CheckpointConflictError) as caught:
            self.call(checkpoints.save(checkpoint.session_id, checkpoint))
        assert caught.value.session_id == checkpoint.session_id
        return caught.value

    @pytest.mark.parametrize("version", [1, 2, 4])
    def test_save_that_does_not_follow_the_stored_version_conflicts(self, checkpoints: Any, version: int) -> None:
        current = sample_checkpoint("s-cas", version=2, step=1)
        self.call(checkpoints.save("s-cas", sample_checkpoint("s-cas", version=1)))
        self.call(checkpoints.save("s-cas", current))
        self._conflicts(checkpoints, sample_checkpoint("s-cas", version=version, step=9, business_state="stale"))
        assert self.call(checkpoints.load("s-cas")) == current, "a refused save wrote something"

    def test_new_session_must_start_at_version_1(self, checkpoints: Any) -> None:
        self._conflicts(checkpoints, sample_checkpoint("s-new", version=3))
        assert self.call(checkpoints.load("s-new")) is None

    def test_refused_save_adds_no_history(self, checkpoints: Any) -> None:
        history = self.history_of(checkpoints)
        self.call(checkpoints.save("s-ch", sample_checkpoint("s-ch", version=1)))
        before = len(self.call(history("s-ch")))
        self._conflicts(checkpoints, sample_checkpoint("s-ch", version=1, step=3))
        assert len(self.call(history("s-ch"))) == before

    @pytest.mark.parametrize("version", [1, 2])
    def test_concurrent_writers_of_one_version_exactly_one_wins(self, checkpoints: Any, version: int) -> None:
        if version > 1:
            self.call(checkpoints.save("s-race", sample_checkpoint("s-race", version=1)))
        candidates = [
            sample_checkpoint("s-race", version=version, business_state={"writer": i}) for i in range(WRITERS)
        ]
        results = race(WRITERS, lambda i: checkpoints.save("s-race", candidates[i]))
        winners = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
        losers = [r for r in results if isinstance(r, BaseException)]
        assert len(winners) == 1, f"{len(winners)} writers won: {results!r}"
        assert all(isinstance(r, CheckpointConflictError) for r in losers), f"unexpected errors: {losers!r}"
        assert self.call(checkpoints.load("s-race")) == candidates[winners[0]]


class HistoryStoreContract(StoreContractBase):
    """The optional `history(session_id, limit=None)` ring, newest first."""

    def _save_steps(self, checkpoints: Any, session_id: str, count: int) -> list[Checkpoint]:
        saved = []
        for step in range(count):
            status = "finished" if step == count - 1 else "in-progress"
            checkpoint = sample_checkpoint(session_id, version=step + 1, step=step, status=status, approval_id=None)
            self.call(checkpoints.save(session_id, checkpoint))
            saved.append(checkpoint)
        return saved

    def _bounded(self, store_factory: Callable[..., Any], **kwargs: Any) -> Any:
        store = store_factory(**kwargs)
        return getattr(store, "checkpoints", store)

    def test_unknown_session_has_empty_history(self, checkpoints: Any) -> None:
        assert self.call(self.history_of(checkpoints)("never-saved")) == []

    def test_entries_are_newest_first_with_step_time_status_and_checkpoint(self, checkpoints: Any) -> None:
        history = self.history_of(checkpoints)
        saved = self._save_steps(checkpoints, "s-hist", 3)
        entries = self.call(history("s-hist"))
        assert [e.step for e in entries] == [2, 1, 0]
        assert [e.status for e in entries] == ["finished", "in-progress", "in-progress"]
        assert [e.checkpoint for e in entries] == saved[::-1]
        stamps = [datetime.fromisoformat(e.saved_at) for e in entries]
        assert all(stamp.tzinfo is not None for stamp in stamps), "saved_at must be ISO 8601 with a time zone"
        assert stamps == sorted(stamps, reverse=True)
        assert [e.step for e in self.call(history("s-hist", limit=2))] == [2, 1]

    def test_get_checkpoint_history_reads_the_same_entries(self, checkpoints: Any) -> None:
        self._save_steps(checkpoints, "s-gch", 2)
        entries = self._loop.run_until_complete(get_checkpoint_history(checkpoints, "s-gch", limit=1))
        assert entries is not None and [e.step for e in entries] == [1]

    def test_ring_keeps_the_newest_history_limit_saves(self, store_factory: Callable[..., Any]) -> None:
        checkpoints = self._bounded(store_factory, history_limit=3)
        self._save_steps(checkpoints, "s-ring", 5)
        assert [e.step for e in self.call(self.history_of(checkpoints)("s-ring"))] == [4, 3, 2]

    def test_default_history_limit_is_50(self, store_factory: Callable[..., Any]) -> None:
        checkpoints = self._bounded(store_factory)
        self._save_steps(checkpoints, "s-fifty", 52)
        entries = self.call(self.history_of(checkpoints)("s-fifty"))
        assert len(entries) == 50 and entries[0].step == 51 and entries[-1].step == 2

    def test_history_limit_0_keeps_none(self, store_factory: Callable[..., Any]) -> None:
        checkpoints = self._bounded(store_factory, history_limit=0)
        self._save_steps(checkpoints, "s-none", 2)
        assert self.call(self.history_of(checkpoints)("s-none")) == []
        assert self.call(checkpoints.load("s-none")).step_index == 1

    def test_delete_keep_history_keeps_it_and_plain_delete_clears_it(self, checkpoints: Any) -> None:
        history = self.history_of(checkpoints)
        self._save_steps(checkpoints, "s-keep", 2)
        self.call(checkpoints.delete("s-keep", keep_history=True))
        assert self.call(checkpoints.load("s-keep")) is None
        assert [e.step for e in self.call(history("s-keep"))] == [1, 0]
        self.call(checkpoints.delete("s-keep"))
        assert self.call(history("s-keep")) == []

    def test_session_saved_before_history_existed_has_none_until_its_next_save(self, checkpoints: Any) -> None:
        history = self.history_of(checkpoints)
        old = sample_checkpoint("s-legacy", version=1, step=3, status="in-progress", approval_id=None)
        self.plant(checkpoints, "s-legacy", old.model_dump_json())
        assert self.call(history("s-legacy")) == []
        assert self.call(checkpoints.load("s-legacy")) == old
        self.call(checkpoints.save("s-legacy", old.model_copy(update={"version": 2, "step_index": 4})))
        assert [e.step for e in self.call(history("s-legacy"))] == [4]


class ApprovalStoreContract(StoreContractBase):
    """The approval store: save, load, pending, an atomic decide, and reopen."""

    @pytest.fixture
    def approvals(self, store: Any) -> Any:
        approvals = getattr(store, "approvals", None)
        if approvals is None:
            pytest.skip("this store has no `.approvals`")
        return approvals

    def test_load_of_unknown_id_is_none(self, approvals: Any) -> None:
        assert self.call(approvals.load("appr_unknown")) is None

    def test_save_then_load_round_trips_and_save_replaces(self, approvals: Any) -> None:
        snapshot = sample_snapshot("appr_rt")
        self.call(approvals.save(snapshot))
        assert self.call(approvals.load("appr_rt")) == snapshot
        replaced = snapshot.model_copy(update={"metadata": {"tenant": "other"}})
        self.call(approvals.save(replaced))
        assert self.call(approvals.load("appr_rt")) == replaced

    def test_pending_is_oldest_first_filtered_by_session(self, approvals: Any) -> None:
        stamps = [f"2024-01-01T00:00:0{i}+00:00" for i in range(4)]
        for approval_id, session_id, stamp in [("appr_c", "s1", stamps[2]), ("appr_a", "s1", stamps[0]),
                                               ("appr_b", "s2", stamps[1]), ("appr_d", "s1", stamps[3])]:  # fmt: skip
            self.call(approvals.save(sample_snapshot(approval_id, session_id, stamp)))
        self.call(approvals.decide("appr_d", True, None))
        assert [s.id for s in self.call(approvals.pending())] == ["appr_a", "appr_b", "appr_c"]
        assert [s.id for s in self.call(approvals.pending(session_id="s1"))] == ["appr_a", "appr_c"]
        assert self.call(approvals.pending(session_id="s-none")) == []

    @pytest.mark.parametrize(("approved", "status"), [(True, "approved"), (False, "rejected")])
    def test_decide_records_the_decision(self, approvals: Any, approved: bool, status: str) -> None:
        self.call(approvals.save(sample_snapshot("appr_d")))
        decided = self.call(approvals.decide("appr_d", approved, "ok by me"))
        assert (decided.status, decided.note, decided.decided_at is not None) == (status, "ok by me", True)
        assert self.call(approvals.load("appr_d")) == decided
        assert decided.decision is not None and decided.decision.approved is approved

    def test_decide_unknown_id_raises_not_found(self, approvals: Any) -> None:
        with pytest.raises(ApprovalNotFoundError):
            self.call(approvals.decide("appr_missing", True, None))

    def test_second_decision_raises_and_keeps_the_first(self, approvals: Any) -> None:
        self.call(approvals.save(sample_snapshot("appr_twice")))
        first = self.call(approvals.decide("appr_twice", False, "no"))
        with pytest.raises(ApprovalAlreadyResolvedError):
            self.call(approvals.decide("appr_twice", True, "yes"))
        assert self.call(approvals.load("appr_twice")) == first

    def test_concurrent_decisions_exactly_one_wins(self, approvals: Any) -> None:
        self.call(approvals.save(sample_snapshot("appr_race")))
        results = race(WRITERS, lambda i: approvals.decide("appr_race", i % 2 == 0, f"writer {i}"))
        winners = [r for r in results if isinstance(r, ApprovalSnapshot)]
        losers = [r for r in results if not isinstance(r, ApprovalSnapshot)]
        assert len(winners) == 1, f"{len(winners)} decisions won: {results!r}"
        assert all(isinstance(r, ApprovalAlreadyResolvedError) for r in losers), f"unexpected: {losers!r}"
        assert self.call(approvals.load("appr_race")) == winners[0]

    def test_reopen_puts_a_decision_back_to_pending(self, approvals: Any) -> None:
        self.call(approvals.save(sample_snapshot("appr_re")))
        self.call(approvals.decide("appr_re", True, "go"))
        self.call(approvals.reopen("appr_re"))
        reopened = self.call(approvals.load("appr_re"))
        assert (reopened.status, reopened.note, reopened.decided_at) == ("pending", None, None)
        assert [s.id for s in self.call(approvals.pending())] == ["appr_re"]
        assert self.call(approvals.decide("appr_re", False, None)).status == "rejected"
        self.call(approvals.reopen("appr_unknown"))  # nothing to reopen is not an error


class StoreContract(CheckpointStoreContract, VersionedStoreContract, HistoryStoreContract, ApprovalStoreContract):
    """Everything the built-in stores pass."""
