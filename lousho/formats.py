"""The versions of everything that crosses processes, in one place (issue #35).

A fleet is upgraded while it serves: Kubernetes replaces a Deployment's pods one by one, so workers of
two releases take messages from one queue, run the same sessions and read each other's checkpoints,
leases and approvals. Each format they share carries a version, and each number below says which one
this release writes. A reader refuses (or hands back) what is newer than it knows, never misreads it;
what is older it reads, or upgrades in place. docs/upgrading.md says what each release changed, and
CHANGELOG.md lists it per release under "Stored formats".

When to bump: when a process of the previous release, reading or running what this one writes, would
misread it, lose it or damage it. Adding an optional field that older readers ignore (pydantic models
ignore unknown fields; Lua reads only the fields it names) is no bump. Renaming, removing or changing
the meaning of a field, a key or an argument is. A bump is a stored-format change: say so in
CHANGELOG.md and docs/upgrading.md, with the order in which to roll the fleet and whether a rollback
is possible.

The engine imports this module, the stores and the fleet too: it imports nothing.
"""

from __future__ import annotations

__all__ = [
    "APPROVAL_SCHEMA_VERSION",
    "CHECKPOINT_SCHEMA_VERSION",
    "MESSAGE_PROTOCOL",
    "SCRIPT_PROTOCOL",
    "STORED_LAYOUT",
    "written_formats",
]

CHECKPOINT_SCHEMA_VERSION = 1
"""A checkpoint's record (`lousho.checkpoint.Checkpoint`, field `schema_version`). Bump when a field's name
or meaning changes, or when one is removed: a worker of the previous release would rebuild a run wrongly.
A newer one is refused by `decode_checkpoint` (`NewerFormatError`); on the fleet the step's message is
handed back for a worker that reads it, and the session is left untouched."""

APPROVAL_SCHEMA_VERSION = 1
"""An approval's snapshot (`lousho.approvals.ApprovalSnapshot`, field `schema_version`; 0.1.0's snapshots
have none and are read as 1). Bump as for checkpoints; a newer one is refused (`NewerFormatError`)."""

MESSAGE_PROTOCOL = 1
"""The step messages workers send each other, the reaper and the `Client` send them (task names
`lousho.model_turn`, `lousho.tool_call`, `lousho.advance`; their arguments; their task ids). Carried in
each message's header `lousho_protocol` (`lousho.fleet.protocol`); a message without one is protocol 1
(0.1.0's). Bump when a worker of the previous protocol would run a message wrongly: an argument added
that it must not ignore, one removed or changed in meaning, a task renamed. A worker that takes a message
of a newer protocol hands it back to the queue unrun (and logs and counts it)."""

SCRIPT_PROTOCOL = 1
"""The Lua scripts' rules (lousho/worker/lua, lousho/fleet/lua, lousho/stores/lua): the lease tokens
(`<host>|<pid>-<uuid>@<epoch>`), the epoch fencing, the attempt counts, the outbox's push. Workers of two
releases run their own scripts (each by its own SHA) on the same keys at once: bump when a script of the
previous release, run beside this one's, would break a rule this one relies on. Every script says
`-- protocol: <n>` and `load_script` refuses one that is not of this protocol (a packaging mistake)."""

STORED_LAYOUT = 1
"""The Redis keys and the records in them besides checkpoints and approvals (`lousho.fleet.keys`,
`lousho.stores.redis_*`): a session's `{<session>}:*` keys, the in-flight index, the running index, the
worker registry, the fleet-wide limits. Bump when a key is renamed or moved, or a record's shape changes
so that the previous release would not find or not read it. Recorded once in Redis at `<prefix>layout` by the
first worker (`lousho.fleet.layout`); a worker of an older layout refuses to start (`NewerLayoutError`)."""


def written_formats() -> dict[str, int]:
    """Each format's version this release writes, by name (what a worker publishes in the registry)."""
    return {
        "message": MESSAGE_PROTOCOL,
        "scripts": SCRIPT_PROTOCOL,
        "layout": STORED_LAYOUT,
        "checkpoint": CHECKPOINT_SCHEMA_VERSION,
        "approval": APPROVAL_SCHEMA_VERSION,
    }
