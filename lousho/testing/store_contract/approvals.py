"""The approval part of the contract: `store.approvals`."""

from __future__ import annotations

from typing import Any

import pytest

from lousho.approvals import ApprovalSnapshot
from lousho.errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError, InvalidDecisionError
from lousho.stores.listing import Listing
from lousho.testing.store_contract.base import StoreContractBase
from lousho.testing.store_contract.samples import WRITERS, race, sample_snapshot

__all__ = ["ApprovalStoreContract"]

_UNREADABLE = {
    "not-json": '{"id": "appr_bad", "status": "pending", ',
    "wrong-shape": '{"id": "appr_bad", "status": "pending", "tool_call": "not a call"}',
}


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

    @pytest.mark.parametrize("kind", sorted(_UNREADABLE))
    def test_pending_lists_the_readable_approvals_and_names_an_unreadable_one(self, approvals: Any, kind: str) -> None:
        """One damaged snapshot must not hide the others (issue #21): `pending()` lists every one it can
        read, names the rest in `skipped` (a `Listing`), and the damaged record stays as it is."""
        stamps = [f"2024-01-01T00:00:0{i}+00:00" for i in range(2)]
        self.call(approvals.save(sample_snapshot("appr_a", "s1", stamps[0])))
        self.call(approvals.save(sample_snapshot("appr_c", "s2", stamps[1])))
        self.plant_approval(approvals, "appr_bad", _UNREADABLE[kind])
        for _ in range(2):  # listing changes nothing: the second listing is the same
            listed = Listing.of(self.call(approvals.pending()))
            assert [s.id for s in listed] == ["appr_a", "appr_c"]
            assert list(listed.skipped) == ["appr_bad"] and "appr_bad" in listed.skipped["appr_bad"]
        # Of one session: its readable approvals (the damaged one may be named: its session is unknown).
        assert [s.id for s in self.call(approvals.pending(session_id="s2"))] == ["appr_c"]
        assert self.call(approvals.decide("appr_c", True, None)).status == "approved"

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

    def test_an_interrupted_calls_answer_is_recorded_and_reopen_clears_it(self, approvals: Any) -> None:
        """`decide(..., action=, result=)` keeps the human's answer to an interrupted call (issue #17)."""
        self.call(approvals.save(sample_snapshot("appr_int").model_copy(update={"kind": "interrupted"})))
        decided = self.call(approvals.decide("appr_int", True, "from the log", action="record", result={"sent": 1}))
        assert (decided.status, decided.action, decided.result) == ("approved", "record", {"sent": 1})
        assert self.call(approvals.load("appr_int")) == decided
        self.call(approvals.reopen("appr_int"))
        reopened = self.call(approvals.load("appr_int"))
        assert (reopened.status, reopened.action, reopened.result) == ("pending", None, None)

    def test_an_action_on_an_ordinary_approval_is_refused_and_writes_nothing(self, approvals: Any) -> None:
        plain = sample_snapshot("appr_plain")
        self.call(approvals.save(plain))
        with pytest.raises(InvalidDecisionError):
            self.call(approvals.decide("appr_plain", True, None, action="rerun"))
        assert self.call(approvals.load("appr_plain")) == plain
