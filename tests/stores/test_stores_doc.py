"""docs/stores.md and the README's stores part (issue #16): the six stores in one table of capabilities, and every
block and command about the mapping store and the URL registry run as a user runs them (a fresh interpreter, the
`lousho` console script) in a fresh folder."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.ops.conftest import LOUSHO, ROOT, run_clean

DOC = (ROOT / "docs" / "stores.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYTHON = re.findall(r"```python\n(.*?)```", DOC, re.S)
BASH = re.findall(r"```bash\n(.*?)```", DOC, re.S)
STORES = [
    "memory_store()",
    "SqliteStore(path)",
    "SqlStore(url)",
    "FileStore(dir)",
    "RedisStore(url)",
    "mapping_store(mapping)",
]


def _clean_env() -> dict[str, str]:
    """This environment without any lousho or Redis setting: the command line says where the store is."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"}


def _python(block: str, cwd: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def _lousho(command: str, cwd: Path) -> str:
    words = shlex.split(command)
    assert words[0] == "lousho", command
    done = run_clean([LOUSHO, *words[1:]], cwd=cwd, env={**_clean_env(), "COLUMNS": "200"})
    assert done.returncode == 0, (command, done.stderr[-3000:])
    return done.stdout


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the table whose header line starts with `header`, as cells."""
    lines = text[text.index(header) :].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_stores_doc_lists_the_six_stores_in_one_table_of_capabilities() -> None:
    header = "| Store | Where | Several processes | History ring, fork |"
    assert DOC.count("| Store | Where |") == 1, "the stores are in one table"
    rows = _table_rows(DOC, header)
    assert [row[0].strip("`").split("`")[0] for row in rows] == STORES
    assert len({len(row) for row in rows}) == 1, "every store has every capability column"
    assert all(row[4] == "yes" for row in rows), "every store has sessions(status=), prune() and delete()"


def test_the_readme_lists_the_same_six_stores() -> None:
    rows = _table_rows(README, "| Store | Where | Several processes | History |")
    assert [row[0].strip("`") for row in rows] == STORES


def test_the_mapping_store_block_runs_and_the_cli_reads_its_dbm_file(tmp_path: Path) -> None:
    block = next(block for block in PYTHON if "dbm_store(" in block)
    assert _python(block, tmp_path) == ["Hello!", "['lousho:cp/chat-42', 'lousho:hist/chat-42']", "['chat-7']"]
    commands = [line for block in BASH if "dbm://" in block for line in block.strip().splitlines()]
    assert len(commands) == 2
    sessions, history = (_lousho(command, tmp_path) for command in commands)
    assert re.search(r"chat-7\s.*finished\s.*greeter", sessions), sessions
    assert "history of chat-7" in history and "Saved." in history, history
    readme_command = re.search(r"`(lousho --store-url dbm://\S+ sessions)`", README)
    assert readme_command is not None, "the README shows how the CLI reads a dbm file"
    assert re.search(r"chat-7\s.*finished", _lousho(readme_command.group(1), tmp_path))


def test_the_registry_block_runs(tmp_path: Path) -> None:
    block = next(block for block in PYTHON if "register_store(" in block)
    assert _python(block, tmp_path) == ["MappingStore"]


def test_the_history_block_runs_as_pasted(tmp_path: Path) -> None:
    """Issue #32: it used `await` at the top level and a `store` it never made."""
    block = next(block for block in PYTHON if "get_checkpoint_history" in block)
    printed = _python(block, tmp_path)
    assert re.fullmatch(r"1 finished \S+ 2", printed[0]), printed  # system prompt none: the input and the answer
    assert printed[-1] == "0 0"


def test_the_codec_block_names_the_extras_it_needs_and_runs(tmp_path: Path) -> None:
    """Issue #32: the block needs `cryptography` and `zstandard`; the text before it says so."""
    block = next(block for block in PYTHON if "PayloadCodec(" in block)
    before = DOC[: DOC.index(block)]
    assert "pip install 'lousho[encryption,zstd]'" in before[before.rindex("###") :]
    assert _python(block, tmp_path) == ["['card 4242', 'ok']", "LOUSHO_PAYLOAD_KEY"]
