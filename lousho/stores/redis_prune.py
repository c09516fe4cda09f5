"""`RedisStore.prune()`: finished sessions and history entries older than a cutoff, removed (issue #16).

One script per session (`lua/prune.lua`), so a save that comes in between is never half pruned. Sessions
are found by SCAN of their heads and of their history rings (a session deleted with `keep_history=True`
has only the ring). The cutoff of a `timedelta` is taken from the Redis server's clock, the clock that
stamped the saves (`t` in each head), so a client whose clock is off prunes what it means to.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, cast

import redis

from lousho.store_bundle import Pruned, cutoff_of
from lousho.stores.redis_common import RedisKeys, load_script, redis_errors, text

__all__ = ["prune_sessions"]


def prune_sessions(client: redis.Redis, keys: RedisKeys, older_than: datetime | timedelta) -> Pruned:
    """Remove finished checkpoints saved before the cutoff (with their fleet keys), history entries saved
    before it, and the messages of sessions left with neither."""
    script = load_script(client, "prune")
    removed = dropped = 0
    with redis_errors(client, "prune sessions"):
        cutoff_ms = _cutoff_ms(client, older_than)
        for session_id in sorted(_sessions(client, keys)):
            head, messages, history = keys.session_keys(session_id)
            reply = cast(
                list[Any], script(keys=[head, messages, history, *keys.run_keys(session_id)], args=[cutoff_ms])
            )
            removed += int(reply[0])
            dropped += int(reply[1])
    return Pruned(checkpoints=removed, history=dropped)


def _cutoff_ms(client: redis.Redis, older_than: datetime | timedelta) -> int:
    if isinstance(older_than, timedelta):
        seconds, micros = cast(tuple[int, int], client.time())
        return seconds * 1000 + micros // 1000 - int(older_than.total_seconds() * 1000)
    return int(cutoff_of(older_than).timestamp() * 1000)


def _sessions(client: redis.Redis, keys: RedisKeys) -> set[str]:
    """Every session with a head or a history ring under the prefix."""
    prefix = re.sub(r"([*?\[\]\\])", r"\\\1", keys.prefix)
    found = set()
    for part in ("cp", "hist"):
        for key in client.scan_iter(match=f"{prefix}{{*}}:{part}", count=1000):
            name = text(key)[len(keys.prefix) :]
            if name.startswith("{") and name.endswith(f"}}:{part}"):
                found.add(name[1 : -len(part) - 2])
    return found
