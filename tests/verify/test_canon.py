"""The canonical forms of pgrecv.verify.canon are the same text on both sides: PostgreSQL (SQL on a
real server) and Spark (a real session, from the types spark-apply stores), value by value; and
different values never share one form."""

from __future__ import annotations

import struct
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgrecv.verify.canon import canon
from tests.util import awkward_doubles

pytest.importorskip("pyspark")


def _both(conn: psycopg.Connection[Any], spark: Any, pg_type: str, spark_type: str, texts: list[str]) -> None:
    """``pg_type``: the column's type as SQL; its name as pgoutput's relation message gives it
    (format_type without the modifier) is what picks the form."""
    conn.prepare_threshold = None  # the table v is made again with another type each time
    conn.execute(sql.SQL("CREATE TEMP TABLE v (i int, x {})").format(sql.SQL(pg_type)))
    name = conn.execute(
        "SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = 'v'::regclass AND attname = 'x'"
    ).fetchone()[0]  # type: ignore[index]
    form = canon("x", name, spark_type)
    assert form is not None, name
    with conn.cursor().copy("COPY v FROM STDIN") as copy:
        for i, text in enumerate(texts):
            copy.write_row((i, text))
    ours = dict(conn.execute(sql.SQL("SELECT i, {} FROM v").format(form.pg)).fetchall())
    # the lake's values: PostgreSQL's, typed as spark-apply types them (read back through Spark)
    rows = conn.execute(sql.SQL("SELECT i, x FROM v")).fetchall()
    theirs = {
        r[0]: r[1] for r in spark.createDataFrame(rows, f"i int, x {spark_type}").selectExpr("i", form.spark).collect()
    }
    conn.execute("DROP TABLE v")
    wrong = [(texts[i], ours[i], theirs[i]) for i in ours if ours[i] != theirs[i]]
    assert wrong == [], wrong[:5]
    seen: dict[str, set[str]] = {}
    for i in range(len(texts)):
        seen.setdefault(ours[i], set()).add(str(rows[i][1]))
    assert [f for f, vs in seen.items() if len(vs) > 1] == []


def test_floats_compare_exactly(db_dsn: str, spark: Any) -> None:
    """Doubles over 600 decades, subnormals and the largest, and reals: the exact binary value, which
    neither side's printing decides (Java 17 prints 2.82879384806159E17 with 18 digits)."""
    xs = [*awkward_doubles(1500), 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 2.82879384806159e17]
    reals = [struct.unpack("f", struct.pack("f", x))[0] for x in xs if 1.2e-38 < abs(x) < 3e38]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _both(conn, spark, "double precision", "double", [repr(x) for x in xs] + ["NaN", "Infinity", "-Infinity", "0"])
        _both(conn, spark, "real", "float", [repr(x) for x in reals] + ["NaN", "-0"])


def test_other_types_compare_alike(db_dsn: str, spark: Any) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _both(conn, spark, "numeric(12,3)", "decimal(12,3)", ["1.500", "-0.001", "123456789.123", "0"])
        _both(conn, spark, "numeric", "decimal(38,18)", ["1.5", "1e-18", "-100", "0.000", "123456789012345678.9"])
        _both(conn, spark, "bigint", "bigint", ["0", "-9223372036854775808", "9223372036854775807"])
        _both(conn, spark, "boolean", "boolean", ["t", "f"])
        _both(conn, spark, "bytea", "binary", ["\\x00ff10", "\\x"])
        _both(conn, spark, "date", "date", ["1970-01-01", "0001-01-01", "9999-12-31", "2024-02-29", "1969-12-31"])
        ts = ["2024-02-29 12:34:56.789012", "1900-01-01 00:00:00", "0001-01-01 00:00:00", "9999-12-31 23:59:59.999999"]
        _both(conn, spark, "timestamp", "timestamp_ntz", ts)
        _both(conn, spark, "timestamptz", "timestamp", [t + "+05:30" for t in ts[:2]] + ["2024-01-01 00:00:00+00"])
        _both(conn, spark, "text[]", "array<string>", ['{a,"b c",NULL,"q\\"x"}', "{}", '{"ä€😀"}'])
        _both(conn, spark, "integer[]", "array<int>", ["{1,NULL,-3}", "{}"])
