"""docs/stores.md's payload codec section (issue #17): its block runs as a user runs it (a fresh interpreter in a
fresh folder) and prints what the doc says; the costs it quotes are the figures committed in docs/bench/codec.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.ops.conftest import ROOT

DOC = (ROOT / "docs" / "stores.md").read_text(encoding="utf-8")
SECTION = DOC.split("### Compression and encryption: the payload codec", 1)[1].split("\n### ", 1)[0]
BENCH = (ROOT / "docs" / "bench" / "codec.md").read_text(encoding="utf-8")


def test_the_codec_block_rotates_a_key_and_names_the_missing_one(tmp_path: Path) -> None:
    block = re.findall(r"```python\n(.*?)```", SECTION, re.S)[0]
    done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["['card 4242', 'ok']", "LOUSHO_PAYLOAD_KEY"]
    assert "prints `['card 4242', 'ok']` and `LOUSHO_PAYLOAD_KEY`" in SECTION


def _bench_figure(row: str, column: int) -> str:
    line = next(line for line in BENCH.splitlines() if line.startswith(f"| {row} |"))
    return line.strip("|").split("|")[column].strip()


def test_the_costs_the_doc_quotes_are_the_committed_bench_figures() -> None:
    quoted = {
        "off": _bench_figure("off", 1),
        "zstd + encryption": _bench_figure("zstd + encryption", 1),
        "zlib + encryption": _bench_figure("zlib + encryption", 1),
    }
    assert f"from {quoted['off']} off to {quoted['zstd + encryption']} with zstd" in SECTION
    assert f"({quoted['zlib + encryption']} with zlib)" in SECTION
    saves = [line for line in BENCH.splitlines() if line.count("|") == 6 and line.endswith("x |")]
    ratios = {line.strip("|").split("|")[0].strip(): line.strip("|").split("|")[3].strip() for line in saves}
    for name in ("zstd + encryption", "zlib + encryption", "encryption only"):
        assert ratios[name] in SECTION, (name, ratios[name])
