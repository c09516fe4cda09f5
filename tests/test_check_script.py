"""The test command, `bash scripts/check`, and its `--fast` form (issue #33).

What the script runs, in which order and with which arguments, is checked on a copy of it in a temporary folder
whose `.venv/bin` holds stand-ins that record each call: the real tools run whenever the script itself runs (CI's
.ci/run), and a test that ran the real suite from inside the suite would run it twice. The `workers` marker that
`--fast` leaves out is kept honest by tests/fixtures/workers.py, checked here on a real pytest run."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.workers import starts_workers

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = '#!/usr/bin/env bash\nprintf "%q " "$(basename "$0")" "$@" >> "$(dirname "$0")/../../calls"\necho >> "$(dirname "$0")/../../calls"\n'
CHECKS = [
    ["python", "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", ".[dev]"],
    ["ruff", "check", "."],
    ["ruff", "format", "--check", "lousho"],
    ["mypy"],
    ["lint-imports", "--no-cache"],
]
PARALLEL = ["-n", "4", "--dist", "loadfile"]
"""Four pytest processes, a test file each at a time (pytest-xdist; issue #33)."""
FAST = ["python", "-m", "pytest", "-m", "not workers and not slow", "-rfEs", *PARALLEL]


def run_check(folder: Path, *args: str) -> list[list[str]]:
    """`bash scripts/check ARGS` in a copy of the script over stand-in tools; each call it made, as argv."""
    (folder / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "check", folder / "scripts" / "check")
    bin_dir = folder / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("python", "ruff", "mypy", "lint-imports"):
        (bin_dir / tool).write_text(STAND_IN)
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "LOUSHO_TEST_PROCESSES"}  # the default count, not a run's
    done = subprocess.run(["bash", str(folder / "scripts" / "check"), *args], capture_output=True, text=True,
                          timeout=60, check=False, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [shlex.split(line) for line in (folder / "calls").read_text().splitlines()]


ON_LOUSHOS_POOL = ["python", "-m", "pytest", "-q", "-rfEs", *PARALLEL, *(f"tests/fleet/{name}.py" for name in (
    "test_fleet_crashes", "test_sub_agents_fleet", "test_fleet_approvals_and_abort", "test_interrupted_calls_fleet",
    "test_death_detection", "test_reaper")), "tests/telemetry/test_traces_fleet.py"]  # fmt: skip
"""The fleet's guarantees run again on lousho's pool (issue #29)."""


@pytest.mark.parametrize(
    ("args", "tests"),
    [
        ([], [["python", "-m", "pytest", "--ignore=tests/chaos", "-rfEs", *PARALLEL], ON_LOUSHOS_POOL,
              ["python", "-m", "chaos", *PARALLEL]]),
        (["tests/stores", "-x"], [["python", "-m", "pytest", "tests/stores", "-x"]]),
        (["--fast"], [FAST]),
        (["--fast", "tests/stores", "-k", "not slow things"], [[*FAST, "tests/stores", "-k", "not slow things"]]),
    ],
    ids=["no arguments", "arguments", "--fast", "--fast with arguments"],
)
def test_scripts_check_runs_lint_types_and_contracts_then_the_tests_its_arguments_name(
    tmp_path: Path, args: list[str], tests: list[list[str]]
) -> None:
    assert run_check(tmp_path, *args) == [*CHECKS, *tests]


@pytest.mark.parametrize(
    ("command", "starts"),
    [
        ([sys.executable, "-m", "celery", "-A", "app", "worker", "--pool=solo"], True),
        (["/venv/bin/lousho", "--lease-ttl-s", "3", "worker", "--app", "a:app"], True),
        (["bash", "-c", "lousho worker --app myapp.lousho_app:app --concurrency 2"], True),
        (["/venv/bin/lousho", "demo"], True),
        (["/venv/bin/lousho", "demo", "--in-process"], False),
        (["bash", "-c", 'lousho enqueue booker "hi" --no-require-worker'], False),
        (["bash", "-c", "celery -A myapp.lousho_app:app flower --port=5555"], False),
    ],
)
def test_the_workers_marker_knows_a_command_that_starts_workers(command: list[str], starts: bool) -> None:
    assert starts_workers(command) is starts


def test_a_test_that_starts_a_worker_without_the_workers_marker_fails(tmp_path: Path) -> None:
    (tmp_path / "test_unmarked.py").write_text(
        "import subprocess, sys\n\n\ndef test_unmarked():\n"
        "    subprocess.run([sys.executable, '-m', 'celery', '-A', 'no_such_app', 'worker'], check=False)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.fixtures.workers",
         f"--rootdir={tmp_path}", str(tmp_path / "test_unmarked.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:]
    assert "test_unmarked starts worker processes" in done.stdout and "is not marked `workers`" in done.stdout
