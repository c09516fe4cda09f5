"""Every Python code block of docs/providers.md runs as-is, in a fresh interpreter, against the fake servers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "providers.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_doc_has_an_example_for_each_provider() -> None:
    assert len(BLOCKS) >= 4
    assert any("OpenAIProvider(" in b and "base_url" in b for b in BLOCKS)
    assert any("AnthropicProvider(" in b for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_providers_doc_python_block_runs(block: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
