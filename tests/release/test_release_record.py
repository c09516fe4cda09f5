"""Releases are recorded in the repository, not in git tags alone (issue #35): `releases.toml` names each
release's version and the commit of main it was built from, and the version lives in one place."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib.metadata import version
from pathlib import Path

import lousho
from tests.ops.test_cli import lousho as run_lousho

ROOT = Path(__file__).resolve().parents[2]


def recorded_releases() -> list[dict[str, str]]:
    releases: list[dict[str, str]] = tomllib.loads((ROOT / "releases.toml").read_text())["release"]
    return releases


def release_number(text: str) -> tuple[int, ...]:
    """The release part of a PEP 440 version: `0.2.0.dev0` -> (0, 2, 0)."""
    match = re.match(r"(\d+(?:\.\d+)*)", text)
    assert match, text
    return tuple(int(part) for part in match.group(1).split("."))


def test_the_version_printed_is_the_installed_packages_and_the_one_in_the_source() -> None:
    assert lousho.__version__ == version("lousho")
    assert run_lousho("--version").stdout.strip() == f"lousho {lousho.__version__}"


def file_at(commit: str, path: str) -> str:
    shown = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0, f"{path} at {commit}: {shown.stderr.strip()}"
    return shown.stdout


def version_at(commit: str) -> str:
    """The version a wheel built from `commit` carries: pyproject's, or lousho/_version.py's once it is dynamic."""
    static = re.search(r'^version = "([^"]+)"', file_at(commit, "pyproject.toml"), re.MULTILINE)
    if static:
        return static.group(1)
    dynamic = re.search(r'^__version__ = "([^"]+)"', file_at(commit, "lousho/_version.py"), re.MULTILINE)
    assert dynamic, f"no version at {commit}"
    return dynamic.group(1)


def test_every_recorded_release_is_a_commit_of_main_that_carries_its_version() -> None:
    for release in recorded_releases():
        assert version_at(release["commit"]) == release["version"]


def test_main_between_releases_carries_a_later_number_than_every_release() -> None:
    newest = max(release_number(release["version"]) for release in recorded_releases())
    assert release_number(lousho.__version__) > newest or lousho.__version__ in {
        release["version"] for release in recorded_releases()
    }


def test_the_changelog_has_an_entry_for_every_release() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for release in recorded_releases():
        assert f"## {release['version']} (" in changelog
