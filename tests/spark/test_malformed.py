"""Malformed input in the Spark replay (issue 54, L5): what the staged read would refuse is refused
on every read path (direct, staged, lean) with ``file:line`` and nothing applied (exit 9), and what
only a table's plan can judge holds that table back alone (exit 15). The oracle agrees."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.errors import InputError
from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, Summary, Tuning, table_dir_name
from pgrecv.spark.read import direct
from tests.spark import oracle
from tests.spark.test_engine import _insert, _rel, _rows, _txn, _write

pytest.importorskip("pyspark")

PATHS = ("direct", "staged", "lean")


def _apply(src: Path, target: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str) -> Summary:
    """The product's run over ``src`` on one read path."""
    if path == "lean":
        monkeypatch.setattr(direct, "LEAN_MIN_BYTES", 0)
    tuning = {"direct": Tuning(lean=False), "staged": Tuning(direct=False), "lean": Tuning()}[path]
    return run_apply(ApplyConfig((str(src),), target, fmt="delta"), spark=spark, tuning=tuning)


def _oracle(src: Path, target: Path, spark: Any) -> Any:
    return oracle.run_apply(oracle.ApplyConfig((str(src),), target, fmt="delta", replay="driver"), spark=spark)


def _nothing_applied(target: Path) -> bool:
    return not (target / table_dir_name("public", "t")).exists()


def _with(lines: list[str], bad: str) -> list[str]:
    """A relation record of ``t``, a good insert and ``bad`` in one transaction."""
    rel = orjson.dumps(_rel("t", [("id", "integer"), ("v", "text")])).decode()
    return [rel, *_txn("0/100", [_insert("t", "0/100", "0/10", '{"id":1,"v":"a"}'), bad]), *lines]


BAD_LINES = {
    "table null": _insert("t", "0/100", "0/20", '{"id":2,"v":"b"}').replace('"table":"t"', '"table":null'),
    "schema missing": _insert("t", "0/100", "0/20", '{"id":2,"v":"b"}').replace('"schema":"public",', ""),
    "unknown op": _insert("t", "0/100", "0/20", '{"id":2,"v":"b"}').replace('"op":"insert"', '"op":"upsert"'),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", list(BAD_LINES))
def test_a_row_change_without_its_table_or_with_an_unknown_op_is_refused(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str, bad: str
) -> None:
    src = _write(tmp_path / "a.jsonl", _with([], BAD_LINES[bad]))
    target = tmp_path / "lake"
    with pytest.raises(InputError) as err:
        _apply(src, target, spark, monkeypatch, path)
    assert f"{src}:4:" in err.value.message, err.value.message
    assert "corrupt" in err.value.message
    assert _nothing_applied(target)
    with pytest.raises(InputError, match=f"{src}:4:"):
        _oracle(src, tmp_path / "oracle", spark)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("image", ['{"v":"b"}', '{"id":null,"v":"b"}'], ids=["absent", "null"])
def test_an_insert_without_its_key_holds_its_table_back(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str, image: str
) -> None:
    """Not a row of a NULL key: the table is held back (exit 15), the line named."""
    src = _write(tmp_path / "a.jsonl", _with([], _insert("t", "0/100", "0/20", image)))
    target = tmp_path / "lake"
    summary = _apply(src, target, spark, monkeypatch, path)
    (t,) = summary.tables
    assert t.status == "held back", t
    assert t.error is not None and f"{src}:4:" in t.error and "key column" in t.error and "corrupt" in t.error
    assert _nothing_applied(target)
    with pytest.raises(InputError, match=f"{src}:4:"):
        _oracle(src, tmp_path / "oracle", spark)


@pytest.mark.parametrize("path", PATHS)
def test_a_delete_whose_old_image_lacks_its_key_holds_its_table_back(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    head = {"v": 1, "op": "delete", "schema": "public", "table": "t", "xid": 1, "commit_lsn": "0/100", "lsn": "0/20"}
    src = _write(tmp_path / "a.jsonl", _with([], orjson.dumps({**head, "old": {"v": "a"}}).decode()))
    summary = _apply(src, tmp_path / "lake", spark, monkeypatch, path)
    (t,) = summary.tables
    assert t.status == "held back" and t.error is not None and f"{src}:4:" in t.error, t


@pytest.mark.parametrize("path", ["direct", "staged"])
@pytest.mark.parametrize("where", ["after its commit", "in another transaction", "before a cut copy"])
def test_a_row_change_outside_its_transaction_is_refused(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str, where: str
) -> None:
    """A change of commit LSN 0/100 after that transaction's commit is not applied with it."""
    rel = orjson.dumps(_rel("t", [("id", "integer"), ("v", "text")])).decode()
    stray = _insert("t", "0/100", "0/20", '{"id":2,"v":"b"}')
    lines = [rel, *_txn("0/100", [_insert("t", "0/100", "0/10", '{"id":1,"v":"a"}')])]
    if where == "after its commit":
        lines += [stray, *_txn("0/200", [_insert("t", "0/200", "0/110", '{"id":3,"v":"c"}')])]
        line = 5
    elif where == "before a cut copy":  # then the transaction again, cut by the file's end
        lines += [stray, *_txn("0/100", [_insert("t", "0/100", "0/10", '{"id":1,"v":"a"}')])[:-1]]
        line = 5
    else:
        lines += _txn("0/200", [_insert("t", "0/200", "0/110", '{"id":3,"v":"c"}'), stray])
        line = 7
    src = _write(tmp_path / "a.jsonl", lines)
    target = tmp_path / "lake"
    with pytest.raises(InputError) as err:
        _apply(src, target, spark, monkeypatch, path)
    assert f"{src}:{line}:" in err.value.message and "transaction" in err.value.message, err.value.message
    assert _nothing_applied(target)
    if where != "in another transaction":  # (the oracle files a row by its place, not by its commit LSN)
        with pytest.raises(InputError, match=f"{src}:{line}:"):
            _oracle(src, tmp_path / "oracle", spark)


@pytest.mark.parametrize("path", ["direct", "staged"])
def test_a_transaction_sent_twice_is_still_applied_once(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The positional check leaves an at-least-once delivery alone (the same transaction again,
    in the same file and in another)."""
    rel = orjson.dumps(_rel("t", [("id", "integer"), ("v", "text")])).decode()
    txn = _txn("0/100", [_insert("t", "0/100", "0/10", '{"id":1,"v":"a"}')])
    a = _write(tmp_path / "a.jsonl", [rel, *txn, *txn])
    target = tmp_path / "lake"
    summary = _apply(a, target, spark, monkeypatch, path)
    assert [t.status for t in summary.tables] == ["applied"]
    assert [(r["id"], r["v"]) for r in _rows(target, "t")] == [(1, "a")]


@pytest.mark.parametrize("path", PATHS)
def test_a_type_change_within_the_input_holds_its_table_back(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """text, then integer, in one batch: not stored as text (the docs: a type change fails)."""
    lines = [
        orjson.dumps(_rel("t", [("id", "integer"), ("v", "text")])).decode(),
        *_txn("0/100", [_insert("t", "0/100", "0/10", '{"id":1,"v":"a"}')]),
        orjson.dumps(_rel("t", [("id", "integer"), ("v", "integer")])).decode(),
        *_txn("0/200", [_insert("t", "0/200", "0/110", '{"id":2,"v":5}')]),
    ]
    src = _write(tmp_path / "a.jsonl", lines)
    target = tmp_path / "lake"
    summary = _apply(src, target, spark, monkeypatch, path)
    (t,) = summary.tables
    assert t.status == "held back" and t.error is not None and "changed type from text" in t.error, t
    assert _nothing_applied(target)
    with pytest.raises(InputError, match="changed type"):
        _oracle(src, tmp_path / "oracle", spark)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("forged", [False, True], ids=["as named", "forged far ahead"])
def test_a_commit_past_its_files_name_is_refused(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str, forged: bool
) -> None:
    """A file ``FIRST-LAST.jsonl`` holds commits up to LAST: one far past it would move the table's
    position past every later transaction (all of them skipped, without a word)."""
    rel = orjson.dumps(_rel("t", [("id", "integer"), ("v", "text")])).decode()
    last = "7FFFFFFF/0" if forged else "0/200"
    lines = [
        rel,
        *_txn("0/100", [_insert("t", "0/100", "0/10", '{"id":1,"v":"a"}')]),
        *_txn(last, [_insert("t", last, "0/110", '{"id":2,"v":"b"}')]),
    ]
    src = _write(tmp_path / f"{0x100:016X}-{0x200:016X}.jsonl", lines)
    target = tmp_path / "lake"
    if not forged:
        summary = _apply(src, target, spark, monkeypatch, path)
        assert [(t.status, t.applied_lsn) for t in summary.tables] == [("applied", "0/200")]
        return
    with pytest.raises(InputError) as err:
        _apply(src, target, spark, monkeypatch, path)
    assert f"{src}:7:" in err.value.message and "7FFFFFFF/0" in err.value.message, err.value.message
    assert _nothing_applied(target)
    with pytest.raises(InputError, match=f"{src}:7:"):
        _oracle(src, tmp_path / "oracle", spark)


@pytest.mark.parametrize(
    ("path", "op"),
    [("direct", "insert"), ("staged", "insert"), ("lean", "insert"), ("direct", "truncate"), ("staged", "truncate")],
)
def test_a_change_of_a_table_without_its_relation_record_is_refused(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str, op: str
) -> None:
    """A change of a table no relation record describes was dropped unread, as if the table were
    not wanted (exit 0); now the input is refused, naming its line."""
    if op == "insert":
        stray = _insert("u", "0/100", "0/20", '{"id":2}')
    else:
        stray = orjson.dumps(
            {
                "v": 1,
                "op": "truncate",
                "xid": 1,
                "commit_lsn": "0/100",
                "lsn": "0/20",
                "tables": [{"schema": "public", "table": "u"}],
            }
        ).decode()
    src = _write(tmp_path / "a.jsonl", _with([], stray))
    target = tmp_path / "lake"
    with pytest.raises(InputError) as err:
        _apply(src, target, spark, monkeypatch, path)
    assert f"{src}:4:" in err.value.message and "public.u" in err.value.message, err.value.message
    assert _nothing_applied(target)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("second", ["another value", "a delete"])
def test_two_different_changes_of_one_row_at_one_position_hold_its_table_back(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, path: str, second: str
) -> None:
    """Copies of one change (same commit LSN and LSN) collapse, and the rows of one COPY share a
    position, each of its own key; two different changes of the same row at one position are
    neither: which one is last would depend on the read path. The table is held back, named."""
    head = {"v": 1, "schema": "public", "table": "t", "xid": 1, "commit_lsn": "0/100", "lsn": "0/20"}
    one = orjson.dumps({**head, "op": "update", "new": {"id": 1, "v": "b"}}).decode()
    other = {**head, "op": "update", "new": {"id": 1, "v": "c"}}
    if second == "a delete":
        other = {**head, "op": "delete", "old": {"id": 1}}
    src = _write(tmp_path / "a.jsonl", [*_with([], one)[:-1], orjson.dumps(other).decode(), _with([], one)[-1]])
    summary = _apply(src, tmp_path / "lake", spark, monkeypatch, path)
    (t,) = summary.tables
    assert t.status == "held back" and t.error is not None and "same row" in t.error, t
    assert f"{src}:" in t.error and "corrupt" in t.error, t.error
