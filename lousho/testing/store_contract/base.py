"""`StoreContractBase`: the fixtures and hooks every part of the contract shares."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lousho.checkpoint import maybe_await
from lousho.errors import UnsealedValueError

__all__ = ["StoreContractBase"]


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

    def write_raw_approval(self, approvals: Any, approval_id: str, raw: str) -> None:
        """Optional hook: store `raw` as a pending approval's snapshot, unchecked."""
        raise NotImplementedError

    def plant_approval(self, approvals: Any, approval_id: str, raw: str) -> None:
        try:
            self.write_raw_approval(approvals, approval_id, raw)
        except NotImplementedError:
            pytest.skip("implement write_raw_approval() to check how the store lists approvals it cannot read")

    def refuses_unsealed(self, checkpoints: Any, session_id: str) -> bool:
        """Whether the store refuses the session's planted record as not sealed under its payload keys
        (`UnsealedValueError`, issue #31: a store with keys reads an older lousho's plain record only when
        migrating); the record stays as it was. False: the store read it, and the test goes on."""
        try:
            self.call(checkpoints.load(session_id))
        except UnsealedValueError as refused:
            assert refused.session_id == session_id, refused
            return True
        return False

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
