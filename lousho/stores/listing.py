"""`Listing`: what a store lists when some records cannot be read (issue #21).

One damaged record (an approval snapshot that is not JSON, a session head of the wrong shape)
must not hide every other one: `pending()` and `sessions(status=...)` list the records they can
read and name the others in `skipped`, with why, and log them as a warning on the
`lousho.stores` logger. A listing is still a list, so callers that only iterate are unchanged;
a store that returns a plain list (an older or third-party one) is read with `Listing.of`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

from lousho.approvals import ApprovalSnapshot
from lousho.errors import (
    CorruptApprovalError,
    CorruptCheckpointError,
    PayloadDecodeError,
    PayloadKeyError,
    SealedValueMismatchError,
    UnsealedValueError,
)

__all__ = ["Listing", "read_each", "waiting"]

log = logging.getLogger("lousho.stores")

T = TypeVar("T")
R = TypeVar("R")


class Listing(list[T], Generic[T]):
    """The records a store could read, as a list in the listing's order, and `skipped`: the id of
    each record it could not read -> why (the error's message)."""

    skipped: dict[str, str]

    def __init__(self, items: Iterable[T] = (), *, skipped: Mapping[str, str] | None = None) -> None:
        super().__init__(items)
        self.skipped = dict(skipped or {})

    @classmethod
    def of(cls, items: Iterable[T]) -> Listing[T]:
        """`items` as a Listing: itself when it is one, else its records with nothing skipped."""
        return items if isinstance(items, Listing) else cls(items)


def read_each(records: Iterable[tuple[str, R]], read: Callable[[str, R], T | None], *, what: str) -> Listing[T]:
    """`read(id, raw)` of every record, in order; None leaves a record out (it does not match).

    A record `read` finds damaged (`CorruptApprovalError`, `CorruptCheckpointError`, `PayloadDecodeError`),
    or one that is not sealed to its place under the store's key (issue #31: planted, moved, or not migrated),
    is skipped and named; any other error (a store that is down, a payload key id it lacks) is raised, as a
    listing that cannot be made at all.
    `what` names the kind of record in the warning ('approval', 'session')."""
    found: list[T] = []
    skipped: dict[str, str] = {}
    for record_id, raw in records:
        try:
            value = read(record_id, raw)
        except (SealedValueMismatchError, UnsealedValueError) as exc:  # this record's, not the store's
            skipped[record_id] = str(exc)
            continue
        except PayloadKeyError:  # the store lacks a key: every record of it would fail; say so (issue #17)
            raise
        except (CorruptApprovalError, CorruptCheckpointError, PayloadDecodeError) as exc:
            skipped[record_id] = str(exc)
            continue
        if value is not None:
            found.append(value)
    if skipped:
        plural = what if len(skipped) == 1 else f"{what}s"
        log.warning("skipped %d unreadable %s: %s", len(skipped), plural, ", ".join(skipped))
    return Listing(found, skipped=skipped)


def waiting(snapshots: Listing[ApprovalSnapshot], session_id: str | None) -> Listing[ApprovalSnapshot]:
    """`pending()`'s answer from every snapshot read: the pending ones (of `session_id` when given),
    oldest first, and every one skipped (a snapshot that cannot be read may be of any session)."""
    found = [s for s in snapshots if s.status == "pending" and (session_id is None or s.session_id == session_id)]
    return Listing(sorted(found, key=lambda s: (s.created_at, s.id)), skipped=snapshots.skipped)
