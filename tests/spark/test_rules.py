"""spark-apply replay rules beyond the random oracle: --append-only for tables without any key, and
streamed (large, in-progress) transactions, from the real tool and hand-written per docs/event-format.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, table_dir_name
from tests.util import err, pgrecv, sql

pytest.importorskip("pyspark")
deltalake = pytest.importorskip("deltalake")


def _read(target: Path, schema: str, table: str, fmt: str) -> list[dict[str, Any]]:
    path = target / table_dir_name(schema, table)
    if fmt == "delta":
        return list(deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist())
    import pyarrow.parquet as pq

    return list(pq.read_table(path / "current").to_pylist())


def _canon(rows: list[dict[str, Any]], cols: list[str]) -> list[str]:
    """Rows as sorted JSON texts (a multiset: duplicates count)."""
    return sorted(json.dumps([r[c] for c in cols], default=str) for r in rows)


def _dict_rows(dsn: str, query: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return list(cur.execute(query).fetchall())


def _config(src: Path | tuple[Path, ...], target: Path, fmt: str, **kw: Any) -> ApplyConfig:
    sources = tuple(str(p) for p in (src if isinstance(src, tuple) else (src,)))
    return ApplyConfig(sources, target, fmt=fmt, engine="delta-rs", **kw)


# --- --append-only ---------------------------------------------------------------------------------


def test_append_only_for_a_table_without_replica_identity(db_dsn: str, tmp_path: Path, spark: Any) -> None:
    sql(db_dsn, "CREATE TABLE log (at integer, msg text); CREATE TABLE keyed (id integer PRIMARY KEY, v text)")
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p")
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, "INSERT INTO log SELECT g % 3, 'm' || (g % 2) FROM generate_series(1, 12) g")  # duplicate rows
    sql(db_dsn, "INSERT INTO keyed VALUES (1, 'a'), (2, 'b'); UPDATE keyed SET v = 'c' WHERE id = 2")
    sql(db_dsn, "INSERT INTO log VALUES (NULL, NULL), (NULL, NULL); DELETE FROM keyed WHERE id = 1")
    src = tmp_path / "c.jsonl"
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "-f", str(src))
    assert proc.returncode == 0, err(proc)
    for fmt in ("delta", "parquet"):
        target = tmp_path / fmt
        # without --append-only the keyless table is held back alone, the other one is applied
        held = {t.table: t for t in run_apply(_config(src, target, fmt), spark=spark).tables}
        assert held["public.log"].status == "held back" and "--append-only" in held["public.log"].error
        assert held["public.keyed"].status == "applied"
        assert not (target / table_dir_name("public", "log")).exists()
        first = run_apply(_config(src, target, fmt, append_only=True), spark=spark)
        assert {t.table: t.status for t in first.tables} == {"public.log": "applied", "public.keyed": "up to date"}
        again = run_apply(_config(src, target, fmt, append_only=True), spark=spark)  # nothing appended twice
        assert {t.status for t in again.tables} == {"up to date"}
        for table, cols in (("log", ["at", "msg"]), ("keyed", ["id", "v"])):
            want = _canon(_dict_rows(db_dsn, f"SELECT * FROM {table}"), cols)
            assert _canon(_read(target, "public", table, fmt), cols) == want, (fmt, table)


# --- streamed transactions from the real tool ------------------------------------------------------


def test_streamed_transactions_from_pgrecv_start(db_dsn: str, tmp_path: Path, spark: Any) -> None:
    """Transactions larger than logical_decoding_work_mem are streamed in chunks, interleaved with small
    ones, with a rolled back savepoint and an aborted large transaction; pgrecv start reassembles them."""
    sql(db_dsn, "CREATE TABLE big (id integer PRIMARY KEY, pad text, n integer)")
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p")
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, "INSERT INTO big SELECT g, 'base', 0 FROM generate_series(1, 50) g")
    with psycopg.connect(db_dsn) as large, psycopg.connect(db_dsn) as aborted, psycopg.connect(db_dsn) as small:
        small.autocommit = True
        large.execute("INSERT INTO big SELECT g, repeat('x', 100), 1 FROM generate_series(1000, 3999) g")
        aborted.execute("INSERT INTO big SELECT g, repeat('y', 100), 2 FROM generate_series(5000, 7999) g")
        small.execute("UPDATE big SET n = 10 WHERE id <= 10")
        large.execute("SAVEPOINT a")
        large.execute("INSERT INTO big SELECT g, repeat('z', 100), 3 FROM generate_series(8000, 9999) g")
        small.execute("INSERT INTO big VALUES (100, 'small', 4)")
        large.execute("ROLLBACK TO SAVEPOINT a")
        large.execute("UPDATE big SET n = n + 100, pad = 'large' WHERE id <= 20 OR id BETWEEN 1000 AND 1100")
        large.execute("DELETE FROM big WHERE id BETWEEN 30 AND 40 OR id BETWEEN 3000 AND 3499")
        aborted.rollback()
        small.execute("DELETE FROM big WHERE id = 50")
        large.commit()
    src = tmp_path / "s.jsonl"
    dsn = f"{db_dsn} options='-c logical_decoding_work_mem=64kB'"
    proc = pgrecv("start", "-d", dsn, "--slot", "s", "--streaming", "on", "--until-caught-up", "-f", str(src))
    assert proc.returncode == 0, err(proc)
    streamed = sql(db_dsn, "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 's'")
    # the large committed one at least (PostgreSQL 17+ discards the aborted one before streaming it)
    assert streamed and streamed[0][0] >= 1, f"the server did not stream: {streamed}"
    want = _canon(_dict_rows(db_dsn, "SELECT * FROM big"), ["id", "pad", "n"])
    for fmt in ("delta", "parquet"):
        target = tmp_path / fmt
        summary = run_apply(_config(src, target, fmt), spark=spark)
        assert summary.incomplete == 0
        assert _canon(_read(target, "public", "big", fmt), ["id", "pad", "n"]) == want, fmt


# --- streamed chunks, hand-written -----------------------------------------------------------------

REL: dict[str, Any] = {
    "op": "relation",
    "schema": "s",
    "table": "t",
    "replica_identity": "default",
    "key": ["id"],
    "columns": [
        {"name": "id", "type": "integer", "typmod": -1, "key": True},
        {"name": "x", "type": "text", "typmod": -1, "key": False},
    ],
}


def _chg(op: str, i: int, x: str | None, lsn: str, xid: int, commit: str | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"op": op, "schema": "s", "table": "t", "xid": xid, "commit_lsn": commit, "lsn": lsn}
    rec["commit_time"] = None
    if op == "delete":
        rec |= {"old": {"id": i}, "old_kind": "key"}
    else:
        rec |= {"new": {"id": i, "x": x}, "unchanged_toast": []}
        if op == "update":
            rec |= {"old": None, "old_kind": None}
    return rec


def _stream(xid: int, first: bool, *rows: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"op": "stream_start", "xid": xid, "first": first}, *rows, {"op": "stream_stop", "xid": xid}]


def _lines(records: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps({"v": 1, **r}) + b"\n" for r in records)


def test_hand_written_stream_records(tmp_path: Path, spark: Any) -> None:
    t0 = "2026-01-01T00:00:00Z"
    part1 = [
        REL,
        {"op": "begin", "xid": 400, "commit_lsn": "0/100", "commit_time": t0},
        _chg("insert", 1, "base", "0/90", 400, "0/100"),
        {"op": "commit", "xid": 400, "commit_lsn": "0/100", "end_lsn": "0/101", "commit_time": t0},
        *_stream(
            500, True, _chg("insert", 2, "streamed", "0/200", 500), _chg("update", 1, "from stream", "0/210", 500)
        ),
    ]
    part2 = [
        # a small transaction commits between the chunks of 500
        {"op": "begin", "xid": 450, "commit_lsn": "0/300", "commit_time": t0},
        _chg("insert", 3, "small", "0/290", 450, "0/300"),
        {"op": "commit", "xid": 450, "commit_lsn": "0/300", "end_lsn": "0/301", "commit_time": t0},
        *_stream(
            500, False, _chg("insert", 4, "sub rolled back", "0/400", 501), _chg("insert", 5, "sub", "0/410", 502)
        ),
        {"op": "stream_abort", "xid": 500, "subxid": 501, "abort_lsn": None, "abort_time": None},
        *_stream(600, True, _chg("insert", 6, "aborted", "0/420", 600), _chg("delete", 1, None, "0/421", 600)),
        {"op": "stream_abort", "xid": 600, "subxid": 600, "abort_lsn": None, "abort_time": None},
        *_stream(500, False, _chg("delete", 3, None, "0/500", 500)),
        *_stream(700, True, _chg("insert", 7, "never committed", "0/510", 700)),
        {"op": "stream_commit", "xid": 500, "commit_lsn": "0/600", "end_lsn": "0/601", "commit_time": t0},
    ]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(_lines(part1))
    b.write_bytes(_lines(part2))
    for fmt in ("delta", "parquet"):
        target = tmp_path / fmt
        first = run_apply(_config(a, target, fmt), spark=spark)  # 500 not committed yet: only 400
        assert first.incomplete == 1
        assert sorted((r["id"], r["x"]) for r in _read(target, "s", "t", fmt)) == [(1, "base")]
        done = run_apply(_config((a, b), target, fmt), spark=spark)
        assert (done.transactions, done.incomplete) == (3, 1)  # 400, 450, 500 committed; 700 open
        got = sorted((r["id"], r["x"]) for r in _read(target, "s", "t", fmt))
        assert got == [(1, "from stream"), (2, "streamed"), (5, "sub")], fmt
        assert done.tables[0].applied_lsn == "0/600"
