"""A change directory applied run after run (cron): files every table applied are not read again
(pgrecv/spark/ledger.py), and the tables stay what PostgreSQL's would be."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.spark import sparkops
from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, Summary, table_dir_name
from tests.spark.changegen import Gen
from tests.spark.test_differential import _expected, _got
from tests.util import err, pgrecv

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")

ROWS = ("insert", "update", "delete")
COMMITS = ("commit", "commit_prepared", "rollback_prepared", "stream_commit", "stream_abort", "stream_prepare")


def _commit_lsn(rec: dict[str, Any]) -> str | None:
    return rec.get("commit_lsn") or rec.get("end_lsn") or rec.get("prepare_lsn")


def _name(lsn: str) -> str:
    hi, lo = lsn.split("/")
    return f"{int(hi, 16):08X}{int(lo, 16):08X}"


def _change_files(lines: list[str], parts: int) -> list[tuple[str, str]]:
    """The stream cut into about ``parts`` files as ``start --output-dir`` cuts it (after a
    transaction's end, never inside a streamed chunk), each named ``FIRST-LAST.jsonl`` by the
    first and last commit LSN it holds."""
    ends, open_chunk = [], False
    for i, line in enumerate(lines):
        op = orjson.loads(line)["op"]
        open_chunk = op == "stream_start" or (open_chunk and op != "stream_stop")
        if op in COMMITS and not open_chunk:
            ends.append(i + 1)
    step = max(1, len(ends) // parts)
    cuts = [*ends[step - 1 :: step][: parts - 1], len(lines)]
    out, start = [], 0
    relations: dict[tuple[str, str], str] = {}  # each table's last relation record so far
    for cut in cuts:
        chunk = lines[start:cut]
        # a new file repeats the relation records its rows need (pgrecv/stream/streamer.py)
        needed = {(r.get("schema"), r.get("table")) for r in map(orjson.loads, chunk) if r["op"] in ROWS}
        needed |= {
            (e["schema"], e["table"]) for r in map(orjson.loads, chunk) if r["op"] == "truncate" for e in r["tables"]
        }
        head = [relations[k] for k in sorted(needed) if k in relations]
        for x in lines[start:cut]:
            rec = orjson.loads(x)
            if rec["op"] == "relation":
                relations[(rec["schema"], rec["table"])] = x
        chunk = head + chunk
        start = cut
        lsns = [c for c in (_commit_lsn(orjson.loads(x)) for x in chunk) if c]
        if chunk and lsns:
            by_value = sorted(lsns, key=lambda s: int(_name(s), 16))
            out.append((f"{_name(by_value[0])}-{_name(by_value[-1])}.jsonl", "".join(x + "\n" for x in chunk)))
    return out


def _apply(src: Path, target: Path, fmt: str, spark: Any, **kw: Any) -> Summary:
    summary = run_apply(ApplyConfig((str(src),), target, fmt=fmt, **kw), spark=spark)
    assert [t.error for t in summary.tables if t.error] == []
    return summary


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
@pytest.mark.parametrize("seed", [3])
def test_each_run_reads_only_what_is_new_and_the_tables_stay_exact(
    tmp_path: Path, spark: Any, fmt: str, seed: int
) -> None:
    """Random streams (several tables; streamed, prepared, redelivered and cut transactions) in
    files added one by one, applied after each: the tables equal PostgreSQL's, and the runs skip
    the files applied before."""
    gen = Gen(seed, tables=3)
    files = _change_files(gen.run(50), 5)
    src, target = tmp_path / "changes", tmp_path / "lake"
    src.mkdir()
    skipped = []
    for i, (name, text) in enumerate(files):
        (src / name).write_text(text)
        carried = len(list((target / "_pgrecv" / "prepared").glob("*.jsonl")))  # prepared, outcome unseen
        s = _apply(src, target, fmt, spark)
        assert s.files - carried + s.files_skipped == i + 1
        skipped.append(s.files_skipped)
    assert max(skipped) > 0, f"no run skipped a file: the test shows nothing ({skipped})"
    truth = gen.truth()
    for t in gen.tables:
        assert _got(t, target, fmt) == _expected(t, truth[(t.schema, t.name)]), (t.name, seed)


def test_nothing_new_starts_no_spark(tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = Gen(5, tables=2, plain=True)
    src, target = tmp_path / "changes", tmp_path / "lake"
    src.mkdir()
    for name, text in _change_files(gen.run(20), 3):
        (src / name).write_text(text)
    first = _apply(src, target, "delta", spark)
    assert (first.files, first.files_skipped) == (3, 0)

    def no_spark(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a run with nothing new started Spark")

    monkeypatch.setattr(sparkops, "start_session", no_spark)
    again = run_apply(ApplyConfig((str(src),), target, fmt="delta"), spark=None)
    assert (again.files, again.files_skipped, again.tables) == (0, 3, [])
    # the files that may be retired, as the command lists them
    listed = pgrecv("spark-apply", str(src), "--target", str(target), "--format", "delta", "--list-applied")
    assert listed.returncode == 0, err(listed)
    assert listed.stdout.decode().splitlines() == [str(p) for p in sorted(src.iterdir())]
    (src / "0000000100000000-0000000100000000.jsonl").write_text("")  # a newer file: not listed
    listed = pgrecv("spark-apply", str(src), "--target", str(target), "--format", "delta", "--list-applied")
    assert len(listed.stdout.decode().splitlines()) == 3, listed.stdout


@pytest.mark.parametrize("change", ["table removed", "--table widened", "a file given by name"])
def test_what_the_record_cannot_vouch_for_is_read_again(tmp_path: Path, spark: Any, change: str) -> None:
    """A table removed from the target (it must be rebuilt from every file), options that choose
    what is applied and that no run used before, a file not named by a directory: every such file
    is read."""
    gen = Gen(6, tables=2, plain=True)
    src, target = tmp_path / "changes", tmp_path / "lake"
    src.mkdir()
    for name, text in _change_files(gen.run(24), 3):
        (src / name).write_text(text)
    t0, t1 = gen.tables
    only = (f"{t0.schema}.{t0.name}",) if change == "--table widened" else ()
    assert _apply(src, target, "parquet", spark, tables=only).files == 3
    if change == "table removed":
        shutil.rmtree(target / table_dir_name(t0.schema, t0.name))
    if change == "a file given by name":
        one = sorted(src.iterdir())[0]
        s = _apply(one, target, "parquet", spark)
        assert (s.files, s.files_skipped) == (1, 0)
        return
    s = _apply(src, target, "parquet", spark)
    assert (s.files, s.files_skipped) == (3, 0)
    if change == "table removed":
        assert any("missing or behind" in w for w in s.warnings), s.warnings
    truth = gen.truth()
    for t in (t0, t1):
        assert _got(t, target, "parquet") == _expected(t, truth[(t.schema, t.name)]), t.name
    assert _apply(src, target, "parquet", spark).files_skipped == 3  # and then the record holds again
    if change == "--table widened":  # each set of options keeps its own record (jobs taking turns)
        assert _apply(src, target, "parquet", spark, tables=only).files_skipped == 3
