"""The agent fingerprint, and what changed between two of them (reference: 'Resuming with a changed agent').

Only what can be serialized counts: the model id, each tool's name with a hash
of its JSON input schema, and a hash of the instructions. Changing a tool's code
is never drift.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from lousho.tools import Tool

__all__ = ["AgentFingerprint", "Drift", "compute_fingerprint", "diff_fingerprints"]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class AgentFingerprint(BaseModel):
    """Stored part by part in every checkpoint and approval snapshot, so a mismatch can say what changed."""

    model_config = ConfigDict(frozen=True)

    model: str
    tools: dict[str, str] = Field(default_factory=dict)
    """Tool name -> SHA-256 of its JSON input schema."""
    instructions: str
    """SHA-256 of the system instructions."""
    digest: str
    """A short SHA-256 over all of the above."""


class Drift(BaseModel):
    """What differs between the saved fingerprint and the resuming agent's."""

    model: tuple[str, str] | None = None
    tools_added: list[str] = Field(default_factory=list)
    tools_removed: list[str] = Field(default_factory=list)
    tools_changed: list[str] = Field(default_factory=list)
    instructions: bool = False

    def __bool__(self) -> bool:
        return bool(self.model or self.tools_added or self.tools_removed or self.tools_changed or self.instructions)

    def describe(self) -> str:
        parts = []
        if self.model:
            parts.append(f"model {self.model[0]!r} -> {self.model[1]!r}")
        for label, names in (
            ("added", self.tools_added),
            ("removed", self.tools_removed),
            ("changed", self.tools_changed),
        ):
            if names:
                parts.append(f"tools {label}: {', '.join(names)}")
        if self.instructions:
            parts.append("instructions changed")
        return "; ".join(parts)


def compute_fingerprint(model: str, instructions: str, tools: Iterable[Tool[Any]]) -> AgentFingerprint:
    tool_hashes = {t.name: _sha(json.dumps(t.json_schema(), sort_keys=True)) for t in tools}
    instructions_hash = _sha(instructions)
    digest = _sha(json.dumps([model, sorted(tool_hashes.items()), instructions_hash]))[:16]
    return AgentFingerprint(model=model, tools=tool_hashes, instructions=instructions_hash, digest=digest)


def diff_fingerprints(saved: AgentFingerprint | None, current: AgentFingerprint) -> Drift:
    """The drift from `saved` to `current`; none when nothing was saved (compatibility rule)."""
    if saved is None or saved.digest == current.digest:
        return Drift()
    return Drift(
        model=(saved.model, current.model) if saved.model != current.model else None,
        tools_added=sorted(set(current.tools) - set(saved.tools)),
        tools_removed=sorted(set(saved.tools) - set(current.tools)),
        tools_changed=sorted(n for n in set(saved.tools) & set(current.tools) if saved.tools[n] != current.tools[n]),
        instructions=saved.instructions != current.instructions,
    )
