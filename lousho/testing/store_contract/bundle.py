"""The bundle part of the contract: `lousho.StoreBundle`'s `sessions(status=)`, `prune()` and `delete()` (issue #16)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lousho.store_bundle import StoreBundle
from lousho.testing.store_contract.base import StoreContractBase
from lousho.testing.store_contract.samples import sample_checkpoint, sample_snapshot

__all__ = ["StoreBundleContract"]


class StoreBundleContract(StoreContractBase):
    """A store bundle manages sessions as a whole: lists them, prunes the old finished ones, deletes one."""

    @pytest.fixture
    def bundle(self, store: Any) -> Any:
        if getattr(store, "checkpoints", None) is None:
            pytest.skip("this store is a bare checkpoint store, not a bundle")
        return store

    def _save_run(self, bundle: Any, session_id: str, steps: int, status: str) -> None:
        for step in range(steps):
            last = step == steps - 1
            checkpoint = sample_checkpoint(
                session_id, version=step + 1, step=step, status=status if last else "in-progress", approval_id=None
            )
            self.call(bundle.checkpoints.save(session_id, checkpoint))

    def test_the_store_is_a_store_bundle(self, bundle: Any) -> None:
        assert isinstance(bundle, StoreBundle), f"{type(bundle).__name__} lacks part of lousho.StoreBundle"

    def test_sessions_lists_every_session_sorted_and_by_status(self, bundle: Any) -> None:
        self._save_run(bundle, "s-b", 2, "finished")
        self._save_run(bundle, "s-a", 1, "in-progress")
        self._save_run(bundle, "s-c", 1, "awaiting-approval")
        assert list(self.call(bundle.sessions())) == ["s-a", "s-b", "s-c"]
        assert list(self.call(bundle.sessions(status="finished"))) == ["s-b"]
        assert list(self.call(bundle.sessions(status="in-progress"))) == ["s-a"]
        assert list(self.call(bundle.sessions(status="awaiting-approval"))) == ["s-c"]

    def test_delete_forgets_the_session_and_its_history_unless_kept(self, bundle: Any) -> None:
        self._save_run(bundle, "s-del", 2, "finished")
        self._save_run(bundle, "s-keep", 2, "finished")
        self.call(bundle.delete("s-del"))
        self.call(bundle.delete("s-keep", keep_history=True))
        assert self.call(bundle.checkpoints.load("s-del")) is None
        assert self.call(bundle.checkpoints.load("s-keep")) is None
        assert list(self.call(bundle.sessions())) == []
        assert self.call(bundle.checkpoints.history("s-del")) == []
        assert [e.step for e in self.call(bundle.checkpoints.history("s-keep"))] == [1, 0]
        self._save_run(bundle, "s-del", 1, "in-progress")  # a deleted session starts again at version 1
        assert self.call(bundle.checkpoints.load("s-del")).step_index == 0

    def test_delete_forgets_the_approvals_the_session_paused_on_unless_its_history_is_kept(self, bundle: Any) -> None:
        """They hold its transcript too (issue #16): a decided one its history names, the pending one it waits
        on; a sub-agent's approval, stored under its parent's id and owned by the parent, stays with the parent."""
        saves = [("s-del", "appr_old", 1), ("s-del", "appr_now", 2), ("s-kept", "appr_kept", 1)]
        for session, approval_id, version in saves:
            self.call(bundle.approvals.save(sample_snapshot(approval_id, session)))
            paused = sample_checkpoint(session, version=version, step=version - 1, approval_id=approval_id)
            self.call(bundle.checkpoints.save(session, paused))
        self.call(bundle.approvals.decide("appr_old", approved=True, note=None))
        self.call(bundle.approvals.save(sample_snapshot("appr_parent", "s-parent")))  # the parent's
        as_child = sample_checkpoint("s-del", version=3, step=2, approval_id="appr_parent")
        self.call(bundle.checkpoints.save("s-del", as_child))

        self.call(bundle.delete("s-kept", keep_history=True))
        self.call(bundle.delete("s-del"))

        assert self.call(bundle.approvals.load("appr_old")) is None
        assert self.call(bundle.approvals.load("appr_now")) is None
        assert [s.id for s in self.call(bundle.approvals.pending())] == ["appr_kept", "appr_parent"]

    def test_prune_removes_old_finished_sessions_and_old_history_and_keeps_unfinished_ones(self, bundle: Any) -> None:
        self._save_run(bundle, "s-done", 2, "finished")
        self._save_run(bundle, "s-running", 1, "in-progress")
        running = self.call(bundle.checkpoints.load("s-running"))
        nothing = self.call(bundle.prune(timedelta(hours=1)))
        assert (nothing.checkpoints, nothing.history) == (0, 0)
        assert list(self.call(bundle.sessions())) == ["s-done", "s-running"]

        pruned = self.call(bundle.prune(datetime.now(UTC) + timedelta(minutes=5)))
        assert (pruned.checkpoints, pruned.history) == (1, 3)
        assert self.call(bundle.checkpoints.load("s-done")) is None
        assert self.call(bundle.checkpoints.load("s-running")) == running, "an unfinished session was pruned"
        assert self.call(bundle.checkpoints.history("s-done")) == []
        assert self.call(bundle.checkpoints.history("s-running")) == []
        assert list(self.call(bundle.sessions())) == ["s-running"]
        self._save_run(bundle, "s-done", 1, "in-progress")  # nothing of the pruned session is in the way
        assert self.call(bundle.checkpoints.load("s-done")).messages == running.messages
