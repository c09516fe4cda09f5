"""Drift between runs (`lousho eval --drift A B`): how runs drift apart, in the shape of
`compare_trajectories(a, b).drift` (reference: 'Fork and replay': the tool-order, argument, step-count and finish-reason differences).

A and B are session ids, or groups of sessions written with `*` (any characters) and `?` (one
character), which no session id can hold: `'trip.fork-*'` is every fork of `trip`. A session against a
group is compared with each member (a baseline against its forks); two groups are paired by what their
wildcards matched (`a.fork-2` with `b.fork-2`), and a member without a partner is listed as unpaired
(issue #16).
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, Field

from lousho.errors import ConfigurationError
from lousho.operations.target import Target, load_session, sync
from lousho.stores.listing import Listing
from lousho.trajectory import TrajectoryDrift, compare_trajectories

__all__ = ["DriftPair", "DriftReport", "describe_drift", "drift_report", "report_lines"]

_WILDCARDS = re.compile(r"[*?]")


class DriftPair(BaseModel):
    """One pair of runs: where they diverged and their drift (`TrajectoryDrift`, the reference's shape)."""

    a: str
    b: str
    diverged_at: int | None
    drift: TrajectoryDrift


class DriftReport(BaseModel):
    """What `eval --drift --json` prints."""

    pairs: list[DriftPair]
    drifted: int
    """How many pairs have any drift."""
    unpaired: dict[str, list[str]] = Field(default_factory=lambda: {"a": list[str](), "b": list[str]()})
    """Members of a group with no partner in the other (two groups only)."""


def _pattern(group: str) -> re.Pattern[str]:
    """The regex of a group: each `*` and `?` captures what it matched (what pairs two groups)."""
    parts = [f"({'.*' if c == '*' else '.'})" if c in "*?" else re.escape(c) for c in group]
    return re.compile("".join(parts))


def _members(target: Target, group: str) -> dict[tuple[str, ...], str]:
    """The sessions of `group`, each under what its wildcards matched; a group matching none is an error."""
    listed: Listing[str] = Listing.of(sync(target.bundle.sessions(None)))
    pattern = _pattern(group)
    members = {m.groups(): s for s in sorted(listed) if (m := pattern.fullmatch(s))}
    if not members:
        raise ConfigurationError(f"no session matches {group!r} in {target.bundle!r}; list them with `lousho sessions`")
    return members


def _pairs(target: Target, a: str, b: str) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """The pairs to compare, and the members of two groups left without a partner."""
    group_a, group_b = bool(_WILDCARDS.search(a)), bool(_WILDCARDS.search(b))
    if not group_a and not group_b:
        return [(a, b)], {"a": [], "b": []}
    if not group_b:
        return [(member, b) for member in _members(target, a).values()], {"a": [], "b": []}
    if not group_a:
        return [(a, member) for member in _members(target, b).values()], {"a": [], "b": []}
    members_a, members_b = _members(target, a), _members(target, b)
    pairs = [(members_a[key], members_b[key]) for key in members_a if key in members_b]
    unpaired = {
        "a": [s for key, s in members_a.items() if key not in members_b],
        "b": [s for key, s in members_b.items() if key not in members_a],
    }
    return pairs, unpaired


def drift_report(target: Target, a: str, b: str) -> DriftReport:
    """Compare A with B (sessions or groups): each pair's divergence and drift."""
    pairs, unpaired = _pairs(target, a, b)
    compared = []
    for session_a, session_b in pairs:
        comparison = compare_trajectories(load_session(target, session_a), load_session(target, session_b))
        compared.append(DriftPair(a=session_a, b=session_b, diverged_at=comparison.diverged_at, drift=comparison.drift))
    return DriftReport(pairs=compared, drifted=sum(bool(p.drift) for p in compared), unpaired=unpaired)


def describe_drift(drift: TrajectoryDrift) -> list[str]:
    """The drift's lines, one per difference, in the order of the reference's shape."""
    lines = [f"  tool order at step {d.step}: a {d.a}, b {d.b}" for d in drift.tool_order]
    lines += [
        f"  arguments of {d.tool} at step {d.step} (call {d.position}): a {_json(d.a)}, b {_json(d.b)}"
        for d in drift.arguments
    ]
    if drift.step_count:
        lines.append(f"  step count: a {drift.step_count[0]}, b {drift.step_count[1]}")
    if drift.finish_reason:
        lines.append(f"  finish reason: a {drift.finish_reason[0]}, b {drift.finish_reason[1]}")
    return lines


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def report_lines(report: DriftReport) -> list[str]:
    """The report as text: each pair, its drift's lines, the unpaired members, the count that drift."""
    lines = []
    for pair in report.pairs:
        where = "no divergence" if pair.diverged_at is None else f"diverged at step {pair.diverged_at}"
        lines.append(f"{pair.a} -> {pair.b}: {where}; {'drift' if pair.drift else 'no drift'}")
        lines += describe_drift(pair.drift)
    for side in ("a", "b"):
        if report.unpaired[side]:
            lines.append(f"unpaired in {side}: {', '.join(report.unpaired[side])}")
    lines.append(f"{report.drifted} of {len(report.pairs)} pair(s) drift")
    return lines
