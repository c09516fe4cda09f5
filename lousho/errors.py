"""One exception tree for everything lousho raises.

Every error a caller can act on is an `SDKError` with a stable `code` (the
reference's `LOUSHO_*` codes) and a message that says what to do. Errors of
dependencies (redis, SQLAlchemy, the file system) are translated where they
enter, so callers never have to catch a driver's exceptions.
"""

from __future__ import annotations

__all__ = [
    "AgentDriftError",
    "ApprovalAlreadyResolvedError",
    "ApprovalCallChangedError",
    "ApprovalNotFoundError",
    "CheckpointConflictError",
    "CheckpointNotFoundError",
    "ConfigurationError",
    "CorruptApprovalError",
    "CorruptCheckpointError",
    "InvalidDecisionError",
    "InputTooLargeError",
    "InvalidEventIdError",
    "InvalidInputError",
    "InvalidProviderAnswerError",
    "InvalidSessionIdError",
    "LeaseLostError",
    "NewerFormatError",
    "OperationTimeoutError",
    "PayloadDecodeError",
    "PayloadKeyError",
    "PayloadTooLargeError",
    "PropagatingToolError",
    "ProviderError",
    "ResumeToolMissingError",
    "SDKError",
    "SaveNotReplicatedError",
    "SealedValueMismatchError",
    "SessionAwaitingApprovalError",
    "SessionExistsError",
    "SessionIdTooLongError",
    "SessionLiveError",
    "SessionNotFoundError",
    "SessionSupersededError",
    "StoreAuthenticationError",
    "StoreNotFoundError",
    "StoreUnavailableError",
    "UnsealedValueError",
]


class SDKError(Exception):
    """Base of every error lousho raises; `code` is stable and documented."""

    code: str = "LOUSHO_ERROR"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"[{self.code}] {self.args[0]}"


class ConfigurationError(SDKError):
    """The library was wired up in a way that cannot work (say what to pass instead)."""

    code = "LOUSHO_CONFIGURATION"


class InvalidSessionIdError(SDKError, ValueError):
    """A session id that stores and task ids cannot carry safely."""

    code = "LOUSHO_INVALID_SESSION_ID"
    length: int | None = None
    """The refused id's length in characters (None: it is no text): what an answer to whoever sent it may say
    instead of the id, which the message quotes."""
    rule: str = ""
    """What a session id must be (`lousho.checkpoint.SESSION_ID_RULE`)."""


class InvalidInputError(SDKError, ValueError):
    """Input that would give the provider an invalid transcript; refused before anything is written (issue #21)."""

    code = "LOUSHO_INVALID_INPUT"


class InputTooLargeError(InvalidInputError):
    """A job's input, business state, agent name or session id over its configured limit
    (`FleetSettings.max_input_chars`, `max_input_messages`, `max_business_state_chars`, `max_agent_name_chars`,
    `max_session_id_chars`); refused before anything is written. The message says how large (in `unit`) and what
    the limit is, never the value itself."""

    code = "LOUSHO_INPUT_TOO_LARGE"

    def __init__(self, what: str, size: int, limit: int, setting: str, *, unit: str = "characters") -> None:
        super().__init__(
            f"the {what} has {size:,} {unit}, over the limit of {limit:,} ({setting}: "
            f"FleetSettings.{setting}, LOUSHO_{setting.upper()}); nothing was written. Send less, or raise the limit"
        )
        self.what, self.size, self.limit = what, size, limit


class InvalidEventIdError(InvalidInputError):
    """An event id (`Client.events(after=...)`, a browser's `Last-Event-ID`) that is no id of a session's stream:
    not `<ms>-<n>`, or a part past 2^64-1, the range of Redis stream ids. Refused before Redis is asked; the
    message tells the id's length and the rule, never the id. Its code is `InvalidInputError`'s."""

    code = "LOUSHO_INVALID_INPUT"


class SessionIdTooLongError(InvalidSessionIdError, InputTooLargeError):
    """A session id over `FleetSettings.max_session_id_chars`: an invalid session id, as one over 200 characters
    always was, told without quoting it (issue #31)."""

    code = "LOUSHO_INVALID_SESSION_ID"


class SessionAwaitingApprovalError(SDKError):
    """`execute()` on a session paused for a human decision (reference: 'Paused awaiting approval')."""

    code = "LOUSHO_SESSION_AWAITING_APPROVAL"

    def __init__(self, session_id: str, approval_id: str) -> None:
        super().__init__(
            f"session {session_id!r} is waiting on approval {approval_id!r}; resolve it with "
            "resume_after_approval() (or agent.approvals.resolve()) first, passing the same "
            "checkpoint store, then send the new message"
        )
        self.session_id = session_id
        self.approval_id = approval_id


class SessionExistsError(ConfigurationError):
    """A new session id (a fork's `new_session_id`) that already has a checkpoint: never overwritten."""

    code = "LOUSHO_SESSION_EXISTS"


class SessionNotFoundError(SDKError, LookupError):
    """A session id that the store holds no checkpoint for. Not a `ConfigurationError`: the wiring is
    fine, the id is not there (issue #15)."""

    code = "LOUSHO_SESSION_NOT_FOUND"

    def __init__(self, session_id: str, where: str, hint: str = "list them with `lousho sessions`") -> None:
        super().__init__(f"no session {session_id!r} in {where}; {hint}")
        self.session_id = session_id


class SessionLiveError(SDKError):
    """`delete` of a session a worker is running (a tool call of it runs, its lease is held, or it is in flight
    within its deadline): nothing is deleted. `--force` (`force=True`) aborts the run first, then deletes it."""

    code = "LOUSHO_SESSION_LIVE"

    def __init__(self, live: dict[str, str]) -> None:
        """`live`: each live session -> why, in a sentence."""
        said = "; ".join(f"{session_id!r} is live: {why}" for session_id, why in live.items())
        ids = " ".join(live)
        super().__init__(
            f"{said}; nothing was deleted. Pass --force to abort the run first and then delete it "
            f"(`lousho delete {ids} --force`), or wait for it to finish"
        )
        self.live = dict(live)


class StoreNotFoundError(SDKError, LookupError):
    """A read-only command (a listing, `show`, a read-only dashboard) pointed at a store that does not exist:
    a typo'd `sqlite:///...`, `dbm://...` or `file://...` path. Nothing is created (issue #32)."""

    code = "LOUSHO_STORE_NOT_FOUND"

    def __init__(self, path: str, url: str) -> None:
        super().__init__(
            f"no store at {path!r} (from {url!r}): nothing was created; check the path, or run something that "
            "writes to it first"
        )
        self.path = path


class OperationTimeoutError(SDKError):
    """An operation that waits (`lousho enqueue --wait`) ran out of time; what it waited on goes on (issue #32)."""

    code = "LOUSHO_TIMEOUT"


class CheckpointNotFoundError(SDKError):
    """A step that the history does not hold (reference: 'Fork and replay')."""

    code = "LOUSHO_CHECKPOINT_NOT_FOUND"


class CorruptCheckpointError(SDKError):
    """A stored checkpoint that cannot be read: not JSON, the wrong shape, or a newer schema.

    The stored value is left exactly as it was; nothing overwrites it silently.
    """

    code = "LOUSHO_CHECKPOINT_CORRUPT"

    def __init__(self, session_id: str, problem: str) -> None:
        super().__init__(
            f"the stored checkpoint of session {session_id!r} cannot be read: {problem}. "
            "It was left as it is; inspect it, or delete the session to start over"
        )
        self.session_id = session_id
        self.problem = problem


class PayloadDecodeError(SDKError):
    """A stored payload the store's codec cannot decode: damaged, or written by a newer lousho (issue #17).

    Nothing stored is changed; the value stays as it is."""

    code = "LOUSHO_PAYLOAD_DECODE"


class PayloadKeyError(PayloadDecodeError):
    """An encrypted payload whose key this store lacks (its key id is not in `keys`) or whose key is not the
    one it was written with (issue #17). Nothing stored is changed: give the store the key it names."""

    code = "LOUSHO_PAYLOAD_KEY"


class NewerFormatError(CorruptCheckpointError):
    """A stored checkpoint written by a newer lousho, in a schema this one does not read (issue #35).

    Not damage: during a rolling upgrade a worker of the previous release meets sessions the new ones
    wrote. It is left exactly as it is; on the fleet the step's message is handed back for a worker
    that reads it (`lousho.fleet.protocol`), never parked.
    """

    code = "LOUSHO_NEWER_FORMAT"

    def __init__(self, session_id: str, problem: str) -> None:
        SDKError.__init__(
            self,
            f"the stored checkpoint of session {session_id!r} was written by a newer lousho: {problem}. It was left "
            "as it is: read it with that release (docs/upgrading.md); do not delete it",
        )
        self.session_id = session_id
        self.problem = problem


class SealedValueMismatchError(PayloadKeyError):
    """An encrypted value that does not open at the place it was read from (issue #31): its associated data
    binds it to the store, the session, the part (head, message n, history entry, approval, result) and the
    key id, so a value moved, swapped or replayed from another session or position fails here, as does an
    altered one or a wrong key under the right id. Nothing is written after it; the stored value stays."""

    code = "LOUSHO_SEALED_VALUE_MISMATCH"

    def __init__(self, message: str, *, key_id: str, part: str, session_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id
        self.part = part
        self.session_id = session_id


class UnsealedValueError(PayloadKeyError):
    """A value that is not sealed to its place under a key, read by a store that has keys (issue #31): plain
    JSON, compressed only, or encrypted by lousho 0.1 (no place in its associated data). Anyone with write
    access to the store could have written it, so it is refused, unless the store is opened with
    `read_unsealed=True` (`LOUSHO_PAYLOAD_READ_UNSEALED=1`) to migrate old data: `lousho reseal --all`."""

    code = "LOUSHO_UNSEALED_VALUE"

    def __init__(self, message: str, *, part: str, session_id: str) -> None:
        super().__init__(message)
        self.part = part
        self.session_id = session_id


class PayloadTooLargeError(PayloadDecodeError):
    """A compressed value that inflates past the codec's `max_payload_bytes` (issue #31: a small stored
    value must not fill the memory of every process that reads it). Nothing is changed."""

    code = "LOUSHO_PAYLOAD_TOO_LARGE"


class CorruptApprovalError(SDKError):
    """A stored approval snapshot that cannot be read; it is left as it is."""

    code = "LOUSHO_APPROVAL_CORRUPT"


class CheckpointConflictError(SDKError):
    """A save whose version is stale: someone else saved this session in between."""

    code = "LOUSHO_CHECKPOINT_CONFLICT"

    def __init__(self, session_id: str, expected: int, found: int | None) -> None:
        super().__init__(
            f"session {session_id!r} was saved by someone else (stored version {found}, "
            f"this save expected {expected}); nothing was written. Load the checkpoint again"
        )
        self.session_id = session_id
        self.expected = expected
        self.found = found


class LeaseLostError(CheckpointConflictError):
    """A fenced save whose writer no longer holds the session's lease: it must stand down.

    A `CheckpointConflictError`, so code that handles a stale save handles this too."""

    code = "LOUSHO_LEASE_LOST"

    def __init__(self, session_id: str, lease_key: str, expected: int) -> None:
        SDKError.__init__(
            self,
            f"session {session_id!r} is no longer leased to this writer ({lease_key} holds another token or "
            "expired); the save was refused and nothing was written. Stand down: another worker owns it now",
        )
        self.session_id = session_id
        self.expected = expected
        self.found = None
        self.lease_key = lease_key


class SessionSupersededError(SDKError):
    """A fleet step's work for a session that was deleted, or deleted and created again under the
    same id, while the step ran: it commits nothing and stands nothing down (issue #21)."""

    code = "LOUSHO_SESSION_SUPERSEDED"

    def __init__(self, session_id: str, what: str) -> None:
        super().__init__(
            f"session {session_id!r} was deleted or created anew while this worker ran its step; "
            f"{what} belongs to the earlier run and was not written. Nothing to do: the new run goes on"
        )
        self.session_id = session_id


class StoreUnavailableError(SDKError):
    """The store's backend (Redis, a database, a folder) could not be reached or written."""

    code = "LOUSHO_STORE_UNAVAILABLE"


class SaveNotReplicatedError(StoreUnavailableError):
    """A write the primary applied, but fewer replicas than `min_replicas_acked` confirmed within the
    timeout (Redis `WAIT`, issue #18). It may or may not survive a failover: the caller must not count
    it as done. Load the session to see whether it stands; check the replicas (`INFO replication`)."""

    code = "LOUSHO_SAVE_NOT_REPLICATED"


class StoreAuthenticationError(SDKError):
    """The store's backend answered but refused the credentials (a wrong or missing Redis password).
    Not a `StoreUnavailableError`: waiting and retrying will not help, a new password will (issue #15)."""

    code = "LOUSHO_STORE_AUTHENTICATION"


class AgentDriftError(SDKError):
    """The resuming agent differs from the one that saved the run and `on_agent_drift='error'`."""

    code = "LOUSHO_AGENT_DRIFT"


class ResumeToolMissingError(SDKError):
    """A pending tool call names a tool the resuming agent does not have."""

    code = "LOUSHO_RESUME_TOOL_MISSING"


class ApprovalNotFoundError(SDKError):
    """A decision for an approval id that no store knows."""

    code = "LOUSHO_APPROVAL_NOT_FOUND"


class ApprovalAlreadyResolvedError(SDKError):
    """A second decision for an approval that was already decided; the tool does not run again."""

    code = "LOUSHO_APPROVAL_ALREADY_RESOLVED"


class ApprovalCallChangedError(SDKError):
    """The call an approval would run is not the one shown to the human: the session's checkpoint or the
    stored snapshot changed after the pause (an edit, a tampered record). Nothing is decided or run; ask
    again for the call as it is now (issue #17)."""

    code = "LOUSHO_APPROVAL_CALL_CHANGED"


class InvalidDecisionError(ConfigurationError):
    """A decision that is not `{"id": str, "approved": bool, "note": str | None}`; `approved` must be
    exactly True or False: "no", 0 or None are refused, not read as a rejection (issue #21)."""

    code = "LOUSHO_INVALID_DECISION"


class ProviderError(SDKError):
    """A model provider failed; `retryable` says whether trying again may help."""

    code = "LOUSHO_PROVIDER_ERROR"

    def __init__(
        self, message: str, *, retryable: bool, status: int | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.retry_after_s = retry_after_s


class InvalidProviderAnswerError(ProviderError):
    """A provider's answer that cannot be stored: text no store can encode (a lone surrogate such as U+D800,
    what a JSON escape "\\ud800" decodes to). Retryable, like any provider failure: the model is asked again,
    and nothing of the answer is saved (issue #31)."""

    code = "LOUSHO_PROVIDER_INVALID_ANSWER"

    def __init__(self, where: str) -> None:
        super().__init__(
            f"the provider's answer holds text that cannot be stored ({where}: a lone surrogate, not valid "
            "Unicode); nothing of it was saved and the model is asked again. If it persists, look at the "
            "provider or the after_model hook that made it",
            retryable=True,
        )


class PropagatingToolError(Exception):
    """Raise this from a tool to reject the whole run instead of returning an error result.

    The run keeps its last 'in-progress' checkpoint (reference: checkpoint table).
    """


class AgentNotServedError(ConfigurationError):
    """`Client.enqueue` of an agent that no live worker serves on the client's queue (issue #15): nothing is
    written. `served` maps each queue to the agents live workers serve on it."""

    code = "LOUSHO_AGENT_NOT_SERVED"

    def __init__(self, message: str, *, agent: str, queue: str | None, served: dict[str, list[str]]) -> None:
        super().__init__(message)
        self.agent = agent
        self.queue = queue
        self.served = served


__all__ += ["AgentNotServedError"]


class NewerLayoutError(ConfigurationError):
    """The fleet's Redis holds a stored layout (`lousho.formats.STORED_LAYOUT`) newer than this lousho's (issue #35).

    A worker of an older release would not find or not read the newer release's keys: it refuses to start, and
    writes nothing. Upgrade it to the release that wrote the layout (`lousho workers` shows what each live
    worker runs), or roll the whole fleet back as docs/upgrading.md says.
    """

    code = "LOUSHO_NEWER_LAYOUT"

    def __init__(self, *, key: str, stored: int, supported: int, version: str) -> None:
        super().__init__(
            f"the fleet's Redis holds stored layout {stored} ({key!r}), written by a newer lousho; this lousho "
            f"({version}) reads and writes layout {supported}, and would not find or not read that release's keys, "
            "so it does not start and writes nothing. Run the release that wrote it here (`lousho workers` shows "
            "what each live worker runs); to roll back a fleet, docs/upgrading.md says how"
        )
        self.key = key
        self.stored = stored
        self.supported = supported


__all__ += ["NewerLayoutError"]
