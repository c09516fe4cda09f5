"""The `lousho` commands that README.md's and docs/fleet.md's CLI blocks print work as printed, in their order
(issue #15: the README's fork command failed with `no tool call 'b1' in the forked checkpoint`).

Each block's lines run in bash, as pasted, against a real worker serving the web example's `booker`
(`examples.webapp.agents:app`, the worker the README starts just before). The one thing a reader fills in,
the approval id (`appr_...`), is the one `lousho approvals` shows; between lines the test waits as a reader
would for the fleet to settle (an approval goes on in the background)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import lousho
from lousho.formats import written_formats
from tests.ops.conftest import LOUSHO, ROOT, DemoFleet, cli_env, run_clean

pytestmark = [pytest.mark.slow, pytest.mark.workers]


def bash_block(document: Path, after_heading: str) -> list[str]:
    """The command lines of the first ```bash block after `after_heading` (comments dropped)."""
    text = document.read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text[text.index(after_heading) :], re.S)
    assert block is not None, f"no bash block after {after_heading!r} in {document.name}"
    lines = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line]


def run_as_pasted(fleet: DemoFleet, lines: list[str]) -> dict[str, str]:
    """Run each line in bash (the venv's `lousho` first on PATH); the outputs by line."""
    env = {**cli_env(fleet), "PATH": f"{Path(LOUSHO).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
    outputs: dict[str, str] = {}
    for line in lines:
        command = line
        if "appr_..." in line:
            pending = fleet.client.approvals("chat-42")
            assert pending, "nothing to approve"
            command = line.replace("appr_...", pending[0].id)
        done = run_clean(["bash", "-c", command], cwd=ROOT, env=env, timeout_s=90)
        assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
        outputs[line] = done.stdout
        if " approve " in f" {line} ":
            fleet.wait_for("chat-42", "finished")  # the fleet goes on at once; a reader looks a moment later
        if " fork " in f" {line} " and "--run" in line:
            fleet.wait_for("chat-42.porto", "finished")
    return outputs


def test_the_readmes_cli_block_works_as_printed_fork_included(demo_fleet: DemoFleet) -> None:
    demo_fleet.start_worker("examples.webapp.agents:app")
    lines = bash_block(ROOT / "README.md", "### The `lousho` command")
    assert any(line.startswith("lousho fork ") for line in lines)
    outputs = run_as_pasted(demo_fleet, lines)
    fork = next(line for line in lines if line.startswith("lousho fork "))
    assert outputs[fork].splitlines()[0] == "chat-42.porto"
    forked = demo_fleet.client.checkpoint("chat-42.porto")
    assert forked is not None and forked.status == "finished"
    patched = [m for m in forked.messages if m.role == "tool" and m.tool_call_id == "book-1"]
    assert [json.loads(m.content or "{}").get("booked") for m in patched] == ["Casa Porto"]
    compare = next(line for line in lines if line.startswith("lousho compare "))
    assert "diverged at step" in outputs[compare]


def test_the_fleet_docs_cli_block_works_as_printed(demo_fleet: DemoFleet) -> None:
    demo_fleet.start_worker("examples.webapp.agents:app")
    lines = bash_block(ROOT / "docs" / "fleet.md", "### The `lousho` command")
    outputs = run_as_pasted(demo_fleet, lines)
    assert "chat-42" in outputs["lousho sessions --status awaiting-approval"]
    compare = next(line for line in lines if line.startswith("lousho compare "))
    assert "diverged at step" in outputs[compare]


def test_the_upgrading_docs_look_at_what_runs_block_works_as_printed(demo_fleet: DemoFleet) -> None:
    """docs/upgrading.md's first step (issue #35): the version here and every live worker's lousho and protocols."""
    demo_fleet.start_worker("examples.webapp.agents:app")
    lines = bash_block(ROOT / "docs" / "upgrading.md", "### 1. Look at what runs")
    outputs = run_as_pasted(demo_fleet, lines)
    assert outputs["lousho --version"].strip() == f"lousho {lousho.__version__}"
    assert f"{lousho.__version__}; messages 1" in outputs["lousho workers"]
    listed = json.loads(outputs["lousho workers --json"])
    assert [(w["version"], w["agents"]) for w in listed] == [(lousho.__version__, ["booker", "writer"])]
    assert listed[0]["formats"] == written_formats()
