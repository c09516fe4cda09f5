"""The exit codes of every `lousho` command, one scheme (issue #32; README 'Exit codes'):

- 0: done (a listing that skipped unreadable records too: it names them on stderr); also when the reader of
  the output went away (`lousho sessions --json | head -c 100`): the command ends quietly.
- 1: the operation failed (a store that cannot be reached, a run that parked, a refused decision), or a check
  did (`lousho eval --drift --fail-on-drift` found drift: a CI job fails on it).
- 2: a usage error: an unknown option, a value out of range or not of the choices, a missing argument, a
  flag's value that does not parse (`--tool-result CALL_ID=notjson`); nothing was done.
- 3: not found: the session, the approval, the save or step, or (for a command that only reads) the store.
- 4: timed out (`lousho enqueue --wait --timeout`): what it waited on goes on.
"""

from __future__ import annotations

from lousho.errors import (
    ApprovalNotFoundError,
    CheckpointNotFoundError,
    OperationTimeoutError,
    SDKError,
    SessionNotFoundError,
    StoreNotFoundError,
)

__all__ = ["FAILED", "NOT_FOUND", "OK", "TIMED_OUT", "USAGE", "exit_code_of"]

OK = 0
FAILED = 1
USAGE = 2
NOT_FOUND = 3
TIMED_OUT = 4

_NOT_FOUND = (SessionNotFoundError, StoreNotFoundError, ApprovalNotFoundError, CheckpointNotFoundError)


def exit_code_of(error: SDKError) -> int:
    """The exit code of a command that ended with `error`."""
    if isinstance(error, _NOT_FOUND):
        return NOT_FOUND
    if isinstance(error, OperationTimeoutError):
        return TIMED_OUT
    return FAILED
