"""The reader's transaction rules and input errors (pure: no Spark, no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.errors import InputError
from pgrecv.spark.inputs import check_snapshots
from tests.spark.oracle.read import Reader
from tests.spark.oracle.reduce import reduce_changes

REL = {
    "v": 1,
    "op": "relation",
    "schema": "s",
    "table": "t",
    "replica_identity": "default",
    "key": ["id"],
    "columns": [{"name": "id", "type": "integer", "typmod": -1, "key": True}],
}


def _lines(*recs: dict[str, Any]) -> list[bytes]:
    return [orjson.dumps({"v": 1, **r}) + b"\n" for r in recs]


def _ins(i: int, c: str, lsn: str = "0/1", **extra: Any) -> dict[str, Any]:
    return {
        "op": "insert",
        "schema": "s",
        "table": "t",
        "commit_lsn": c,
        "lsn": lsn,
        "new": {"id": i},
        "unchanged_toast": [],
        **extra,
    }


def _ids(reader: Reader) -> list[int]:
    res = reader.result()
    t = res.tables.get(("s", "t"))
    red = reduce_changes(t.changes if t else [], ["id"], full=False, history=False)
    return sorted(r.values["id"] for r in red.upserts.values())


def test_only_committed_and_cut_transactions_are_dropped() -> None:
    r = Reader()
    r.feed_lines(
        _lines(
            REL,
            {"op": "begin", "commit_lsn": "0/10"},
            _ins(1, "0/10"),  # cut: begin again
            {"op": "begin", "commit_lsn": "0/20"},
            _ins(2, "0/20"),
            {"op": "commit", "commit_lsn": "0/20"},
            {"op": "begin", "commit_lsn": "0/30"},
            _ins(3, "0/30"),
        ),
        "f",
    )  # no commit
    assert _ids(r) == [2]
    assert r.res.incomplete == 2


def test_prepared_waits_for_its_outcome() -> None:
    r = Reader()
    r.feed_lines(
        _lines(
            REL,
            {"op": "begin_prepare", "gid": "a"},
            _ins(1, None),
            {"op": "prepare", "gid": "a"},
            {"op": "begin_prepare", "gid": "b"},
            _ins(2, None),
            {"op": "prepare", "gid": "b"},
            {"op": "begin_prepare", "gid": "c"},
            _ins(3, None),
            {"op": "prepare", "gid": "c"},
            {"op": "commit_prepared", "gid": "a", "commit_lsn": "0/40"},
            {"op": "rollback_prepared", "gid": "b"},
        ),
        "f",
    )
    assert _ids(r) == [1]
    assert [p.gid for p in r.res.pending] == ["c"]
    # carried over: the pending lines alone, then its commit, apply it
    r2 = Reader()
    r2.feed_lines(r.res.pending[0].lines, "carried")
    r2.feed_lines(_lines({"op": "commit_prepared", "gid": "c", "commit_lsn": "0/50"}), "g")
    assert _ids(r2) == [3]


def test_order_is_numeric_lsn_not_text() -> None:
    r = Reader()
    r.feed_lines(
        _lines(
            REL,
            {"op": "begin", "commit_lsn": "10/0"},
            {
                "op": "delete",
                "schema": "s",
                "table": "t",
                "commit_lsn": "10/0",
                "lsn": "F/FFFFFFF0",
                "old": {"id": 1},
                "old_kind": "key",
            },
            {"op": "commit", "commit_lsn": "10/0"},
            {"op": "begin", "commit_lsn": "9/0"},
            _ins(1, "9/0", "8/0"),
            {"op": "commit", "commit_lsn": "9/0"},
        ),
        "f",
    )
    assert _ids(r) == []  # insert at 9/0, then delete at 10/0


@pytest.mark.parametrize(
    ("line", "what"),
    [
        (b'{"v":1,"op":"begin","commit_lsn":"0/1"\n', "not valid JSON"),
        (b'{"v":1,"op":"begin"}\n', "lacks the field"),
        (b'{"v":1,"op":"begin","commit_lsn":"zz"}\n', "bad record"),
        (b'{"v":1,"op":"begin","commit_lsn":"0/1"}', "truncated"),
    ],
)
def test_bad_line_names_file_and_line(line: bytes, what: str) -> None:
    r = Reader()
    with pytest.raises(InputError, match=rf"^f:3: .*{what}"):
        r.feed_lines([*_lines(REL, {"op": "message"}), line], "f")


@pytest.mark.parametrize("lsn", ["-1/-5", "0/0x10", "0/1_0", "0/+5", "1/", "/1", "123456789/0"])
@pytest.mark.parametrize("field", ["commit_lsn", "lsn"])
def test_malformed_lsns_are_refused(field: str, lsn: str) -> None:
    """int(x, 16) alone reads "-5", "0x10" and "1_0": each half must be plain hex digits."""
    ins = {**_ins(1, "0/10", "0/2"), field: lsn}
    r = Reader()
    line = 2 if field == "commit_lsn" else 3  # the begin holds the commit LSN too
    with pytest.raises(InputError, match=rf"^f:{line}: .*invalid LSN"):
        r.feed_lines(_lines(REL, {"op": "begin", "commit_lsn": ins["commit_lsn"]}, ins), "f")


def test_a_redelivered_key_change_keeps_its_toast_value() -> None:
    """The copies of an at-least-once delivery collapse: the second copy of a key change that
    kept an unchanged TOAST value would otherwise meet its first copy's delete, and the row would
    lose the value."""
    rel = {**REL, "columns": [*REL["columns"], {"name": "big", "type": "text", "typmod": -1, "key": False}]}
    txn = [
        {"op": "begin", "commit_lsn": "0/10"},
        {**_ins(1, "0/10", "0/2"), "new": {"id": 1, "big": "B" * 10}},
        {
            "op": "update",
            "schema": "s",
            "table": "t",
            "commit_lsn": "0/10",
            "lsn": "0/3",
            "new": {"id": 2},
            "unchanged_toast": ["big"],
            "old": {"id": 1},
            "old_kind": "key",
        },
        {"op": "commit", "commit_lsn": "0/10"},
    ]
    r = Reader()
    r.feed_lines(_lines(rel, *txn, *txn), "f")
    t = r.result().tables[("s", "t")]
    red = reduce_changes(t.changes, ["id"], full=False, history=False)
    assert [(row.values, set(row.missing)) for row in red.upserts.values()] == [({"id": 2, "big": "B" * 10}, set())]
    assert list(red.deletes) == [1]


def test_snapshot_without_manifest_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "0000000000000000-0000000001000000.snapshot-0001.jsonl"
    f.write_bytes(b"")
    with pytest.raises(InputError, match="re-run `pgrecv snapshot`"):
        check_snapshots([f])
