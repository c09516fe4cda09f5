"""Every format that crosses processes carries its version, defined in one place (`lousho.formats`, issue #35);
a reader refuses what a newer lousho wrote rather than misread it, and reads what an older one did."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import pytest

from lousho import CorruptApprovalError, CorruptCheckpointError, NewerFormatError
from lousho.approvals import decode_snapshot
from lousho.checkpoint import decode_checkpoint
from lousho.fleet.protocol import PROTOCOL_HEADER, message_protocol, speaks, too_new
from lousho.formats import APPROVAL_SCHEMA_VERSION, MESSAGE_PROTOCOL, SCRIPT_PROTOCOL, written_formats
from lousho.stores.registry import open_store
from lousho.testing.store_contract.samples import sample_checkpoint
from tests.ops.test_cli import lousho as run_lousho


def lua_scripts() -> list[str]:
    found = []
    for package in ("lousho.stores", "lousho.worker", "lousho.fleet"):
        folder = resources.files(package).joinpath("lua")
        for entry in folder.iterdir():
            for script in entry.iterdir() if entry.is_dir() else [entry]:
                if script.name.endswith(".lua"):
                    found.append(script.read_text(encoding="utf-8"))
    return found


def test_every_lua_script_states_the_script_protocol_it_keeps() -> None:
    scripts = lua_scripts()
    assert len(scripts) >= 20
    for source in scripts:
        declared = re.search(r"^-- protocol: (\d+)", source, re.MULTILINE)
        assert declared is not None and int(declared.group(1)) == SCRIPT_PROTOCOL, source[:200]


def test_a_checkpoint_a_newer_lousho_wrote_is_refused_as_newer_not_misread() -> None:
    newer = sample_checkpoint("s1").model_copy(update={"schema_version": 2}).model_dump_json()
    with pytest.raises(NewerFormatError, match="schema version 2 is newer than this lousho reads") as refused:
        decode_checkpoint("s1", newer)
    assert isinstance(refused.value, CorruptCheckpointError)  # who caught damage before still catches it
    assert refused.value.code == "LOUSHO_NEWER_FORMAT"
    older = json.loads(sample_checkpoint("s1").model_dump_json())
    del older["schema_version"]  # a record from before the field: read as 1
    assert decode_checkpoint("s1", json.dumps(older)).schema_version == 1


def test_an_approval_a_newer_lousho_wrote_is_refused_and_one_of_0_1_0_is_read() -> None:
    snapshot = {"id": "a1", "tool_call": {"id": "c1", "name": "charge", "arguments": {}},
                "checkpoint": json.loads(sample_checkpoint("s1").model_dump_json())}  # fmt: skip
    assert decode_snapshot("a1", json.dumps(snapshot)).schema_version == APPROVAL_SCHEMA_VERSION  # 0.1.0's: none
    with pytest.raises(CorruptApprovalError, match="newer than this lousho reads"):
        decode_snapshot("a1", json.dumps({**snapshot, "schema_version": APPROVAL_SCHEMA_VERSION + 1}))


def test_a_message_without_the_header_is_protocol_1_and_an_unreadable_one_is_not_run() -> None:
    assert message_protocol(SimpleNamespace()) == 1  # lousho 0.1.0's messages carry none
    assert message_protocol(SimpleNamespace(**{PROTOCOL_HEADER: MESSAGE_PROTOCOL})) == MESSAGE_PROTOCOL
    assert message_protocol(SimpleNamespace(headers={PROTOCOL_HEADER: 7})) == 7
    assert too_new(message_protocol(SimpleNamespace(**{PROTOCOL_HEADER: "2"})))
    assert not too_new(MESSAGE_PROTOCOL) and too_new(MESSAGE_PROTOCOL + 1)


def test_a_worker_publishes_every_format_it_writes() -> None:
    spoken = speaks()
    assert spoken["formats"] == written_formats()
    assert set(written_formats()) == {"message", "scripts", "layout", "checkpoint", "approval"}
    assert spoken["message_protocols"] == [1, MESSAGE_PROTOCOL]


def test_lousho_show_of_a_session_a_newer_lousho_wrote_says_so_and_leaves_it(tmp_path: Path) -> None:
    """docs/upgrading.md, rolling back across a bump: the older lousho refuses, with its own code, and keeps it."""
    url = f"dbm://{tmp_path}/runs.db"
    newer = sample_checkpoint("s1").model_copy(update={"schema_version": 2}).model_dump_json()
    open_store(url).checkpoints.put_raw("s1", newer)
    shown = run_lousho("--store-url", url, "show", "s1", ok=False)
    assert shown.exit_code == 1
    assert shown.stderr.startswith("error: [LOUSHO_NEWER_FORMAT] the stored checkpoint of session 's1' was written")
    assert "do not delete it" in shown.stderr
    assert open_store(url).checkpoints.get_raw("s1") in (newer, newer.encode())  # left as it was
