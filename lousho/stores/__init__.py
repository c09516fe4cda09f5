"""Stores: where checkpoints and approvals live. Each bundle has `.checkpoints` and `.approvals`."""

from lousho.stores.memory import MemoryApprovalStore, MemoryCheckpointStore, MemoryStore, memory_store

__all__ = ["MemoryApprovalStore", "MemoryCheckpointStore", "MemoryStore", "memory_store"]
