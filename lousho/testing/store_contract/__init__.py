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
- `StoreBundleContract`: the bundle as a whole (`lousho.StoreBundle`: `sessions(status=)`, `prune()`,
  `delete()`); skipped for a bare checkpoint store (issue #16).
- `StoreContract`: all five, what the built-in stores pass.

Store methods may be sync or async; awaitables run on an event loop owned by the test
(no pytest-asyncio needed). The optional hooks `write_raw` / `read_raw` let the suite
plant old, corrupt and foreign records; tests that need a hook skip without it.

Layout: `samples` (sample records, `race`), `base` (`StoreContractBase`), `checkpoints`,
`history`, `approvals` and `bundle` (one part each). `pytest.register_assert_rewrite(
"lousho.testing.store_contract")` covers all of them.
"""

from __future__ import annotations

from lousho.testing.store_contract.approvals import ApprovalStoreContract
from lousho.testing.store_contract.base import StoreContractBase
from lousho.testing.store_contract.bundle import StoreBundleContract
from lousho.testing.store_contract.checkpoints import CheckpointStoreContract, VersionedStoreContract
from lousho.testing.store_contract.history import HistoryStoreContract
from lousho.testing.store_contract.samples import WRITERS, race, sample_checkpoint, sample_snapshot

__all__ = [
    "ApprovalStoreContract",
    "CheckpointStoreContract",
    "HistoryStoreContract",
    "StoreBundleContract",
    "StoreContract",
    "StoreContractBase",
    "VersionedStoreContract",
    "WRITERS",
    "race",
    "sample_checkpoint",
    "sample_snapshot",
]


class StoreContract(
    CheckpointStoreContract, VersionedStoreContract, HistoryStoreContract, ApprovalStoreContract, StoreBundleContract
):
    """Everything the built-in stores pass."""
