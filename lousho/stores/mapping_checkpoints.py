"""`MappingCheckpointStore`: the latest checkpoint per session and its history ring, in a mapping (issue #16).

Keys (`lousho.stores.mapping_keys.MappingKeys`, under a prefix, default `lousho:`):

    cp/<session>        the latest checkpoint's head: the checkpoint without its messages
    msg/<session>/<n>   the session's n-th message, JSON, written once (the transcript only grows)
    hist/<session>      the history ring: one JSON entry {"saved_at", "checkpoint": <head>} per line, newest first

A head is the same record SqlStore and FileStore write (`lousho.stores.segments`): the checkpoint's
JSON behind a header naming the message positions it uses, plus `n` (positions written so far) and
`t` (when it was saved, ms). So a save writes only its new messages and one head, and a history
entry stays a few hundred bytes however long the transcript; `plan_save` finds the new messages.
A save writes the messages, then the head, then the ring, then syncs the mapping: messages of a
save that failed half way are named by no head and the next save writes over them.

The mapping is one process's (a dict, a `shelve` or `dbm` file opened by one process): every access
holds the store's lock, so threads may share it, and a save is a compare-and-set under that lock.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterable, Sequence
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any

from lousho.checkpoint import Checkpoint, HistoryEntry, check_version, decode_checkpoint, validate_session_id
from lousho.errors import ConfigurationError, CorruptCheckpointError, PayloadKeyError, SDKError
from lousho.store_bundle import Pruned, cutoff_of
from lousho.stores.codec import PLAIN, PayloadCodec
from lousho.stores.head_fields import HeadFields, head_fields
from lousho.stores.listing import Listing, read_each
from lousho.stores.mapping_keys import MappingKeys, TextMapping
from lousho.stores.reseal import reseal_records
from lousho.stores.segments import (
    Head,
    Known,
    SessionCache,
    Transcript,
    encode_records,
    extend_segments,
    plan_save,
    split_record,
)

__all__ = ["MappingCheckpointStore"]


class MappingCheckpointStore:
    """Latest checkpoint per session as a head, its messages one key each, plus a history ring."""

    def __init__(
        self,
        data: TextMapping,
        *,
        keys: MappingKeys | None = None,
        lock: threading.RLock | None = None,
        history_limit: int = 50,
        cache_size: int = 1024,
        codec: PayloadCodec = PLAIN,
    ) -> None:
        """`codec`: seals heads' secret fields and encodes messages (issue #17)."""
        if history_limit < 0:
            raise ConfigurationError(f"history_limit must be 0 or more, not {history_limit}")
        self._data = data
        self._keys = keys or MappingKeys()
        self._lock = lock or threading.RLock()
        self.history_limit = history_limit
        self._cache = SessionCache(cache_size)
        self._codec = codec

    # -- save, load ------------------------------------------------------------------------

    def save(self, session_id: str, checkpoint: Checkpoint) -> None:
        """Store `checkpoint` if it follows the stored version; else `CheckpointConflictError`, nothing written."""
        validate_session_id(session_id)  # it becomes part of keys: no '/' in it
        writer, keys = uuid.uuid4().hex, self._keys
        with self._lock:
            head = self._check_stored(session_id, checkpoint)
            lines = self._lines(session_id)
            base = _end([head] if head is not None else _entry_heads(session_id, lines))
            segments, texts = plan_save(
                self._cache,
                session_id,
                checkpoint,
                head,
                lambda h: self._transcript(session_id, [h]).texts(h.segments),
                self._codec,
            )
            for offset, text in enumerate(texts):
                self._data[keys.message(session_id, base + offset)] = text
            saved_at = datetime.now(UTC)
            segments = extend_segments(segments, base, len(texts))
            record, entry_record = encode_records(
                checkpoint,
                writer,
                segments,
                codec=self._codec,
                session_id=session_id,
                n=base + len(texts),
                t=_ms(saved_at),
            )
            self._data[keys.head(session_id)] = record
            if self.history_limit > 0:
                saved = json.dumps(saved_at.isoformat())
                entry = '{"saved_at": ' + saved + ', "checkpoint": ' + entry_record + "}"
                self._data[keys.history(session_id)] = "\n".join([entry, *lines][: self.history_limit])
            self._data.sync()
        self._cache.put(session_id, Known(checkpoint.version, writer, tuple(checkpoint.messages)))

    def _check_stored(self, session_id: str, checkpoint: Checkpoint) -> Head | None:
        """The stored head's header (None: none stored, or a whole checkpoint JSON), after the version check;
        a stored record that cannot be read raises `CorruptCheckpointError` and is not overwritten."""
        raw = self._data.get(self._keys.head(session_id))
        if raw is None:
            check_version(session_id, None, checkpoint)
            return None
        fields, head = _split(session_id, raw, self._codec)  # a wrong key raises here, before any write
        check_version(session_id, decode_checkpoint(session_id, fields).version, checkpoint)
        return head

    def load(self, session_id: str) -> Checkpoint | None:
        """The latest checkpoint, or None for an unknown session; a damaged one raises and stays."""
        with self._lock:
            raw = self._data.get(self._keys.head(session_id))
            if raw is None:
                return None
            try:
                fields, head = _split(session_id, raw, self._codec)
                if head is not None:
                    fields["messages"] = self._transcript(session_id, [head]).take(head.segments)
                checkpoint = decode_checkpoint(session_id, fields)
            except SDKError:  # issue #31: a save never builds on what this process last read of it
                self._cache.drop(session_id)
                raise
        if head is not None:
            self._cache.put(session_id, Known(checkpoint.version, head.writer, tuple(checkpoint.messages)))
        return checkpoint

    def _transcript(self, session_id: str, heads: Iterable[Head]) -> Transcript:
        """The stored messages the heads name, by position (one read of each)."""
        positions = {p for head in heads for start, count in head.segments for p in range(start, start + count)}
        found = {p: self._data.get(self._keys.message(session_id, p)) for p in positions}
        return Transcript(session_id, {p: text for p, text in found.items() if text is not None}, self._codec)

    # -- history ---------------------------------------------------------------------------

    def _lines(self, session_id: str) -> list[str]:
        raw = self._data.get(self._keys.history(session_id))
        return raw.split("\n") if raw else []

    def history(self, session_id: str, limit: int | None = None) -> list[HistoryEntry]:
        """The session's saves, newest first (at most `limit`), each as it was saved; entries that
        cannot be read are skipped."""
        with self._lock:
            lines = self._lines(session_id)[:limit]
            records = [(stamp, *fields) for stamp, fields in _entries(session_id, lines, self._codec)]
            transcript = self._transcript(session_id, [head for _, _, head in records if head is not None])
        result = []
        for saved_at, fields, head in records:
            try:
                if head is not None:
                    fields["messages"] = transcript.take(head.segments)
                checkpoint = decode_checkpoint(session_id, fields)
            except PayloadKeyError:  # the store lacks a key: an error to fix, not an entry to skip (issue #17)
                raise
            except SDKError:
                continue
            entry = HistoryEntry(
                step=checkpoint.step_index, saved_at=saved_at, status=checkpoint.status, checkpoint=checkpoint
            )
            result.append(entry)
        return result

    # -- delete, sessions, prune -----------------------------------------------------------

    def delete(self, session_id: str, keep_history: bool = False) -> None:
        """Forget the session; with `keep_history` its history and the messages it refers to stay."""
        with self._lock:
            end = self._extent(session_id)
            self._data.pop(self._keys.head(session_id), None)
            if not keep_history:
                self._data.pop(self._keys.history(session_id), None)
                self._drop_messages(session_id, end)
            self._data.sync()
        self._cache.drop(session_id)

    def _extent(self, session_id: str) -> int:
        """One past the last message position the head or any history entry names."""
        heads = _entry_heads(session_id, self._lines(session_id))
        with suppress(SDKError):
            raw = self._data.get(self._keys.head(session_id))
            head = None if raw is None else split_record(session_id, raw)[1]
            heads += [head] if head is not None else []
        return _end(heads)

    def _drop_messages(self, session_id: str, end: int) -> None:
        """Remove the messages up to `end`, and those a failed save left past it (they follow on)."""
        position = 0
        while position < end or self._keys.message(session_id, position) in self._data:
            self._data.pop(self._keys.message(session_id, position), None)
            position += 1

    def sessions(self, status: str | None = None) -> Listing[str]:
        """Sessions with a latest checkpoint, sorted; with `status`, those of that status, and the ones
        whose head cannot be read named in `skipped` (issue #21)."""
        with self._lock:
            ids = sorted(self._data.under(self._keys.heads))
            if status is None:
                return Listing(ids)
            heads = [(s, self._data.get(self._keys.head(s))) for s in ids]

        def matching(session_id: str, raw: str | None) -> str | None:
            if raw is None:
                return None
            fields = _split(session_id, raw)[0]
            return session_id if decode_checkpoint(session_id, fields).status == status else None

        return read_each(heads, matching, what="session")

    def heads(self, session_ids: Sequence[str]) -> Listing[HeadFields]:
        """The plain head fields of each named session that has a checkpoint, in the order given, never opening a
        payload (issue #32: what listings read); a head that cannot be read is named in `skipped`."""
        with self._lock:
            raws = [(s, self._data.get(self._keys.head(s))) for s in session_ids]
        return read_each(((s, raw) for s, raw in raws if raw is not None), head_fields, what="session")

    def prune(self, older_than: datetime | timedelta) -> Pruned:
        """Remove finished checkpoints last saved before the cutoff, history entries saved before it, and
        the messages of sessions left with neither. A head without a save time (an older or a hand-written
        record) is kept: its age is unknown."""
        cutoff = cutoff_of(older_than)
        removed = dropped = 0
        with self._lock:
            names = set(self._data.under(self._keys.heads)) | set(self._data.under(self._keys.history("")))
            for session_id in sorted(names):
                end = self._extent(session_id)
                removed += self._prune_head(session_id, cutoff)
                dropped += self._prune_history(session_id, cutoff, end)
            self._data.sync()
        return Pruned(checkpoints=removed, history=dropped)

    def _prune_head(self, session_id: str, cutoff: datetime) -> int:
        key = self._keys.head(session_id)
        raw = self._data.get(key)
        try:
            fields, head = _split(session_id, raw) if raw is not None else ({}, None)
            finished = head is not None and decode_checkpoint(session_id, fields).status == "finished"
        except SDKError:
            return 0  # unreadable: left as it is
        if not finished or head is None or head.extra.get("t", _ms(cutoff)) >= _ms(cutoff):
            return 0
        del self._data[key]
        self._cache.drop(session_id)
        return 1

    def _prune_history(self, session_id: str, cutoff: datetime, end: int) -> int:
        lines = self._lines(session_id)
        kept = [line for line in lines if _saved_after(line, cutoff)]
        if kept and len(kept) != len(lines):
            self._data[self._keys.history(session_id)] = "\n".join(kept)
        elif not kept:
            self._data.pop(self._keys.history(session_id), None)
            if self._keys.head(session_id) not in self._data:
                self._drop_messages(session_id, end)
        return len(lines) - len(kept)

    def reseal(self, session_id: str) -> int:
        """Write every stored value of the session again, sealed under the codec's first key to its place
        (issue #31, `lousho reseal`); how many values. A value the codec cannot read raises, nothing written."""
        with self._lock:
            head = self._data.get(self._keys.head(session_id))
            entries = [json.loads(line) for line in self._lines(session_id)]
            records = ([(head, False)] if head is not None else []) + [(e["checkpoint"], True) for e in entries]
            heads = [split_record(session_id, raw, None)[1] for raw, _ in records]
            transcript = self._transcript(session_id, [h for h in heads if h is not None])
            resealed = reseal_records(session_id, self._codec, records, transcript.rows)
            new = iter(resealed.records)
            for position, text in resealed.messages.items():
                self._data[self._keys.message(session_id, position)] = text
            if head is not None:
                self._data[self._keys.head(session_id)] = next(new)
            if entries:
                lines = [
                    '{"saved_at": ' + json.dumps(e["saved_at"]) + ', "checkpoint": ' + record + "}"
                    for e, record in zip(entries, new, strict=True)
                ]
                self._data[self._keys.history(session_id)] = "\n".join(lines)
            self._data.sync()
        self._cache.drop(session_id)
        return len(resealed.records) + len(resealed.messages)

    # -- raw records (tests) ---------------------------------------------------------------

    def get_raw(self, session_id: str) -> Any:
        """The latest checkpoint's head as the mapping holds it (str, or bytes for dbm)."""
        with self._lock:
            return self._data.mapping.get(self._keys.head(session_id))

    def put_raw(self, session_id: str, raw: str | bytes) -> None:
        """Store `raw` as the latest checkpoint without checking it (tests of old, corrupt and foreign records)."""
        with self._lock:
            self._data.mapping[self._keys.head(session_id)] = raw
            self._data.sync()
        self._cache.drop(session_id)


def _split(
    session_id: str, raw: str, codec: PayloadCodec | None = None, *, history: bool = False
) -> tuple[Any, Head | None]:
    """A stored head's fields (messages empty when it names them) and header; a header that does not
    account for the messages it names raises `CorruptCheckpointError`. `codec` opens its sealed part
    (None: left sealed, for a caller after the version or status alone)."""
    fields, head = split_record(session_id, raw, codec, history=history)
    if head is not None:
        if not isinstance(head.extra.get("n"), int) or head.end > head.extra["n"]:
            raise CorruptCheckpointError(session_id, "its store header is damaged")
        fields["messages"] = []
    return fields, head


def _entries(
    session_id: str, lines: list[str], codec: PayloadCodec | None = None
) -> list[tuple[str, tuple[Any, Head | None]]]:
    """The readable history lines as (saved_at, (fields, header)); a damaged line is left out, a key
    the codec lacks raises (issue #17)."""
    found = []
    for line in lines:
        try:
            entry = json.loads(line)
            found.append((str(entry["saved_at"]), split_record(session_id, entry["checkpoint"], codec, history=True)))
        except PayloadKeyError:
            raise
        except (ValueError, KeyError, TypeError, SDKError):
            continue
    return found


def _entry_heads(session_id: str, lines: list[str]) -> list[Head]:
    return [head for _, (_, head) in _entries(session_id, lines) if head is not None]


def _end(heads: Iterable[Head]) -> int:
    return max((max(head.extra.get("n", 0), head.end) for head in heads), default=0)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _saved_after(line: str, cutoff: datetime) -> bool:
    try:
        stamp = datetime.fromisoformat(str(json.loads(line)["saved_at"]))
    except (ValueError, KeyError, TypeError):
        return False  # a damaged entry goes with the old ones
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)) >= cutoff
