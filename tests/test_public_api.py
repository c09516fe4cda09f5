"""The exported API (httpx-style): what `lousho` promises to keep, and the engine's independence."""

from __future__ import annotations

import subprocess
import sys

import pytest

import lousho
import lousho.providers
import lousho.scheduler
import lousho.stores
import lousho.worker

DESIGN_NAMES = {  # DESIGN.md: 'Public API (keep these names; add freely around them)'
    "Agent",
    "define_tool",
    "ToolContext",
    "AgentExecutor",
    "resume_after_approval",
    "create_agent",
    "memory_store",
    "get_checkpoint_history",
    "compare_trajectories",
    "Message",
    "ToolCall",
    "Usage",
    "Checkpoint",
    "RunResult",
    "ModelRequest",
    "ModelResponse",
    "LLMProvider",
    "SDKError",
    "SessionAwaitingApprovalError",
    "ConfigurationError",
    "PropagatingToolError",
}


def test_the_names_design_promises_are_exported() -> None:
    assert set(lousho.__all__) >= DESIGN_NAMES


def test_every_exported_name_exists() -> None:
    for module in (lousho, lousho.providers, lousho.stores, lousho.worker, lousho.scheduler):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"


def test_the_stores_and_fleet_entry_points_are_where_design_says() -> None:
    from lousho.providers import ScriptedProvider
    from lousho.scheduler import Client
    from lousho.stores import FileStore, RedisStore, SqliteStore, SqlStore
    from lousho.worker import create_app

    assert all(
        callable(x) for x in (ScriptedProvider, Client, FileStore, RedisStore, SqliteStore, SqlStore, create_app)
    )


def test_the_store_bundle_protocol_and_the_mapping_store_are_exported() -> None:
    """Issue #16: the one shape of every store, the mapping store, and the store-URL registry."""
    assert {"StoreBundle", "mapping_store"} <= set(lousho.__all__)
    assert {"MappingStore", "dbm_store", "mapping_store", "open_store", "register_store"} <= set(lousho.stores.__all__)
    assert isinstance(lousho.mapping_store({}), lousho.StoreBundle)


def test_every_error_is_an_sdk_error_with_a_code() -> None:
    errors = [getattr(lousho, n) for n in lousho.__all__ if n.endswith("Error") and n != "PropagatingToolError"]
    for error in errors:
        assert issubclass(error, lousho.SDKError), error
        assert error.code.startswith("LOUSHO_"), error


def test_the_engine_imports_neither_celery_nor_redis() -> None:
    probe = "import sys, lousho, lousho.engine, lousho.executor, lousho.agent; print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu', 'redis', 'sqlalchemy')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


RUN_LOOP = {"lousho.run", "lousho.executor", "lousho.pausing", "lousho.subagents", "lousho.agent"}


def test_the_web_apps_client_loads_neither_the_worker_nor_the_run_loop() -> None:
    """`lousho.scheduler` (the `Client`, the reaper) needs the fleet's protocol (`lousho.fleet`), the
    stores and the engine's data types, never the agents' code (issue #14)."""
    code = "import sys, lousho.scheduler; print('\\n'.join(m for m in sys.modules if m.startswith('lousho')))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert "lousho.scheduler.client" in loaded and "lousho.fleet" in loaded
    assert sorted(m for m in loaded if m.startswith("lousho.worker")) == []
    assert sorted(loaded & RUN_LOOP) == []


def test_the_run_loops_names_still_import_from_lousho() -> None:
    assert lousho.create_agent.__module__ == "lousho.agent"
    assert lousho.AgentExecutor.__module__ == "lousho.executor"
    with pytest.raises(AttributeError):
        _ = lousho.no_such_name  # type: ignore[attr-defined]
