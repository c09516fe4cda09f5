"""`python -m chaos [--long] [--markdown FILE] [pytest args...]`: run the chaos suite and print its table.

Quick mode (the default) is what CI runs as part of the test suite (a few minutes); `--long` runs every
scenario at full size (1,000 sessions of load, hundreds of sessions under kills: well under 20 minutes
on a 2-core machine). Both start everything they need: a private Redis (or REDIS_URL), real workers.
The table (trials, faults injected, violations found, time, figures) is printed at the end and, with
`--markdown FILE`, written as a Markdown table for docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.harness import render_table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="full-size scenarios (run by hand)")
    parser.add_argument("--seed", type=int, help="random seed of the scenarios (LOUSHO_CHAOS_SEED)")
    parser.add_argument("--markdown", type=Path, help="also write the table as Markdown to this file")
    options, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="lousho-chaos-") as folder:
        report = Path(folder) / "rows.jsonl"
        env = {**os.environ, "LOUSHO_CHAOS": "long" if options.long else "quick", "LOUSHO_CHAOS_REPORT": str(report)}
        if options.seed is not None:
            env["LOUSHO_CHAOS_SEED"] = str(options.seed)
        started = time.monotonic()
        command = [sys.executable, "-m", "pytest", "tests/chaos", "-q", "-p", "no:cacheprovider", *pytest_args]
        status = subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
        elapsed = time.monotonic() - started
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    mode = "long" if options.long else "quick"
    print(f"\nlousho chaos suite, {mode} mode: {len(rows)} scenarios in {elapsed:.0f} s, "
          f"{sum(len(r['violations']) for r in rows)} violations, pytest exit status {status}")  # fmt: skip
    for line in render_table(rows):
        print(line)
    if options.markdown:
        machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        header = f"{mode} mode, {len(rows)} scenarios, {elapsed:.0f} s in all ({machine}):\n\n"
        options.markdown.write_text(header + "\n".join(render_table(rows, markdown=True)) + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
