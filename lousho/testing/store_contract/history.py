"""The history part of the contract: the optional `history()` ring."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from lousho.checkpoint import Checkpoint, get_checkpoint_history
from lousho.testing.store_contract.base import StoreContractBase
from lousho.testing.store_contract.samples import sample_checkpoint

__all__ = ["HistoryStoreContract"]


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
        if self.refuses_unsealed(checkpoints, "s-legacy"):
            return
        assert self.call(history("s-legacy")) == []
        assert self.call(checkpoints.load("s-legacy")) == old
        self.call(checkpoints.save("s-legacy", old.model_copy(update={"version": 2, "step_index": 4})))
        assert [e.step for e in self.call(history("s-legacy"))] == [4]
