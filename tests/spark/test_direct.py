"""The direct read of plain inputs (pgrecv/spark/direct.py): which inputs take it, that it applies
what the staged read applies with the same summary, and that every input it does not take, or
that the staged read would refuse, goes the staged way with the same result or message."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from pgrecv.errors import InputError
from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, Summary, Tuning, table_dir_name
from pgrecv.spark.read import direct
from pgrecv.spark.replay import committed as rp
from tests.spark.test_engine import _insert, _rel, _rows, _txn, _write

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


def _run(
    src: list[Path], target: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, enabled: bool, fmt: str = "delta"
) -> Summary:
    return run_apply(
        ApplyConfig(tuple(str(s) for s in src), target, fmt=fmt), spark=spark, tuning=Tuning(direct=enabled)
    )


def _facts(s: Summary) -> Any:
    tables = [(t.table, t.status, t.inserts, t.updates, t.deletes, t.truncates, t.applied_lsn) for t in s.tables]
    return (s.lines, s.transactions, s.incomplete, s.rolled_back, sorted(tables))


def _update(table: str, commit: str, lsn: str, new: str, unchanged: list[str] | None = None) -> str:
    head = {"v": 1, "op": "update", "schema": "public", "table": table, "xid": 1, "commit_lsn": commit, "lsn": lsn}
    toast = orjson.dumps(unchanged or []).decode()
    return orjson.dumps(head).decode()[:-1] + f',"key":["id"],"new":{new},"old":null,"unchanged_toast":{toast}}}'


def _plain_input() -> list[str]:
    lines = [orjson.dumps(_rel("t", [("id", "integer"), ("v", "text"), ("n", "numeric")])).decode()]
    lines += _txn(
        "0/100", [_insert("t", "0/100", f"0/{0x10 + i:X}", f'{{"id":{i},"v":"a{i}","n":"{i}.5"}}') for i in range(5)]
    )
    lines += _txn("0/200", [_update("t", "0/200", "0/150", '{"id":1,"v":"b","n":"7"}')])
    return lines


def _direct_as_staged(src: Path, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(facts, rows) of the direct read, checked equal to the staged read's."""
    got = {}
    for enabled in (True, False):
        summary = _run([src], tmp_path / f"lake{enabled}", spark, monkeypatch, enabled)
        assert summary.input_read == ("direct" if enabled else "staged")
        got[enabled] = (_facts(summary), _rows(tmp_path / f"lake{enabled}", "t"))
    assert got[True] == got[False]
    return got[True]


def _cut_input() -> list[str]:
    """:func:`_plain_input` and a transaction cut at the end of the input: counted incomplete,
    not applied, not in the position."""
    return [
        *_plain_input(),
        orjson.dumps({"v": 1, "op": "begin", "xid": 3, "commit_lsn": "0/300"}).decode(),
        _insert("t", "0/300", "0/250", '{"id":9,"v":"late","n":"1"}'),
    ]


def test_a_plain_input_is_read_directly_with_the_staged_reads_result(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _write(tmp_path / "a.jsonl", _cut_input())
    facts, rows = _direct_as_staged(src, tmp_path, spark, monkeypatch)
    assert facts[1:3] == (2, 1)  # two transactions, one incomplete
    assert facts[4] == [("public.t", "applied", 5, 1, 0, 0, "0/200")]
    assert [r["v"] for r in rows] == ["a0", "b", "a2", "a3", "a4"]
    # the rest of the cut transaction arrives: the next run applies it, once
    rest = _write(
        tmp_path / "b.jsonl",
        _txn("0/300", [_insert("t", "0/300", "0/250", '{"id":9,"v":"late","n":"1"}')]),
    )
    got = {}
    for enabled in (True, False):
        summary = _run([src, rest], tmp_path / f"lake{enabled}", spark, monkeypatch, enabled)
        got[enabled] = (_facts(summary), _rows(tmp_path / f"lake{enabled}", "t"))
    assert got[True] == got[False]
    # counts are of change records: the cut copy's insert and the whole one's
    assert got[True][0][4] == [("public.t", "applied", 2, 0, 0, 0, "0/300")]
    assert [r["id"] for r in got[True][1]] == [0, 1, 2, 3, 4, 9]


def test_one_transaction_whose_lines_spell_its_commit_lsn_differently(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first pass groups a transaction's lines by their commit LSN: spellings of one LSN
    (case, leading zeros) are one transaction, committed by its commit record."""
    lines = _plain_input()
    lines += [
        orjson.dumps({"v": 1, "op": "begin", "xid": 3, "commit_lsn": "0/3AB"}).decode(),
        _insert("t", "0/3ab", "0/2F0", '{"id":8,"v":"lower","n":"1"}'),
        _insert("t", "00000000/000003AB", "0/2F1", '{"id":9,"v":"padded","n":"1"}'),
        orjson.dumps({"v": 1, "op": "commit", "xid": 3, "commit_lsn": "0/3Ab", "end_lsn": "0/3AC"}).decode(),
    ]
    src = _write(tmp_path / "a.jsonl", lines)
    facts, rows = _direct_as_staged(src, tmp_path, spark, monkeypatch)
    assert facts[1:3] == (3, 0)  # three transactions, none incomplete
    assert facts[4] == [("public.t", "applied", 7, 1, 0, 0, "0/3AB")]
    assert [r["v"] for r in rows][-2:] == ["lower", "padded"]


def _stream_lines() -> list[str]:
    ins = (
        orjson.dumps(
            {"v": 1, "op": "insert", "schema": "public", "table": "t", "xid": 7, "lsn": "0/50", "key": ["id"]}
        ).decode()[:-1]
        + ',"new":{"id":1,"v":"s","n":"1"},"unchanged_toast":[]}'
    )
    return [
        orjson.dumps({"v": 1, "op": "stream_start", "xid": 7, "first": True}).decode(),
        ins,
        orjson.dumps({"v": 1, "op": "stream_stop", "xid": 7}).decode(),
        orjson.dumps(
            {"v": 1, "op": "stream_commit", "xid": 7, "commit_lsn": "0/300", "end_lsn": "0/301", "commit_time": None}
        ).decode(),
    ]


@pytest.mark.parametrize("sniff", [True, False], ids=["seen in the head", "seen by the first pass"])
@pytest.mark.parametrize(
    "case",
    ["streamed", "prepared", "no change lsn"],
)
def test_inputs_the_direct_read_does_not_take_go_staged_alike(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, case: str, sniff: bool
) -> None:
    """Each input goes staged with the same result, whether its first lines already show it not
    plain (no first pass) or only the first pass does (no head read: the sniff decides nothing)."""
    if not sniff:
        monkeypatch.setattr(direct, "SNIFF_BYTES", 0)
    lines = _plain_input()
    if case == "streamed":
        lines += _stream_lines()
    elif case == "prepared":
        env = {"xid": 8, "gid": "g1", "prepare_lsn": "0/400", "end_lsn": "0/401", "prepare_time": None}
        row = orjson.loads(_insert("t", "0/400", "0/390", '{"id":2,"v":"p","n":"1"}'))
        row.update(commit_lsn=None, gid="g1", xid=8)
        lines += [
            orjson.dumps({"v": 1, "op": "begin_prepare", **env}).decode(),
            orjson.dumps(row).decode(),
            orjson.dumps({"v": 1, "op": "prepare", **env}).decode(),
        ]
    else:  # test_decoding's changes have no LSN: their order is the file's
        lines += _txn("0/300", [_insert("t", "0/300", "0/1", '{"id":3,"v":"x","n":"1"}').replace('"lsn":"0/1",', "")])
    src = _write(tmp_path / "a.jsonl", lines)
    assert direct.looks_plain([src]) is not sniff
    got = {}
    for enabled in (True, False):
        summary = _run([src], tmp_path / f"lake{enabled}", spark, monkeypatch, enabled)
        assert summary.input_read == "staged"
        got[enabled] = (_facts(summary), _rows(tmp_path / f"lake{enabled}", "t"))
    assert got[True] == got[False]


def test_the_head_of_each_file_shows_inputs_that_are_not_plain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """looks_plain reads whole lines of each file's head only; what it cannot see decides nothing."""
    plain = _plain_input()
    prepare = orjson.dumps({"v": 1, "op": "begin_prepare", "xid": 8, "gid": "g1", "prepare_lsn": "0/400"}).decode()
    no_lsn = _insert("t", "0/300", "0/1", '{"id":3}').replace('"lsn":"0/1",', "")
    a = _write(tmp_path / "a.jsonl", plain)
    assert direct.looks_plain([a])
    for i, bad in enumerate([prepare, no_lsn, '{"v":1,"op":"insert",', "[1]", '{"v":1,"op":"snapshot"}']):
        b = _write(tmp_path / f"b{i}.jsonl", [*plain, bad])
        assert not direct.looks_plain([a, b]), bad
    # a compressed file's bytes are not lines (Spark's reader decompresses it)
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(x + "\n" for x in plain).encode()))
    assert direct.looks_plain([a, gz])
    # a cut last line (a file still being written) is not judged
    (tmp_path / "cut.jsonl").write_text("".join(x + "\n" for x in plain) + '{"v":1,"op":"ins')
    assert direct.looks_plain([a, tmp_path / "cut.jsonl"])
    # past the files it reads (a bounded amount, whatever the input), or past the head: left to
    # the first pass
    monkeypatch.setattr(direct, "SNIFF_FILES", 1)
    assert direct.looks_plain([a, tmp_path / "b0.jsonl"])
    monkeypatch.undo()
    pad = [_insert("t", "0/100", "0/10", '{"id":1,"v":"' + "x" * 1000 + '","n":"1"}')] * 80
    late = _write(tmp_path / "late.jsonl", [*plain, *_txn("0/100", pad), prepare])
    assert late.stat().st_size > direct.SNIFF_BYTES
    assert direct.looks_plain([late])


# lines the first pass (and the staged read) refuse, with their messages: (id, line, message)
REFUSED = [
    ("cut line", '{"v":1,"op":"insert","schema":"public",', "not a valid JSON record"),
    ("bad lsn", _insert("t", "0/300", "-1/-5", '{"id":1}'), "invalid LSN '-1/-5'"),
    # a transaction's commit LSN is checked on every line, as the others
    ("bad commit lsn", _insert("t", "0/0x10", "0/301", '{"id":1}'), "invalid LSN '0/0x10'"),
    ("bad commit lsn of a begin", '{"v":1,"op":"begin","xid":3,"commit_lsn":"0/3g0"}', "invalid LSN '0/3g0'"),
    (
        "xid a string",
        _insert("t", "0/300", "0/301", '{"id":1}').replace('"xid":1', '"xid":"one"'),
        "not a valid JSON record",
    ),
    (
        "json_nulls a number",
        _insert("t", "0/300", "0/301", '{"id":1}').replace('"unchanged_toast":[]', '"json_nulls":5'),
        "not a valid JSON record",
    ),
    ("format version", '{"v":2,"op":"begin","commit_lsn":"0/300"}', "unsupported format version v=2"),
]


@pytest.mark.parametrize(("line", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_line_the_staged_read_refuses_is_refused_with_its_message(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, line: str, message: str
) -> None:
    """The first pass parses every field the staged read parses, with the same types: a line with
    a value of the wrong type in a field the replay never reads is still named."""
    monkeypatch.setattr(direct, "SNIFF_BYTES", 0)  # the first pass's checks (a head read sends a cut line staged)
    lines = _plain_input()
    lines.insert(3, line)
    src = _write(tmp_path / "a.jsonl", lines)
    errors = {}
    for enabled in (True, False):
        with pytest.raises(InputError) as exc:
            _run([src], tmp_path / "lake", spark, monkeypatch, enabled)
        errors[enabled] = exc.value.message
    assert errors[True] == errors[False]
    assert f"{src}:4" in errors[True] and message in errors[True], errors[True]
    assert not (tmp_path / "lake" / table_dir_name("public", "t")).exists()


def test_a_row_image_that_is_not_an_object_holds_its_table_back_named(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first pass checks that images are objects (the direct read may parse them as structs);
    the staged read then names the line. (It used to store such an image as a row of NULLs.)"""
    lines = _plain_input()
    lines.insert(3, _insert("t", "0/100", "0/99", '"not an object"'))
    src = _write(tmp_path / "a.jsonl", lines)
    got = {}
    for enabled in (True, False):
        summary = _run([src], tmp_path / f"lake{enabled}", spark, monkeypatch, enabled)
        got[enabled] = [(t.status, t.error) for t in summary.tables]
        assert summary.input_read == "staged"
    assert got[True] == got[False]
    assert got[True] == [
        ("held back", f"{src}:4: insert with a row image that is not a JSON object: the file is corrupt")
    ]


@pytest.mark.parametrize("rule", ["filter", "join"])
def test_a_transaction_appended_after_the_first_pass_is_left_for_the_next_run(
    tmp_path: Path, spark: Any, rule: str
) -> None:
    """Only what the first pass saw committed counts: a file that grows meanwhile (a transaction
    added after its commit LSNs were taken, the rest of a cut one) does not change what this run
    applies, whether the committed changes are a filter (Plain.keep) or a join to the commits."""
    cut = _insert("t", "0/300", "0/250", '{"id":9,"v":"late","n":"1"}')
    begin = orjson.dumps({"v": 1, "op": "begin", "xid": 3, "commit_lsn": "0/300"}).decode()
    src = _write(tmp_path / "a.jsonl", [*_plain_input(), begin, cut])
    plain = direct.read_plain(spark, [src], tmp_path / "links")
    assert plain is not None
    assert (plain.last_commit, plain.uncommitted) == (0x200, [0x300])
    with open(src, "a") as f:
        rest = [orjson.dumps({"v": 1, "op": "commit", "commit_lsn": "0/300"}).decode()]
        rest += _txn("0/900", [_insert("t", "0/900", "0/850", '{"id":7,"v":"n","n":"1"}')])
        f.write("".join(x + "\n" for x in rest))
    keep = plain.keep() if rule == "filter" else None
    changes, pending = rp.committed(
        plain.records(), [], plain.structure, None if keep is not None else plain.commits, keep
    )
    assert pending is None
    got = sorted((r["c"], r["l"]) for r in changes.select("c", "l").collect())
    assert got == sorted([(0x100, 0x10 + i) for i in range(5)] + [(0x200, 0x150)])
    plan = changes._jdf.queryExecution().executedPlan().toString()
    assert ("Join" in plan) is (rule == "join")
    plain.per.unpersist()


def test_an_input_without_a_commit_applies_nothing(tmp_path: Path, spark: Any) -> None:
    """Only a cut transaction (no commit record at all): the filter keeps nothing, and the counts
    have no committed change."""
    lines = [
        orjson.dumps(_rel("t", [("id", "integer"), ("v", "text"), ("n", "numeric")])).decode(),
        orjson.dumps({"v": 1, "op": "begin", "xid": 3, "commit_lsn": "0/300"}).decode(),
        _insert("t", "0/300", "0/250", '{"id":9,"v":"late","n":"1"}'),
    ]
    src = _write(tmp_path / "a.jsonl", lines)
    plain = direct.read_plain(spark, [src], tmp_path / "links")
    assert plain is not None
    assert (plain.last_commit, plain.uncommitted) == (None, [0x300])
    assert (plain.structure.transactions, plain.structure.incomplete) == (0, 1)
    changes, _ = rp.committed(plain.records(), [], plain.structure, None, plain.keep())
    assert changes.count() == 0
    assert plain.committed_counts().count() == 0
    plain.per.unpersist()


def test_uncommitted_changes_too_many_to_list_are_left_out_by_the_join(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past direct.UNCOMMITTED_LISTED transactions cut without their commit, the committed changes
    are those joined to the commit LSNs, with the same result as the staged read."""
    monkeypatch.setattr(direct, "UNCOMMITTED_LISTED", 1)
    lines = _plain_input()
    for i, c in enumerate(("0/300", "0/400")):  # two cut transactions (as if in two files' tails)
        lines += [
            orjson.dumps({"v": 1, "op": "begin", "xid": 3 + i, "commit_lsn": c}).decode(),
            _insert("t", c, f"0/{0x250 + 0x100 * i:X}", f'{{"id":{9 + i},"v":"late","n":"1"}}'),
        ]
    src = _write(tmp_path / "a.jsonl", lines)
    plain = direct.read_plain(spark, [src], tmp_path / "links")
    assert plain is not None and plain.uncommitted is None and plain.keep() is None
    plain.per.unpersist()
    facts, rows = _direct_as_staged(src, tmp_path, spark, monkeypatch)
    assert facts[1:3] == (2, 2)
    assert facts[4] == [("public.t", "applied", 5, 1, 0, 0, "0/200")]
    assert [r["v"] for r in rows] == ["a0", "b", "a2", "a3", "a4"]


def test_images_are_parsed_by_the_reader_only_where_their_texts_stay_exact(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table with a json column keeps its images as text (the server's exact json text); other
    tables' images are parsed by the JSON reader, also where column names differ only in case
    (two columns to PostgreSQL). Both apply as the staged read does."""
    cases = {
        "j": ([("id", "integer"), ("doc", "jsonb")], '{{"id":{i},"doc":{{"a":12345678901234567890123}}}}'),
        "c": ([("id", "integer"), ("a", "text"), ("A", "text")], '{{"id":{i},"a":"low{i}","A":"up{i}"}}'),
        "p": ([("id", "integer"), ("a", "text")], '{{"id":{i},"a":"x{i}"}}'),
    }
    for name, (cols, image) in cases.items():
        lines = [orjson.dumps(_rel(name, cols)).decode()]
        lines += _txn("0/100", [_insert(name, "0/100", f"0/{0x10 + i:X}", image.format(i=i)) for i in range(3)])
        src = _write(tmp_path / f"{name}.jsonl", lines)
        plain = direct.read_plain(spark, [src], tmp_path / f"links-{name}")
        assert plain is not None
        from pgrecv.spark.engine.facts import image_type as _image_type

        kind = _image_type([("public", name)], plain.structure, {("public", name): _Empty()}, _Config())
        assert (kind is None) == (name == "j"), (name, kind)
        plain.per.unpersist()
        got = {}
        for enabled in (True, False):
            lake = tmp_path / f"{name}-{enabled}"
            summary = _run([src], lake, spark, monkeypatch, enabled, fmt="parquet")
            assert summary.input_read == ("direct" if enabled else "staged")
            got[enabled] = sorted(pq.read_table(lake / table_dir_name("public", name) / "current").to_pylist(), key=str)
            if name == "c":  # Delta takes column names case-insensitively: that table is held back, said why
                summary = _run([src], tmp_path / f"{name}-{enabled}-delta", spark, monkeypatch, enabled)
                assert [t.status for t in summary.tables] == ["held back"]
                assert "columns 'a' and 'A' differ only in case" in (summary.tables[0].error or "")
        assert got[True] == got[False]
        if name == "j":
            assert got[True][0]["doc"] == '{"a":12345678901234567890123}'
        if name == "c":
            assert [(r["a"], r["A"]) for r in got[True]] == [(f"low{i}", f"up{i}") for i in range(3)]


class _Empty:
    schema = None


class _Config:
    append_only = False
    mode = "latest"


@pytest.mark.parametrize("many", [False, True], ids=["broadcast", "shuffled"])
def test_commits_too_many_to_broadcast_are_joined_to_the_changes_by_a_shuffle(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, many: bool
) -> None:
    """The first pass keeps one commit LSN per transaction. A broadcast of them is built in the
    driver's JVM, so OLTP's one-change transactions would make the driver's memory grow with the
    input: past replay.BROADCAST_COMMITS they are sorted and merged (and the one table gets its
    copy of the changes, so that its passes do not sort the input again, and its counts come from
    that copy), with the same result, staged or direct."""
    # the changes are joined to the commits only where the uncommitted are too many to list
    monkeypatch.setattr(direct, "UNCOMMITTED_LISTED", 0)
    if many:
        monkeypatch.setattr(rp, "BROADCAST_COMMITS", 1)
    lines = [
        *_plain_input(),  # and a cut transaction, which must stay out either way
        orjson.dumps({"v": 1, "op": "begin", "xid": 3, "commit_lsn": "0/300"}).decode(),
        _insert("t", "0/300", "0/250", '{"id":9,"v":"late","n":"1"}'),
    ]
    src = _write(tmp_path / "a.jsonl", lines)
    plain = direct.read_plain(spark, [src], tmp_path / "links")
    assert plain is not None and plain.structure.transactions == 2
    assert rp.broadcasts_commits(plain.structure) is not many
    changes, _ = rp.committed(plain.records(), [], plain.structure, plain.commit_keys())
    assert len(changes.collect()) == 6
    # the plan as it ran: tiny as they are here, the commits would be broadcast but for the hint
    plan = changes._jdf.queryExecution().executedPlan().toString()
    plain.per.unpersist()
    assert "isFinalPlan=true" in plan
    assert ("SortMergeJoin" in plan) is many
    assert ("BroadcastHashJoin" in plan) is not many
    facts, rows = _direct_as_staged(src, tmp_path, spark, monkeypatch)
    assert facts[1:3] == (2, 1)
    assert facts[4] == [("public.t", "applied", 5, 1, 0, 0, "0/200")]
    assert [r["v"] for r in rows] == ["a0", "b", "a2", "a3", "a4"]
