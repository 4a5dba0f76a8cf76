"""Generated columns (PostgreSQL 18) and partitioned tables through pgoutput, on real servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.errors import ExitCode
from tests.util import err, pgrecv, sql


def rows_of(out: Path) -> list[dict[str, Any]]:
    files = [out] if out.is_file() else sorted(p for p in out.iterdir() if p.suffix == ".jsonl")
    recs = [orjson.loads(x) for f in files for x in f.read_bytes().splitlines()]
    return [r for r in recs if r["op"] in ("insert", "update", "delete", "truncate")]


def test_generated_columns_published_on_18(pg_server: Any, db_dsn: str, tmp_path: Path) -> None:
    sql(
        db_dsn,
        "CREATE TABLE g (id int PRIMARY KEY, price int, qty int, total int GENERATED ALWAYS AS (price * qty) STORED)",
    )
    args = ("create", "-d", db_dsn, "--slot", "s", "--publication", "pub", "--publish-generated-columns")
    if pg_server.version < 18:
        proc = pgrecv(*args)
        assert proc.returncode == ExitCode.SERVER_CONFIG and "PostgreSQL 18" in err(proc), err(proc)
        assert err(proc).count("\n") == 1 and sql(db_dsn, "SELECT count(*) FROM pg_publication") == [(0,)]
        pytest.skip("publish_generated_columns exists from PostgreSQL 18 on")
    proc = pgrecv(*args)
    assert proc.returncode == 0, err(proc)
    assert sql(db_dsn, "SELECT pubgencols FROM pg_publication WHERE pubname = 'pub'") == [("s",)]
    sql(db_dsn, "INSERT INTO g VALUES (1, 3, 4), (2, 5, 6)")
    sql(db_dsn, "UPDATE g SET qty = 10 WHERE id = 1")
    out = tmp_path / "o.jsonl"
    proc = pgrecv("start", "-d", db_dsn, "--slot", "s", "-f", str(out), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    got = [(r["op"], r["new"]) for r in rows_of(out)]
    assert got == [
        ("insert", {"id": 1, "price": 3, "qty": 4, "total": 12}),
        ("insert", {"id": 2, "price": 5, "qty": 6, "total": 30}),
        ("update", {"id": 1, "price": 3, "qty": 10, "total": 30}),
    ]
    # the SQL interface (peek) and a snapshot carry them as well
    peeked = [
        orjson.loads(x) for x in pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl").stdout.splitlines()
    ]
    assert all("total" in r["new"] for r in peeked if r["op"] == "insert")
    snap = tmp_path / "snap"
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "s2", "--output-dir", str(snap), "--publication", "pub")
    assert proc.returncode == 0, err(proc)
    snap_rows = [orjson.loads(x) for f in sorted(snap.glob("*.jsonl")) for x in f.read_bytes().splitlines()]
    assert sorted((r["new"]["id"], r["new"]["total"]) for r in snap_rows if r["op"] == "snapshot") == [(1, 30), (2, 30)]
