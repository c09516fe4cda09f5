"""The README says what to install before each command that needs it, and its commands run in one activated venv
(issue #15: `No such command 'flower'`, the provider blocks said to "run as they are" without their SDKs, a
traceback from `python -m chaos` without pytest, and `.venv/bin/lousho` once, then bare commands)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
EXTRAS: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
    "optional-dependencies"
]


def installs_before(position: int) -> set[str]:
    """The extras the README has named in an install (`pip install -e '.[a,b]'`, `lousho[a]`) before `position`."""
    named = re.findall(r"pip install[^`\n]*?(?:\.|lousho)\[([a-z,]+)\]", README[:position])
    return {extra for group in named for extra in group.split(",")}


def requirement_names(extra: str) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower() for requirement in EXTRAS[extra]}


def test_the_readme_activates_its_venv_once_right_after_making_it_and_then_uses_bare_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    first_line = first_block.group(1).splitlines()[0]
    assert first_line.startswith("python3 -m venv .venv && source .venv/bin/activate"), first_line
    assert README.count(".venv/bin/") == 1, "a command names the venv's bin folder after it was activated"
    assert "lousho demo" in first_block.group(1) and ".venv/bin/lousho" not in README


def test_every_install_the_readme_needs_is_named_before_its_command_and_exists_in_pyproject() -> None:
    needs = {  # a command or block the README shows -> (the extra it needs, a package that extra must bring)
        "celery -A myapp.lousho_app:app flower": ("flower", "flower"),
        "from lousho.providers.openai import OpenAIProvider": ("openai", "openai"),
        "from lousho.providers.anthropic import AnthropicProvider": ("anthropic", "anthropic"),
        "uvicorn examples.webapp.app:app": ("web", "uvicorn"),
        "python -m chaos": ("dev", "pytest"),
    }
    for command, (extra, package) in needs.items():
        at = README.find(command)
        assert at >= 0, f"the README no longer shows {command!r}"
        named = installs_before(at + len(command) + 120)  # said before it, or right with it
        assert extra in named, f"nothing tells the reader to install the {extra!r} extra before {command!r}"
        assert extra in EXTRAS, f"pyproject.toml has no {extra!r} extra"
        assert package in requirement_names(extra), f"the {extra!r} extra does not install {package}"
    every = installs_before(len(README))
    assert every <= set(EXTRAS), f"the README installs extras pyproject.toml lacks: {every - set(EXTRAS)}"
