"""Text both front ends show the same way (issue #32): prose cut to a line (never an id: ids are shown whole,
issue #15), an age for a person, a time without its microseconds."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from lousho.errors import ConfigurationError

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

__all__ = ["age_text", "parse_age", "short", "time_text"]


def short(value: Any, limit: int = 100) -> str:
    """Prose (an answer, a call's arguments) on one line, cut to `limit` characters with '...'; never an id."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parsed(iso_time: str) -> datetime | None:
    try:
        then = datetime.fromisoformat(iso_time)
    except (TypeError, ValueError):
        return None
    return then if then.tzinfo else then.replace(tzinfo=UTC)


def age_text(iso_time: str, now: datetime | None = None) -> str:
    """How long ago an ISO 8601 time was, for a person: '42 s', '5 min', '3 h', '2 d' ('?' if unreadable)."""
    then = _parsed(iso_time)
    if then is None:
        return "?"
    seconds = max(0.0, ((now or datetime.now(UTC)) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def time_text(iso_time: str) -> str:
    """An ISO 8601 time as a person reads it: '2026-12-04 21:50:33 UTC' (no microseconds, no 'T')."""
    then = _parsed(iso_time)
    if then is None:
        return iso_time
    return then.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def parse_age(value: str) -> timedelta:
    """'30s', '15m', '12h', '7d', '2w' (or several: '1d12h') as a timedelta (prune's --older-than, the dashboard's
    prune form); `ConfigurationError` otherwise."""
    text = value.strip().lower()
    parts = _AGE.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ConfigurationError(f"--older-than takes an age such as 30s, 15m, 12h, 7d or 2w, not {value[:40]!r}")
    return timedelta(seconds=sum(float(number) * _UNIT_S[unit] for number, unit in parts))
