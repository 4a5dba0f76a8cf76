"""The lean read (pgrecv/spark/read/lean.py, read_lean): a large input of one table, in latest mode,
without the first pass over its changes. It applies what the direct read applies with the same
summary; everything it does not take, and every line it would have to refuse, goes the ordinary
way with the same result or message, and nothing of the lean attempt is left in the target.
(Its size threshold is lowered here so that small inputs take it.)"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from pgrecv.errors import InputError
from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, Summary, Tuning, table_dir_name
from pgrecv.spark.read import direct
from pgrecv.spark.read import lean as lean_read
from tests.spark.test_direct import REFUSED as REFUSED_BY_THE_FIRST_PASS
from tests.spark.test_direct import _cut_input, _facts, _plain_input, _update
from tests.spark.test_engine import _insert, _rel, _rows, _txn, _write

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


@pytest.fixture(autouse=True, params=["few", "many"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with each structural pass: of few transactions (the begins collected) and
    of any number (each line keyed by its commit LSN); the input's head chooses otherwise."""
    monkeypatch.setattr(lean_read, "LEAN_FEW", 10**12 if request.param == "few" else -1)
    return str(request.param)


CONF: dict[str, str] = {}  # the runs' --conf


def _run(src: list[Path], target: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, lean: bool, fmt: str) -> Summary:
    monkeypatch.setattr(direct, "LEAN_MIN_BYTES", 0)
    config = ApplyConfig(tuple(str(s) for s in src), target, fmt=fmt, conf=dict(CONF))
    return run_apply(config, spark=spark, tuning=Tuning(lean=lean))


def _table(target: Path, fmt: str, table: str = "t") -> list[dict[str, Any]]:
    if fmt == "delta":
        return _rows(target, table)
    rows = pq.read_table(target / table_dir_name("public", table) / "current").to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def _both(
    srcs: list[list[Path]], tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, fmt: str, reads: list[str]
) -> Any:
    """Runs ``srcs`` in turn onto a target with the lean read allowed and onto one without; checks
    the reads each run took, and that both give the same summaries and tables; returns them."""
    got = {}
    for lean in (True, False):
        target = tmp_path / f"lake-{lean}"
        summaries = []
        for src, read in zip(srcs, reads, strict=True):
            summary = _run(src, target, spark, monkeypatch, lean, fmt)
            assert summary.input_read == (read if lean else "direct"), (lean, src)
            summaries.append(_facts(summary))
        got[lean] = (summaries, _table(target, fmt))
    assert got[True] == got[False]
    return got[True]


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_the_lean_read_applies_what_the_direct_read_applies(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, fmt: str, mode: str
) -> None:
    lines = _cut_input()
    a = _write(tmp_path / "a.jsonl", lines)
    rest = _write(tmp_path / "b.jsonl", _txn("0/300", [_insert("t", "0/300", "0/250", '{"id":9,"v":"late","n":"1"}')]))
    # the second run applies the rest once; the third finds nothing new (the lean read leaves that
    # to the first pass, whose counts say so exactly). The keyed pass leaves a transaction with
    # changes in two files (the cut copy, then the whole one) to the ordinary way.
    reads = ["lean", "lean" if mode == "few" else "direct", "direct"]
    summaries, rows = _both([[a], [a, rest], [a, rest]], tmp_path, spark, monkeypatch, fmt, reads)
    assert summaries[0][1:3] == (2, 1)  # two transactions, one incomplete
    assert summaries[0][0] == len(lines)
    assert summaries[0][4] == [("public.t", "applied", 5, 1, 0, 0, "0/200")]
    # the cut copy and the whole one: two lines of one change, counted as lines, applied once
    assert summaries[1][4] == [("public.t", "applied", 2, 0, 0, 0, "0/300")]
    assert summaries[2][4] == [("public.t", "up to date", 0, 0, 0, 0, "0/300")]
    assert [(r["id"], r["v"]) for r in rows] == [(0, "a0"), (1, "b"), (2, "a2"), (3, "a3"), (4, "a4"), (9, "late")]


def _two_tables() -> list[str]:
    u = [orjson.dumps(_rel("u", [("id", "integer")])).decode()]
    return u + _txn("0/300", [_insert("u", "0/300", "0/2F0", '{"id":1}')])


def _no_begin() -> list[str]:
    # a transaction whose begin is not in the input (an earlier file's): its changes are committed
    return _txn("0/300", [_insert("t", "0/300", "0/2F0", '{"id":7,"v":"x","n":"2"}')])[1:]


def _hidden_commit() -> list[str]:
    # a commit whose first bytes are a row change's: the JSON reader takes the later "op" key, so
    # it is a commit, which the structural pass (skipping row changes by their first bytes) missed
    lines = _txn("0/300", [_insert("t", "0/300", "0/2F0", '{"id":7,"v":"x","n":"2"}')])
    lines[-1] = lines[-1].replace('{"v":1,"op":"commit",', '{"v":1,"op":"insert","op":"commit",')
    assert lines[-1].startswith('{"v":1,"op":"insert",')
    return lines


def _other_spelling() -> list[str]:
    # a change's commit LSN spelled otherwise than its begin's (the same LSN): the main job finds
    # its transaction by the begin's text
    return _txn("0/300", [_insert("t", "0/0300", "0/2F0", '{"id":7,"v":"x","n":"2"}')])


def _twice_keyed() -> list[str]:
    # a change with two "commit_lsn" keys, the first another transaction's: the JSON reader takes
    # the later one, the structural pass the first (the main job's checksum differs)
    lines = _txn("0/300", [_insert("t", "0/300", "0/2F0", '{"id":7,"v":"x","n":"2"}')])
    lines[1] = lines[1].replace('"commit_lsn":"0/300"', '"commit_lsn":"0/200","commit_lsn":"0/300"')
    return lines


CASES = {
    "unchanged toast": lambda: _txn("0/300", [_update("t", "0/300", "0/2F0", '{"id":2,"n":"9"}', ["v"])]),
    "a commit behind a row change's first bytes": _hidden_commit,
    "a commit LSN spelled otherwise": _other_spelling,
    "truncate": lambda: _txn(
        "0/300",
        [
            '{"v":1,"op":"truncate","xid":1,"commit_lsn":"0/300","lsn":"0/2F0",'
            '"tables":[{"schema":"public","table":"t"}],"cascade":false,"restart_identity":false}'
        ],
    ),
    "two tables": _two_tables,
    "a change with two commit LSN keys": _twice_keyed,
    "no begin": _no_begin,
}


@pytest.mark.parametrize("case", list(CASES))
def test_inputs_the_lean_read_does_not_take_go_the_ordinary_way_alike(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, case: str, mode: str
) -> None:
    src = _write(tmp_path / "a.jsonl", [*_plain_input(), *CASES[case]()])
    # of few transactions, the main job takes a row change's commit LSN as the JSON reader does
    # (the later key), joined to a begun transaction's: the lean read applies it, alike
    read = "lean" if mode == "few" and case == "a change with two commit LSN keys" else "direct"
    summaries, rows = _both([[src]], tmp_path, spark, monkeypatch, "delta", [read])
    assert summaries[0][4][-1][1] == "applied"
    if case == "unchanged toast":
        assert [(r["id"], r["v"], float(r["n"])) for r in rows if r["id"] == 2] == [(2, "a2", 9.0)]
    if case in (
        "no begin",
        "a commit behind a row change's first bytes",
        "a commit LSN spelled otherwise",
        "a change with two commit LSN keys",
    ):
        assert 7 in [r["id"] for r in rows]
    # the lean attempt left no file behind: each target holds the ordinary run's files alone
    files = {lean: sorted(p.name for p in (tmp_path / f"lake-{lean}").rglob("*.parquet")) for lean in (True, False)}
    assert len(files[True]) == len(files[False]) > 0, files


def test_a_column_named_commit_lsn_before_the_envelopes_is_applied_alike(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The structural pass of any number of transactions takes a row change's commit LSN from
    after its first "commit_lsn" key; where that is a column's value (another transaction's LSN),
    the main job's checksum of the commit LSNs it parsed differs, and the run goes the ordinary
    way, applied alike. (Of few transactions, the main job joins the parsed one: lean.)"""
    rel = _rel("c", [("id", "integer"), ("commit_lsn", "text")])
    head = {"v": 1, "op": "insert", "schema": "public", "table": "c", "new": {"id": 1, "commit_lsn": "0/100"}}
    change = orjson.dumps({**head, "xid": 1, "commit_lsn": "0/300", "lsn": "0/2F0", "key": ["id"]}).decode()
    assert change.index('"commit_lsn":"0/100"') < change.index('"commit_lsn":"0/300"')
    first = _insert("c", "0/100", "0/F0", '{"id":0,"commit_lsn":"x"}')
    src = _write(tmp_path / "a.jsonl", [orjson.dumps(rel).decode(), *_txn("0/100", [first]), *_txn("0/300", [change])])
    got = {}
    for lean in (True, False):
        summary = _run([src], tmp_path / f"lake-{lean}", spark, monkeypatch, lean, "parquet")
        assert summary.input_read == ("lean" if lean and mode == "few" else "direct")
        got[lean] = (_facts(summary), _table(tmp_path / f"lake-{lean}", "parquet", "c"))
    assert got[True] == got[False]
    assert got[True][0][4] == [("public.c", "applied", 2, 0, 0, 0, "0/300")]
    assert [(r["id"], r["commit_lsn"]) for r in got[True][1]] == [(0, "x"), (1, "0/100")]


def test_row_changes_written_otherwise_are_read_as_the_others(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The structural pass skips row changes by pgrecv's first bytes; one written otherwise (with
    spaces, its op not first) is parsed there and left out by its op: still the lean read."""
    lines = _plain_input()
    spaced = json.dumps(orjson.loads(lines[2]))  # ", " and ": " between fields
    rec = orjson.loads(lines[3])
    reordered = orjson.dumps({k: rec[k] for k in sorted(rec)}).decode()  # "commit_lsn" first
    assert not spaced.startswith('{"v":1,"op":') and not reordered.startswith('{"v":1,"op":')
    lines[2:4] = [spaced, reordered]
    src = _write(tmp_path / "a.jsonl", lines)
    summaries, rows = _both([[src]], tmp_path, spark, monkeypatch, "parquet", ["lean"])
    assert summaries[0][4] == [("public.t", "applied", 5, 1, 0, 0, "0/200")]
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4]


REFUSED = [
    *REFUSED_BY_THE_FIRST_PASS,
    # lines that the lean read's structural pass does not read, or reads only in part
    ("xid of a commit a string", '{"v":1,"op":"commit","xid":"one","commit_lsn":"0/100"}', "not a valid JSON record"),
    (
        "format version of a change",
        _insert("t", "0/100", "0/99", '{"id":1}').replace('"v":1', '"v":2'),
        "unsupported format version v=2",
    ),
]


@pytest.mark.parametrize(("line", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_line_the_first_pass_refuses_is_refused_with_its_message(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, line: str, message: str
) -> None:
    """The lean read's jobs check every line as the first pass does; a line it would refuse
    sends the run the ordinary way, which names it, and nothing is applied."""
    monkeypatch.setattr(direct, "SNIFF_BYTES", 0)  # a head read would send some of these staged at once
    lines = _plain_input()
    lines.insert(3, line)
    src = _write(tmp_path / "a.jsonl", lines)
    errors = {}
    for lean in (True, False):
        with pytest.raises(InputError) as exc:
            _run([src], tmp_path / "lake", spark, monkeypatch, lean, "delta")
        errors[lean] = exc.value.message
    assert errors[True] == errors[False]
    assert f"{src}:4" in errors[True] and message in errors[True], errors[True]
    assert not (tmp_path / "lake" / table_dir_name("public", "t")).exists()


@pytest.mark.parametrize("shape", ["gzip", "crlf and blank lines"])
def test_compressed_input_and_other_line_ends_are_read_lean(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """The structural pass reads text, the main job JSON: both decompress a .gz alike, split
    CRLF lines alike and pass over lines of spaces alike, so their counts of the other lines agree."""
    data = "".join(x + "\n" for x in _cut_input()).encode()
    if shape == "gzip":
        src = tmp_path / "a.jsonl.gz"
        src.write_bytes(gzip.compress(data))
    else:
        src = tmp_path / "a.jsonl"
        src.write_bytes(data.replace(b"\n", b"\r\n") + b"\r\n   \r\n\n")
    summaries, _ = _both([[src]], tmp_path, spark, monkeypatch, "parquet", ["lean"])
    assert summaries[0][4] == [("public.t", "applied", 5, 1, 0, 0, "0/200")]


def test_one_change_transactions_are_read_lean(tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """OLTP's shape, a transaction per change, takes the lean read however many transactions
    there are: the driver gets no row per transaction (until 2026-12-05 it collected every begin,
    and inputs of more than 50,000 transactions took the first pass)."""
    lines = [orjson.dumps(_rel("t", [("id", "integer"), ("v", "text"), ("n", "numeric")])).decode()]
    for i in range(400):
        c = f"0/{0x1000 + 0x10 * i:X}"
        lines += _txn(c, [_insert("t", c, f"0/{0x1000 + 0x10 * i - 8:X}", f'{{"id":{i % 150},"v":"v{i}","n":"{i}"}}')])
    lines += [orjson.dumps({"v": 1, "op": "begin", "xid": 3, "commit_lsn": "0/9000"}).decode()]
    lines += [_insert("t", "0/9000", "0/8FF0", '{"id":999,"v":"cut","n":"1"}')]  # no commit: not applied
    src = _write(tmp_path / "a.jsonl", lines)
    summaries, rows = _both([[src]], tmp_path, spark, monkeypatch, "parquet", ["lean"])
    assert summaries[0][1:3] == (400, 1)
    assert summaries[0][4] == [("public.t", "applied", 400, 0, 0, 0, f"0/{0x1000 + 0x10 * 399:X}")]
    assert [(r["id"], r["v"]) for r in rows][:2] == [(0, "v300"), (1, "v301")] and len(rows) == 150


def test_more_begins_than_it_collects_take_the_other_structural_pass(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """An input estimated to hold few transactions that holds more than the structural pass of
    few collects goes on with the other one, still lean."""
    src = _write(tmp_path / "a.jsonl", _cut_input())  # two transactions
    monkeypatch.setattr(lean_read, "LEAN_BEGUN", 1)
    calls: list[str] = []
    for name in ("_read_begins", "_read_keyed"):
        monkeypatch.setattr(lean_read, name, _counted(calls, name, getattr(lean_read, name)))
    summaries, _ = _both([[src]], tmp_path, spark, monkeypatch, "parquet", ["lean"])
    assert summaries[0][4] == [("public.t", "applied", 5, 1, 0, 0, "0/200")]
    assert calls == (["_read_begins", "_read_keyed"] if mode == "few" else ["_read_keyed"])


def _counted(calls: list[str], name: str, f: Any) -> Any:
    def wrapped(*args: Any) -> Any:
        calls.append(name)
        return f(*args)

    return wrapped


@pytest.mark.parametrize(
    ("shape", "few"),
    [("2 transactions of 300 changes", True), ("300 transactions of 2 changes", False), ("gzip", False)],
)
def test_the_heads_estimate_the_transactions(tmp_path: Path, shape: str, few: bool) -> None:
    """The input's heads choose the structural pass: few transactions (at most LEAN_FEW, here
    20, estimated over the whole input's size) or not; a compressed head tells nothing."""
    n, size = (2, 300) if shape.startswith("2 ") else (300, 2)
    lines = [orjson.dumps(_rel("t", [("id", "integer")])).decode()]
    for t in range(n):
        c = f"0/{0x100000 + 0x1000 * t:X}"
        at = 0x100000 + 0x1000 * t - 16
        lines += _txn(c, [_insert("t", c, f"0/{at + i:X}", f'{{"id":{i}}}') for i in range(size)])
    src = _write(tmp_path / "a.jsonl", lines)
    if shape == "gzip":
        src = tmp_path / "a.jsonl.gz"
        src.write_bytes(gzip.compress((tmp_path / "a.jsonl").read_bytes()))
    assert src.stat().st_size > direct.SNIFF_BYTES or shape == "gzip"  # the estimate scales the head
    with pytest.MonkeyPatch.context() as m:
        m.setattr(lean_read, "LEAN_FEW", 20)
        assert lean_read.few_transactions([src], src.stat().st_size) is few


def test_more_cut_transactions_than_it_lists_keep_the_first_pass(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver lists the transactions without a commit record (the main job's filter) up to a
    bound; past it, the first pass, whose rows stay in Spark."""
    src = _write(tmp_path / "a.jsonl", _cut_input())  # one transaction cut at the end
    monkeypatch.setattr(lean_read, "LEAN_OPEN", 1)
    assert _run([src], tmp_path / "lake-1", spark, monkeypatch, True, "parquet").input_read == "lean"
    monkeypatch.setattr(lean_read, "LEAN_OPEN", 0)
    summary = _run([src], tmp_path / "lake-0", spark, monkeypatch, True, "parquet")
    assert summary.input_read == "direct"
    assert _table(tmp_path / "lake-0", "parquet") == _table(tmp_path / "lake-1", "parquet")


def test_below_its_size_threshold_the_first_pass_decides(tmp_path: Path, spark: Any) -> None:
    """Small inputs keep the first pass, whose counts choose one task for a small batch."""
    src = _write(tmp_path / "a.jsonl", _plain_input())
    assert src.stat().st_size < direct.LEAN_MIN_BYTES
    summary = run_apply(ApplyConfig((str(src),), tmp_path / "lake", fmt="delta"), spark=spark)
    assert summary.input_read == "direct"


def test_not_where_conf_sets_the_json_readers_filter_pushdown(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lean read turns the pushdown off for its main job, which must see every line to check it;
    a run whose --conf sets it keeps the first pass."""
    monkeypatch.setattr(direct, "LEAN_MIN_BYTES", 0)
    src = _write(tmp_path / "a.jsonl", _plain_input())
    conf = {"spark.sql.json.filterPushdown.enabled": "true"}
    cfg = ApplyConfig((str(src),), tmp_path / "lake", fmt="delta", conf=conf)
    assert run_apply(cfg, spark=spark).input_read == "direct"


@pytest.mark.parametrize("image", ['"not an object"', "[1]"], ids=["a string", "an array"])
def test_a_row_image_that_is_not_an_object_holds_its_table_back_named_with_json_columns(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, image: str
) -> None:
    """A table with a json column keeps its images as text through the lean read (as through the
    direct read): an image that is not a JSON object is still refused, by the ordinary way. (Until
    2026-12-03 the json column's Arrow UDF failed the task on it first: a traceback, every table
    stopped.)"""
    lines = [orjson.dumps(_rel("j", [("id", "integer"), ("doc", "jsonb")])).decode()]
    rows = [_insert("j", "0/100", f"0/{0x10 + i:X}", f'{{"id":{i},"doc":{{"a":{i}}}}}') for i in range(3)]
    lines += _txn("0/100", [*rows, _insert("j", "0/100", "0/20", image)])
    src = _write(tmp_path / "a.jsonl", lines)
    got = {}
    for lean in (True, False):
        summary = _run([src], tmp_path / f"lake-{lean}", spark, monkeypatch, lean, "delta")
        got[lean] = [(t.status, t.error) for t in summary.tables]
        assert summary.input_read == "staged"
    assert got[True] == got[False]
    assert got[True] == [
        ("held back", f"{src}:6: insert with a row image that is not a JSON object: the file is corrupt")
    ]


@pytest.fixture
def small_splits(spark: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Spark splits each input file into pieces of 256 bytes (as ``--conf`` would: the run's own
    split size does not replace it), read by several tasks: the structural passes find each
    line's place across splits and files."""
    monkeypatch.setitem(CONF, "spark.sql.files.maxPartitionBytes", "256b")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "256b")
    try:
        yield
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")


@pytest.mark.usefixtures("small_splits")
@pytest.mark.parametrize("fmt", ["parquet"])
def test_the_lean_read_of_many_splits_applies_what_the_direct_read_applies(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, fmt: str, mode: str
) -> None:
    """Transactions that cross the splits of a file: each change's place is still found, and a
    copy cut by a file's end then the whole one (in two files) is applied once (the keyed pass
    leaves that to the ordinary way)."""
    a = _write(tmp_path / "a.jsonl", _cut_input())
    rest = _write(tmp_path / "b.jsonl", _txn("0/300", [_insert("t", "0/300", "0/250", '{"id":9,"v":"late","n":"1"}')]))
    assert a.stat().st_size > 4 * 256
    reads = ["lean", "lean" if mode == "few" else "direct"]
    summaries, rows = _both([[a], [a, rest]], tmp_path, spark, monkeypatch, fmt, reads)
    assert summaries[0][4] == [("public.t", "applied", 5, 1, 0, 0, "0/200")]
    assert summaries[1][4] == [("public.t", "applied", 2, 0, 0, 0, "0/300")]
    assert [(r["id"], r["v"]) for r in rows] == [(0, "a0"), (1, "b"), (2, "a2"), (3, "a3"), (4, "a4"), (9, "late")]


def _refused_alike(src: Path, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs ``src`` with the lean read allowed and without: both refuse it with one message (the
    ordinary way's), and neither writes the table; returns the message."""
    errors = {}
    for lean in (True, False):
        with pytest.raises(InputError) as exc:
            _run([src], tmp_path / f"lake-{lean}", spark, monkeypatch, lean, "delta")
        errors[lean] = exc.value.message
        assert not (tmp_path / f"lake-{lean}" / table_dir_name("public", "t")).exists()
    assert errors[True] == errors[False]
    return errors[True]


@pytest.mark.parametrize("splits", ["one split", "small splits"])
@pytest.mark.parametrize("where", ["after its commit", "in another transaction"])
def test_a_row_change_outside_its_transaction_is_refused_as_the_ordinary_way_does(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, where: str, splits: str, request: pytest.FixtureRequest
) -> None:
    """A change of commit LSN 0/100 placed after that transaction's commit (next to the begin of
    0/200, or inside 0/200) is not applied with it: the lean read checks each change's place as
    the first pass does, so the run goes the ordinary way, which names the line, and nothing is
    applied."""
    if splits == "small splits":
        request.getfixturevalue("small_splits")
    lines = _plain_input()
    stray = _insert("t", "0/100", "0/20", '{"id":8,"v":"stray","n":"1"}')
    at = 8 if where == "after its commit" else 10
    lines.insert(at, stray)
    src = _write(tmp_path / "a.jsonl", lines)
    line = at + 1
    message = _refused_alike(src, tmp_path, spark, monkeypatch)
    assert f"{src}:{line}:" in message and "transaction" in message, message


@pytest.mark.parametrize("splits", ["one split", "small splits"])
def test_two_changes_that_swapped_transactions_are_refused_as_the_ordinary_way_does(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, splits: str, request: pytest.FixtureRequest
) -> None:
    """A change of 0/100 inside 0/200 and one of 0/200 inside 0/100: each transaction keeps its
    number of changes, and still the lean read leaves the input to the ordinary way, which names
    the first misplaced line."""
    if splits == "small splits":
        request.getfixturevalue("small_splits")
    lines = _plain_input()
    lines[3] = _insert("t", "0/200", "0/151", '{"id":8,"v":"swapped","n":"1"}')  # in 0/100's span
    lines.insert(10, _insert("t", "0/100", "0/11", '{"id":1,"v":"a1","n":"1.5"}'))  # in 0/200's span
    src = _write(tmp_path / "a.jsonl", lines)
    message = _refused_alike(src, tmp_path, spark, monkeypatch)
    assert f"{src}:4:" in message and "transaction" in message, message  # the first misplaced line
