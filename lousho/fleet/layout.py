"""The stored layout a fleet's Redis holds, recorded once under the prefix and checked by every worker at start
(issue #35).

`lousho.formats.STORED_LAYOUT` versions the Redis keys and records besides checkpoints and approvals. The first
worker (or reaper) of a prefix records it at `<prefix>layout`; each worker that starts reads it first, and one of
an older release than the layout stored refuses to start (`NewerLayoutError`, naming both versions and what to
do) instead of running beside workers whose keys it would not find or misread. A release with a newer layout
records its own when it starts, so from then on workers of the older one refuse: the upgrade order of
docs/upgrading.md. A prefix without the key (written by lousho 0.1.0, which records none) is layout 1.
"""

from __future__ import annotations

from typing import Any

from lousho._version import __version__
from lousho.errors import ConfigurationError, NewerLayoutError
from lousho.formats import STORED_LAYOUT
from lousho.stores.redis_common import redis_errors, text

__all__ = ["LAYOUT_KEY", "claim_layout", "layout_key"]

LAYOUT_KEY = "layout"
"""The key under the store's prefix that holds the stored layout's number."""

_RECORD = """
local stored = redis.call('GET', KEYS[1])
local ours = tonumber(ARGV[1])
if not stored then
  redis.call('SET', KEYS[1], ARGV[1])
  return ours
end
local found = tonumber(stored)
if found and found < ours then
  redis.call('SET', KEYS[1], ARGV[1])
  return ours
end
return stored
"""


def layout_key(prefix: str) -> str:
    return f"{prefix}{LAYOUT_KEY}"


def claim_layout(client: Any, prefix: str, *, supported: int = STORED_LAYOUT) -> int:
    """Record `supported` as the prefix's stored layout unless a newer one is recorded (in one script: two
    workers of two releases starting at once agree), and return the layout stored. `NewerLayoutError` when
    the stored one is newer; `ConfigurationError` when the key holds something that is not a number."""
    key = layout_key(prefix)
    with redis_errors(client, "read the fleet's stored layout"):
        stored = client.eval(_RECORD, 1, key, supported)
    found = text(stored) if isinstance(stored, bytes) else str(stored)
    if not found.isdigit():
        raise ConfigurationError(
            f"{key!r} holds {found[:40]!r}, not a stored layout number: it is lousho's own key; delete it, and the "
            "next worker records its layout again"
        )
    if int(found) > supported:
        raise NewerLayoutError(key=key, stored=int(found), supported=supported, version=__version__)
    return int(found)
