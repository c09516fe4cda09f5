"""The help and the range of each `FleetSettings` flag (`--lease-ttl-s`, ...), read from the field itself: its
docstring's first sentence and its default, so `lousho -h` says what a flag means, not its name again, and a
negative time or count is a usage error (issue #32)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re
from functools import cache
from typing import Any

from lousho.fleet.settings import FleetSettings

__all__ = ["fleet_option_help", "fleet_option_range"]


@cache
def _field_docs() -> dict[str, str]:
    """Each field's docstring (the string under it in the class body), as written in lousho/fleet/settings.py."""
    tree = ast.parse(inspect.getsource(FleetSettings))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for statement, following in itertools.pairwise(body):
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[statement.target.id] = " ".join(str(following.value.value).split())
    return docs


def _first_sentence(text: str) -> str:
    """The docstring's first sentence, without its asides in parentheses and its backticks."""
    plain = re.sub(r"\s*\([^()]*\)", "", text).replace("`", "")
    return plain.split(". ")[0].rstrip(".")


def fleet_option_help(name: str) -> str:
    """'<what it is>; default <value>' for the field `name` (its own words when they say the default)."""
    field = next(f for f in dataclasses.fields(FleetSettings) if f.name == name)
    default = field.default
    shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
    sentence = _first_sentence(_field_docs().get(name, name))
    return sentence if "default" in sentence else f"{sentence}; default {shown}"


def fleet_option_range(name: str) -> dict[str, Any]:
    """typer's `min=` for a time or a count: none is negative."""
    field = next(f for f in dataclasses.fields(FleetSettings) if f.name == name)
    return {"min": 0} if field.type in ("float", "int", "float | None", "int | None") else {}
