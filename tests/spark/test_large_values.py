"""Values past the JSON parser's default limits reach the lake whole (issue 54, H1).

Jackson, under Spark's JSON reader, refuses by default a string of over 20,000,000 characters, a
number of over 1,000 digits and nesting deeper than 1,000; Spark's permissive reader then nulled
the record, and spark-apply dropped the row (or wrote it all NULL) with exit 0. PostgreSQL's values
reach 1 GB (a 10 MB bytea is 20M hex characters), jsonb numbers 131,072 digits, jsonb nesting
thousands of levels. Each read path is driven by a real server's stream: plain transactions (the
lean read of one large table, the direct read of two tables) and a streamed transaction (the
staged read)."""

from __future__ import annotations

import hashlib
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, table_dir_name
from tests.util import err, pgrecv, sql

pytest.importorskip("pyspark")
deltalake = pytest.importorskip("deltalake")

LIMIT = 20_000_000  # Jackson's default maxStringLen
SCHEMA = "CREATE TABLE big (id integer PRIMARY KEY, t text, j jsonb, b bytea)"
DEEP = 1500  # levels of jsonb nesting (Jackson's default maxNestingDepth: 1000)
DIGITS = 1500  # digits of a jsonb number (its default maxNumLen: 1000)


def _rows(dsn: str) -> dict[int, tuple[Any, ...]]:
    """id -> (len, sha256) of t, the jsonb's text and b's hex, as PostgreSQL computes them."""
    q = (
        "SELECT id, length(t), encode(sha256(convert_to(t, 'UTF8')), 'hex'), "
        "length(j::text), encode(sha256(convert_to(j::text, 'UTF8')), 'hex'), "
        "length(b), encode(sha256(b), 'hex') FROM big"
    )
    with psycopg.connect(dsn) as conn:
        return {r[0]: r[1:] for r in conn.execute(q)}


def _lake(target: Path, fmt: str) -> dict[int, tuple[Any, ...]]:
    import pyarrow.parquet as pq

    path = target / table_dir_name("public", "big")
    if fmt == "delta":
        table = deltalake.DeltaTable(str(path)).to_pyarrow_table()
    else:
        table = pq.read_table(str(path / "current"))

    def digest(v: str | bytes | None) -> tuple[int | None, str | None]:
        if v is None:
            return None, None
        return len(v), hashlib.sha256(v.encode() if isinstance(v, str) else v).hexdigest()

    # the lake keeps the text of jsonb the server sent, which is PostgreSQL's own j::text
    return {r["id"]: (*digest(r["t"]), *digest(r["j"]), *digest(r["b"])) for r in table.to_pylist()}


def _write_rows(dsn: str, together: bool) -> None:
    """Six rows (and an update), each in a transaction of its own or all in one ``together``
    (large enough for the server to stream it in chunks)."""
    deep = "[" * DEEP + "1" + "]" * DEEP
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction() if together else nullcontext():
        conn.execute("INSERT INTO big VALUES (1, 'small', '{\"a\": 1}', '\\x00')")
        conn.execute("INSERT INTO big VALUES (2, repeat('a', %s), NULL, NULL)", (LIMIT - 1_000_000,))
        conn.execute("INSERT INTO big VALUES (3, repeat('b', %s), NULL, NULL)", (LIMIT + 1_000_000,))
        conn.execute(
            "INSERT INTO big VALUES (4, 'j', jsonb_build_object('s', repeat('c', %s), 'n', %s::numeric), NULL)",
            (LIMIT + 1_000_000, "1" + "0" * (DIGITS - 1)),
        )
        conn.execute("INSERT INTO big VALUES (5, 'deep', %s::jsonb, NULL)", (deep,))
        conn.execute("INSERT INTO big VALUES (6, 'bytes', NULL, decode(repeat('ab', %s), 'hex'))", (LIMIT // 2 + 10,))
        conn.execute("UPDATE big SET t = t || 'x' WHERE id = 3")


READ = {"lean": "lean", "direct": "direct", "streamed": "staged"}  # the read each shape takes


@pytest.mark.newest_server  # the subject is Spark's JSON reading, not the server
@pytest.mark.parametrize("shape", list(READ))
def test_values_past_the_json_parsers_limits_are_applied_whole(
    db_dsn: str, tmp_path: Path, spark: Any, shape: str
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p")
    assert made.returncode == 0, err(made)
    _write_rows(db_dsn, together=shape == "streamed")
    if shape == "direct":  # a second table: not the lean read's input of one table
        sql(db_dsn, "CREATE TABLE other (id integer PRIMARY KEY); INSERT INTO other VALUES (1)")
    out = tmp_path / "a.jsonl"
    dsn = db_dsn + " options='-c logical_decoding_work_mem=64kB'"
    args = ["-o", "streaming=on"] if shape == "streamed" else []
    proc = pgrecv("peek", "-d", dsn, "--slot", "s", "--format", "jsonl", "-f", str(out), *args, timeout=600)
    assert proc.returncode == 0, err(proc)
    assert (b'"op":"stream_start"' in out.read_bytes()) == (shape == "streamed")
    want = _rows(db_dsn)
    assert len(want) == 6 and want[3][0] == LIMIT + 1_000_001
    for fmt in ("delta", "parquet"):
        target = tmp_path / fmt
        summary = run_apply(ApplyConfig((str(out),), target, fmt=fmt), spark=spark)
        assert summary.input_read == READ[shape]
        assert [(t.status, t.inserts) for t in summary.tables if t.table == "public.big"] == [("applied", 6)]
        got = _lake(target, fmt)
        assert sorted(got) == sorted(want), fmt
        for key in want:
            assert got[key] == want[key], (fmt, key)
