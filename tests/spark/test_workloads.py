"""Real workloads, end to end: PostgreSQL's own OLTP benchmark (pgbench) streamed by `pgrecv start`
into a change directory, applied by spark-apply in both formats, each table equal to PostgreSQL's."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from pgrecv.pg.server import TempServer
from pgrecv.spark.model import ApplyConfig, table_dir_name
from tests.spark.oracle import run_apply
from tests.spark.test_apply_server import _read
from tests.util import err, pgrecv

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")

PGBENCH = {
    "pgbench_accounts": ["aid", "bid", "abalance", "filler"],
    "pgbench_branches": ["bid", "bbalance", "filler"],
    "pgbench_tellers": ["tid", "bid", "tbalance", "filler"],
    "pgbench_history": ["tid", "bid", "aid", "delta", "mtime", "filler"],
}


def _pgbench(server: TempServer, dsn: str, *args: str) -> None:
    proc = subprocess.run(
        [str(server.bin_dir / "pgbench"), *args, dsn], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def _norm(v: Any) -> Any:
    if isinstance(v, str):
        return v.rstrip()  # char(n) fillers: PostgreSQL pads them, pgoutput sends them padded too
    if hasattr(v, "tzinfo") and v.tzinfo is not None:
        return v.replace(tzinfo=None)  # timestamp without time zone: both sides naive
    return v


# On every server (issue 56 asks for PostgreSQL 15 and 18): 30-40 s a version in CI, 2026-12-07.
def test_pgbench_tables_equal_postgres(db_dsn: str, pg_server: TempServer, tmp_path: Path, spark: Any) -> None:
    """`pgbench -i` (its rows loaded by COPY, after the primary keys: one WAL record per batch of
    rows, each row with the batch's LSN) and `pgbench -c 4` (one-statement-per-row OLTP
    transactions), streamed by `pgrecv start --output-dir` in two runs, applied after each: every
    pgbench table equals PostgreSQL's, in both formats (the keyless history with --append-only)."""
    made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p")
    assert made.returncode == 0, err(made)
    changes = tmp_path / "changes"
    _pgbench(pg_server, db_dsn, "-i", "-s", "1", "-I", "dtpg", "-q")  # tables, keys, then the rows
    for step in (1, 2):
        if step == 2:
            _pgbench(pg_server, db_dsn, "-c", "4", "-j", "2", "-t", "150", "-n")
        got = pgrecv("start", "-d", db_dsn, "--slot", "s", "--until-caught-up", "--output-dir", str(changes))
        assert got.returncode == 0, err(got)
        with psycopg.connect(db_dsn) as conn:
            want = {t: sorted(conn.execute(f"SELECT {', '.join(c)} FROM {t}").fetchall()) for t, c in PGBENCH.items()}
        for fmt in ("parquet", "delta"):
            target = tmp_path / fmt
            summary = run_apply(ApplyConfig((str(changes),), target, fmt=fmt, append_only=True), spark=spark)
            assert {t.status for t in summary.tables} <= {"applied", "up to date"}, summary.tables
            for table, cols in PGBENCH.items():
                rows = _read(target / table_dir_name("public", table), fmt, spark)
                got_rows = sorted(tuple(_norm(r[c]) for c in cols) for r in rows)
                assert got_rows == [tuple(_norm(v) for v in row) for row in want[table]], (fmt, table, step)


def test_two_hundred_tables_equal_postgres(db_dsn: str, tmp_path: Path, spark: Any) -> None:
    """A whole database's shape: 200 tables, filled, then changed by one-row OLTP transactions
    (updates, deletes, inserts, a key change) spread over them, streamed by `pgrecv start
    --output-dir` in two runs and applied after each: every table equals PostgreSQL's, in both
    formats, and the small tables are applied as a group (engine/together.py)."""
    import random

    names = [f"t{i:03d}" for i in range(200)]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for t in names:
            conn.execute(f"CREATE TABLE {t} (id integer PRIMARY KEY, v text, n numeric(10,2))")
    made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p")
    assert made.returncode == 0, err(made)
    changes = tmp_path / "changes"
    rng = random.Random(56)
    for step in (1, 2):
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            if step == 1:
                with conn.transaction():
                    for t in names:
                        conn.execute(f"INSERT INTO {t} SELECT g, 'v' || g, g / 4.0 FROM generate_series(1, 5) g")
            else:
                for i in range(400):  # one row a transaction, as OLTP has it
                    t = rng.choice(names)
                    k = rng.randint(1, 8)
                    what = rng.choice(["update", "update", "delete", "insert"])
                    if what == "update":
                        conn.execute(f"UPDATE {t} SET v = %s, n = n + 1 WHERE id = %s", (f"u{i}", k))
                    elif what == "delete":
                        conn.execute(f"DELETE FROM {t} WHERE id = %s", (k,))
                    else:
                        conn.execute(f"INSERT INTO {t} VALUES (%s, %s, 1.5) ON CONFLICT DO NOTHING", (100 + i, f"i{i}"))
                conn.execute(f"UPDATE {names[0]} SET id = 1000 WHERE id = 3")  # a key change
        got = pgrecv("start", "-d", db_dsn, "--slot", "s", "--until-caught-up", "--output-dir", str(changes))
        assert got.returncode == 0, err(got)
        with psycopg.connect(db_dsn) as conn:
            want = {t: sorted(conn.execute(f"SELECT id, v, n FROM {t}").fetchall()) for t in names}
        for fmt in ("parquet", "delta"):
            target = tmp_path / fmt
            summary = run_apply(ApplyConfig((str(changes),), target, fmt=fmt), spark=spark)
            assert {t.status for t in summary.tables} <= {"applied", "up to date"}, summary.warnings[:3]
            assert summary.tables_grouped == len([t for t in summary.tables if t.status == "applied"]) > 100
            for t in names:
                path = target / table_dir_name("public", t)
                # Parquet through pyarrow: 400 reads through Spark would take a minute
                rows = pq.read_table(path / "current").to_pylist() if fmt == "parquet" else _read(path, fmt, spark)
                assert sorted((r["id"], r["v"], r["n"]) for r in rows) == want[t], (fmt, t, step)
