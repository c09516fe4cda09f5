"""A record's store header written and read without `json` for the common case (issue #30): the text is the one
`json.dumps` makes, and a save over the head this process wrote reads its header alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lousho.stores import sql_checkpoints
from lousho.stores.record_header import header_text, read_header
from lousho.stores.segments import FORMAT, Head, behind_header, encode_records, split_record, written_head
from lousho.stores.sql import SqliteStore
from lousho.testing.store_contract import sample_checkpoint


@pytest.mark.parametrize(
    ("writer", "segments", "extra"),
    [
        ("5bd53ccd92b3e6962b4b284097ee0028", [(0, 103)], {}),
        ("5bd53ccd92b3e6962b4b284097ee0028", [], {}),
        ("abc", [(0, 3), (10, 2), (40, 1)], {}),
        ("w", [(0, 1)], {"n": 3, "b": 120}),  # FileStore's own fields
        ('a"b\\c', [(0, 1)], {}),  # a writer id that needs escaping (read from an old or foreign head)
        ("é-ü", [(0, 1)], {}),
        ("", [(0, 1)], {}),
        ("w", [(True, 1)], {}),  # not plainly whole numbers: json.dumps decides
    ],
)
def test_header_text_is_the_json_dumps_text(writer: str, segments: Any, extra: dict[str, int]) -> None:
    expected = json.dumps({"f": FORMAT, "w": writer, "s": segments, **extra}, separators=(",", ":"))
    assert header_text(FORMAT, writer, segments, extra) == expected


def test_records_are_the_same_text_as_before() -> None:
    checkpoint = sample_checkpoint("s", version=2)
    body = checkpoint.model_dump_json(exclude={"messages"})
    header = json.dumps({"f": FORMAT, "w": "ab12", "s": [[0, 2]]}, separators=(",", ":"))
    expected = '{"$store":' + header + ',"messages":null,' + body[1:]
    assert encode_records(checkpoint, "ab12", [(0, 2)], session_id="s") == [expected, expected]
    assert behind_header("ab12", [(0, 2)], {}, body) == expected
    assert split_record("s", expected)[1] == Head("ab12", [(0, 2)])


def test_read_header_reads_the_header_alone() -> None:
    assert read_header('{"$store":{"f":1,"w":"ab","s":[[0,2]]},"messages":null,"version":') == {
        "f": 1,
        "w": "ab",
        "s": [[0, 2]],
    }
    assert read_header('{"version":1}') is None
    assert read_header('{"$store":{"f":1,"w":') is None
    assert read_header(b'{"$store":{"f":1}}') is None


def test_written_head_only_for_the_writer_and_a_known_format() -> None:
    record = behind_header("ab12", [(0, 2)], {}, sample_checkpoint("s").model_dump_json(exclude={"messages"}))
    assert written_head(record, "ab12") == Head("ab12", [(0, 2)])
    assert written_head(record, "other") is None
    newer = record.replace('"f":1', f'"f":{FORMAT + 1}', 1)
    assert written_head(newer, "ab12") is None
    damaged = record.replace('"s":[[0,2]]', '"s":[[0,-2]]', 1)
    assert written_head(damaged, "ab12") is None


def test_a_save_over_its_own_head_does_not_parse_that_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, other = SqliteStore(tmp_path / "jobs.db"), SqliteStore(tmp_path / "jobs.db")
    try:
        store.checkpoints.save("s", sample_checkpoint("s", version=1))
        parsed: list[object] = []
        whole = sql_checkpoints.split_record

        def counting(*args: Any, **kwargs: Any) -> Any:
            parsed.append(args[1])
            return whole(*args, **kwargs)

        monkeypatch.setattr(sql_checkpoints, "split_record", counting)
        headers: list[object] = []
        header_alone = sql_checkpoints.written_head
        monkeypatch.setattr(
            sql_checkpoints, "written_head", lambda raw, writer: headers.append(raw) or header_alone(raw, writer)
        )
        store.checkpoints.save("s", sample_checkpoint("s", version=2, step=1))
        assert parsed == [] and headers == []  # its own last save's head: known by how it begins, nothing parsed
        other.checkpoints.save("s", sample_checkpoint("s", version=3, step=2))
        assert len(parsed) == 1  # another store's head (its cache knows nothing): read whole, as before
        store.checkpoints.save("s", sample_checkpoint("s", version=4, step=3))
        assert len(parsed) == 2  # the head is the other store's now
        store.checkpoints.load("s")
        store.checkpoints.save("s", sample_checkpoint("s", version=5, step=4))
        assert len(parsed) == 3 and len(headers) == 2  # the load read it whole; the save, its header alone
        loaded = other.checkpoints.load("s")
        assert loaded is not None and loaded.version == 5
    finally:
        store.close()
        other.close()
