"""Column names PostgreSQL allows, through every read path and both formats (issue 54, M4 and M5):
backticks, dots, and the names of the replay's own columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, Tuning, table_dir_name
from tests.util import err, pgrecv

pytest.importorskip("pyspark")
deltalake = pytest.importorskip("deltalake")

# Every name a quoted identifier may hold that has bitten a Spark job: backticks (Spark's own
# quote), dots (its field separator), and the names of the columns the replay keeps beside a row.
COLUMNS = ["i`d", "a`b", "x.y", "`", "kind", "key", "v", "tv", "ok", "need", "root", "_k0", "_kind", "_v", "op", "c"]
NAME = "we`ird.t"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _read(path: Path, fmt: str, spark: Any) -> list[tuple[Any, ...]]:
    if fmt == "delta":
        rows = deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(path / "current").to_pylist()
    return sorted(tuple(r[c] for c in COLUMNS) for r in rows)


@pytest.mark.parametrize(
    ("tuning", "fmt"),
    [(Tuning(), "parquet"), (Tuning(direct=False), "delta"), (Tuning(one_pass=False, single_task=False), "parquet")],
    ids=["direct-parquet", "staged-delta", "step-by-step-parquet"],
)
def test_columns_with_backticks_dots_and_the_replays_own_names(
    db_dsn: str, tmp_path: Path, spark: Any, tuning: Tuning, fmt: str
) -> None:
    cols = ", ".join(f"{_ident(c)} {'integer PRIMARY KEY' if c == 'i`d' else 'text'}" for c in COLUMNS)
    table = _ident(NAME)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} ({cols})")
        conn.execute(f'ALTER TABLE {table} ALTER COLUMN "a`b" SET STORAGE EXTERNAL')
    made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p")
    assert made.returncode == 0, err(made)
    others = ", ".join(_ident(c) for c in COLUMNS[2:])
    files = []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for i in range(1, 21):
            big = chr(65 + i) * 5000  # TOASTed: later updates leave it unchanged
            values = ", ".join(["%s"] * len(COLUMNS))
            conn.execute(f"INSERT INTO {table} VALUES ({values})", (i, big, *[f"{c}{i}" for c in COLUMNS[2:]]))
    for step in range(2):
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(f'UPDATE {table} SET "x.y" = "x.y" || \'+\', "`" = NULL WHERE "i`d" % 3 = {step}')
            conn.execute(f'UPDATE {table} SET "i`d" = "i`d" + 100 WHERE "i`d" = {5 + step}')
            conn.execute(f'DELETE FROM {table} WHERE "i`d" = {10 + step}')
        out = tmp_path / f"{step}.jsonl"
        proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--consume", "-f", str(out))
        assert proc.returncode == 0, err(proc)
        files.append(out)
    assert '"unchanged_toast":["a`b"]' in files[1].read_text()
    with psycopg.connect(db_dsn) as conn:
        want = sorted(conn.execute(f'SELECT "i`d", "a`b", {others} FROM {table}').fetchall())
    target = tmp_path / fmt
    for f in files:  # two runs: the second updates rows the first wrote
        summary = run_apply(ApplyConfig((str(f),), target, fmt=fmt), spark=spark, tuning=tuning)
        assert [(t.status, t.error) for t in summary.tables] == [("applied", None)]
    assert _read(target / table_dir_name("public", NAME), fmt, spark) == want


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_a_schema_with_a_dot_gets_its_snapshot_barrier(db_dsn: str, tmp_path: Path, spark: Any, fmt: str) -> None:
    """A snapshot's manifest names schema and table apart (issue 54, M6): "s.x"."t" was listed as
    "s.x.t", read as table "x.t" of schema "s", a phantom held back on every run, and the real
    table got no TRUNCATE barrier, so a row deleted before a second snapshot stayed in the lake."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "s.x"')
        conn.execute('CREATE TABLE "s.x".t (id integer PRIMARY KEY, v text)')
        conn.execute("INSERT INTO \"s.x\".t SELECT g, 'v' || g FROM generate_series(1, 5) g")
        conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
    target = tmp_path / "lake"
    for n in range(2):  # the second snapshot after a delete: its barrier empties the table first
        if n:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                conn.execute('DELETE FROM "s.x".t WHERE id = 2')
        out = tmp_path / f"snap{n}"
        made = pgrecv("snapshot", "-d", db_dsn, "--slot", f"s{n}", "--output-dir", str(out), "-q")
        assert made.returncode == 0, err(made)
        summary = run_apply(ApplyConfig((str(out),), target, fmt=fmt), spark=spark)
        assert [(t.table, t.status, t.error) for t in summary.tables] == [("s.x.t", "applied", None)]
    path = target / table_dir_name("s.x", "t")
    if fmt == "delta":
        rows = deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(path / "current").to_pylist()
    assert sorted(r["id"] for r in rows) == [1, 3, 4, 5]
