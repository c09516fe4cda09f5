"""What the README walkthrough (tests/docs/test_readme_walkthrough.py, issue #15) needs: the docs' shell commands as
a reader sees them, and a reader's checkout and shell: a copy of the working tree (a git checkout of its own, issue
#33), a venv made by the README's own first line, its commands run in bash with that venv first on PATH (as `source
.venv/bin/activate` does), the ones the README sends to the background started here and ended here by pid."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.ops.conftest import ROOT, descendants, run_clean

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
GIT_IDENTITY = ["-c", "user.name=walkthrough", "-c", "user.email=walkthrough@localhost", "-c", "commit.gpgsign=false"]


def command(line: str) -> str:
    """A shell line as a command: its comment (two spaces, then `#`) and a trailing `&` dropped."""
    text = line.split("  #", 1)[0].strip()
    if text.startswith("#"):
        return ""  # a comment line
    return text[:-1].strip() if text.endswith(" &") else text


def fenced_blocks(document: Path) -> list[tuple[str, list[str]]]:
    """Each fenced block of a Markdown document: its language (maybe "") and its lines."""
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for line in document.read_text(encoding="utf-8").splitlines():
        if line.startswith("```") and current is None:
            current = []
            blocks.append((line[3:].strip(), current))
        elif line.startswith("```"):
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def python_blocks(document: Path) -> list[str]:
    return ["\n".join(lines) + "\n" for lang, lines in fenced_blocks(document) if lang == "python"]


def bash_blocks(document: Path) -> list[list[str]]:
    """The commands of each ```bash block of a document, in order."""
    return [[command(line) for line in lines if command(line)] for lang, lines in fenced_blocks(document)
            if lang == "bash"]  # fmt: skip


def shown_commands(document: Path) -> list[str]:
    """Every command a document shows: its bash blocks' lines, and the `$ ` lines of its blocks without a language
    (a command printed with its output)."""
    shown = [line for block in bash_blocks(document) for line in block]
    for lang, lines in fenced_blocks(document):
        if not lang:
            shown += [command(line[2:]) for line in lines if line.startswith("$ ")]
    return shown


def bash_block_after(document: Path, heading: str) -> list[str]:
    """The commands of the first ```bash block after `heading`."""
    text = document.read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text[text.index(heading) :], re.S)
    assert block is not None, f"no bash block after {heading!r} in {document.name}"
    return [command(line) for line in block.group(1).splitlines() if command(line)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


@dataclass
class Background:
    line: str
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Walk:
    """A reader's checkout (`checkout`), lousho home (`home`) and shell, and what was run in it."""

    root: Path
    ran: list[str] = field(default_factory=list)
    background: list[Background] = field(default_factory=list)
    failed: str | None = None
    baseline: set[int] = field(default_factory=set)
    """The processes below the test process before the walk (a session's Redis, say): not the walk's."""

    @property
    def checkout(self) -> Path:
        return self.root / "lousho"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """One part of the walk: skipped once an earlier part failed (what it needs is not there)."""
        if self.failed:
            pytest.skip(f"the walkthrough stopped at: {self.failed}")
        try:
            yield
        except BaseException:
            self.failed = name
            raise

    def copy_checkout(self) -> None:
        """The working tree as a fresh clone has it, made a git checkout of its own. Copied: the files git tracks or
        would add (as they are now, edits included); not what .gitignore names: no venv, caches or build output, and
        nothing a reader of the README left here (`myapp/` made this step fail with FileExistsError: issue #33).
        Committed in a new repository, so that `git status` in the copy tells what following the README adds."""
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True).stdout  # fmt: skip
        for name in sorted(set(listed.decode().split("\0")) - {""}):
            source = ROOT / name
            if source.is_file() or source.is_symlink():  # a tracked file deleted in the working tree is not there
                (self.checkout / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, self.checkout / name, follow_symlinks=False)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # a hook's GIT_DIR is not the copy's
        for git in (["init", "-q"], ["add", "-A"], ["commit", "-q", "--no-verify", "-m", "the working tree"]):
            subprocess.run(["git", *GIT_IDENTITY, *git], cwd=self.checkout, env=env, capture_output=True, check=True)

    def git_status(self) -> list[str]:
        """`git status --porcelain` in the copy: what the commands run so far added or changed, and .gitignore
        does not name (issue #33: following the README leaves `git status` clean)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        done = run_clean(["git", "status", "--porcelain", "--untracked-files=all"], cwd=self.checkout, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    def env(self) -> dict[str, str]:
        """A shell with nothing of lousho configured (so the local store of `home`), the copy's venv first on PATH."""
        main_bin = str(ROOT / ".venv" / "bin")
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != main_bin]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("LOUSHO_") and k not in ("REDIS_URL", "PYTHONPATH", "VIRTUAL_ENV")}  # fmt: skip
        venv = self.checkout / ".venv"
        return {**env, "PATH": os.pathsep.join([str(venv / "bin"), *path]), "VIRTUAL_ENV": str(venv),
                "LOUSHO_HOME": str(self.home), "XDG_DATA_HOME": str(self.root / "xdg"), "COLUMNS": "200"}  # fmt: skip

    def sh(self, line: str, *, shown: str | None = None, timeout_s: float = 90.0) -> str:
        """Run a line in bash in the checkout; it must succeed. `shown` is the line as printed, when `line` has a
        reader's value filled in (an approval id, a port); both are recorded as run."""
        done = run_clean(["bash", "-c", line], cwd=self.checkout, env=self.env(), timeout_s=timeout_s)
        assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-3000:])
        self.ran.append(shown or line)
        return done.stdout

    def start(self, line: str, *, shown: str | None = None) -> Background:
        """A command the README leaves running (with `&`, or in a terminal of its own), started in the background."""
        log = self.root / f"bg-{len(self.background) + 1}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(["bash", "-c", line], cwd=self.checkout, env=self.env(), stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        started = Background(line, process, log)
        self.background.append(started)
        self.ran.append(shown or line)
        return started

    def end_everything(self) -> list[int]:
        """End every background command by pid (SIGTERM, then SIGKILL), each process below it, and the local store;
        the pids of what was left (none, or it is a defect)."""
        from lousho.local_redis import LocalRedis

        every = [pid for bg in self.background for pid in [bg.process.pid, *descendants(bg.process.pid)]]
        for bg in reversed(self.background):
            if bg.process.poll() is None:
                os.kill(bg.process.pid, signal.SIGTERM)
        for bg in self.background:
            try:
                bg.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(bg.process.pid, signal.SIGKILL)
                bg.process.wait(timeout=10)
        time.sleep(0.5)  # children of a warm shutdown go a moment after their parent
        for pid in every:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        LocalRedis(self.home).stop()
        return [pid for pid in processes_mentioning(str(self.root)) if pid != os.getpid()]


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 60.0, *, log: Background | None = None) -> Any:
    """`check()`'s first truthy answer (as a reader waits and looks again), else fail naming `what` and the last
    error `check()` raised (a command that failed, an answer that was not JSON yet)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        try:
            answer = check()
            if answer:
                return answer
        except (AssertionError, OSError, ValueError, KeyError, TypeError) as error:
            last = error
        if time.monotonic() > deadline:
            tail = f"\n{log.text()[-3000:]}" if log else ""
            raise AssertionError(f"{what}: not after {timeout_s}s (last error: {last!r}){tail}")
        time.sleep(0.2)
