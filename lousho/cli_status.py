"""A session's status as the `lousho` commands show it: the fleet's word where there is a fleet (issue #15).

On a RedisStore, a session whose model turn cannot run (poison, an agent no worker serves, a corrupt
checkpoint) is parked: its checkpoint still says 'in-progress', and the fleet's parked mark says why.
`lousho sessions` showed 'parked' (from `Client.status`) while `lousho show` said 'in-progress, step 0';
both now take the status from here, and both show the reason.
"""

from __future__ import annotations

from typing import Any

from lousho.checkpoint import Checkpoint
from lousho.settings import LoushoSettings

__all__ = ["parked_line", "shown_status"]


def shown_status(settings: LoushoSettings, store: Any, checkpoint: Checkpoint) -> tuple[str, str | None]:
    """(status, parked reason) of a session: 'parked' and its reason on the fleet, else the checkpoint's."""
    from lousho.stores.redis import RedisStore

    if not isinstance(store, RedisStore):
        return checkpoint.status, None
    status = settings.client().status(checkpoint.session_id)
    if status.status == "parked":
        return "parked", status.parked_reason or "no reason recorded"
    return checkpoint.status, None


def parked_line(session_id: str, reason: str) -> str:
    """What `show` prints under a parked session's transcript."""
    return f"parked: {reason} (fix that, then `lousho resume {session_id}`)"
