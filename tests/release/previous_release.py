"""The previous release, built and installed the way a user gets it (issue #35): its recorded commit
(releases.toml) exported with `git archive` into a temporary folder, its wheel built there with
`pip wheel --no-deps`, installed with its dependencies into a venv of its own. Nothing is written into
the repository tree; the commit must be in the clone (it is a commit of main).

`shared_release` builds it once per test run, for every test file and pytest-xdist process that asks (each build
took 18-22 s in CI; issue #33)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    wheel: Path
    venv: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def lousho(self) -> str:
        return str(self.venv / "bin" / "lousho")


def newest_release() -> dict[str, str]:
    """The newest release recorded in releases.toml (its version and commit)."""
    releases: list[dict[str, str]] = tomllib.loads((ROOT / "releases.toml").read_text())["release"]
    return max(releases, key=lambda r: tuple(int(part) for part in r["version"].split(".")))


def _run(command: list[str], **options: object) -> str:
    done = subprocess.run(command, capture_output=True, text=True, **options)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return str(done.stdout)


def build_release(folder: Path, recorded: dict[str, str] | None = None) -> Release:
    """Build the wheel of `recorded` (default: the newest release) from its commit and install it in a venv."""
    recorded = recorded or newest_release()
    commit = recorded["commit"]
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    assert known.returncode == 0, (
        f"release {recorded['version']}'s commit {commit} is not in this clone: fetch main's full history "
        "(git fetch --unshallow) to test upgrades from it"
    )
    source, dist, venv = folder / "source", folder / "dist", folder / "venv"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)], cwd=folder)
    (wheel,) = dist.glob("lousho-*-py3-none-any.whl")
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=folder)
    return Release(recorded["version"], commit, wheel, venv)


def shared_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The newest release with its `encryption` extra (`pip install 'lousho[encryption]'`), built once per run.

    The first pytest process to ask builds it under a file lock in the run's temporary folder (shared by the
    xdist processes); the others wait for the lock and find it built.
    """
    base = tmp_path_factory.getbasetemp()
    run_folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    recorded = newest_release()
    folder = run_folder / f"release-{recorded['version']}-{recorded['commit'][:12]}"
    lock_file = run_folder / f"{folder.name}.lock"
    with lock_file.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / "built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build in this run left
            release = build_release(folder, recorded)
            _run([release.python, "-m", "pip", "install", "-q", f"{release.wheel}[encryption]"], cwd=folder)
            (folder / "built").write_text(release.wheel.name)
        (wheel,) = (folder / "dist").glob("lousho-*-py3-none-any.whl")
        return Release(recorded["version"], recorded["commit"], wheel, folder / "venv")
