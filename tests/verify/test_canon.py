"""The canonical forms of pgrecv.verify.canon are the same text on both sides: PostgreSQL (SQL on a
real server) and Spark (a real session, from the types spark-apply stores), value by value; and
different values never share one form."""

from __future__ import annotations

import struct
from typing import Any

import orjson
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


def _as_applied(conn: psycopg.Connection[Any], spark: Any, pg_type: str, texts: list[str], policy: str) -> int:
    """Values of ``pg_type`` stored as spark-apply stores them under ``--bad-values policy``: their
    JSONL text (pgrecv's own converter), typed by spark-apply's own conversion, NULL where it cannot
    hold them (``null``), or kept as that text in a string column (``text``). Verify's form of each
    PostgreSQL value (under the same policy) must be the form of what the lake holds. Returns how
    many values the type could not hold."""
    from pyspark.sql import functions as F

    from pgrecv.output.values import text_converter
    from pgrecv.spark.replay.convert import scalar
    from pgrecv.spark.schema import column_type, spark_ddl

    conn.prepare_threshold = None
    conn.execute(sql.SQL("CREATE TEMP TABLE v (i int, x {})").format(sql.SQL(pg_type)))
    oid, typmod, name = conn.execute(
        "SELECT atttypid::int, atttypmod, format_type(atttypid, NULL) FROM pg_attribute "
        "WHERE attrelid = 'v'::regclass AND attname = 'x'"
    ).fetchone()  # type: ignore[misc]
    with conn.cursor().copy("COPY v FROM STDIN") as copy:
        for i, text in enumerate(texts):
            copy.write_row((i, text))
    ct = column_type(name, typmod)
    lake_type = spark_ddl(ct.arrow) if policy == "null" else "string"
    form = canon("x", name, lake_type, policy)  # type: ignore[arg-type]
    assert form is not None, (name, lake_type)
    ours = dict(conn.execute(sql.SQL("SELECT i, {} FROM v").format(form.pg)).fetchall())
    convert = text_converter(oid, name)
    raws = []
    for i, text in conn.execute("SELECT i, x::text FROM v").fetchall():
        value = text if convert is None else convert(text)
        raws.append((i, value if isinstance(value, str) else orjson.dumps(value).decode()))
    frame = spark.createDataFrame(raws, "i int, raw string")
    typed, ok = scalar(F.col("raw"), ct)
    stored = F.when(ok, typed) if policy == "null" else F.col("raw")
    rows = frame.select("i", stored.alias("x"), ok.alias("ok")).selectExpr("i", form.spark, "ok").collect()
    conn.execute("DROP TABLE v")
    theirs = {r[0]: r[1] for r in rows}
    wrong = [(texts[i], ours[i], theirs[i]) for i in ours if ours[i] != theirs[i]]
    assert wrong == [], (pg_type, policy, wrong[:5])
    return sum(1 for r in rows if not r[2])


def test_bad_values_compare_as_spark_apply_stored_them(db_dsn: str, spark: Any) -> None:
    """--bad-values null: a value spark-apply's conversion refuses is NULL on PostgreSQL's side too,
    and only such a value; --bad-values text: the string column holding the change files' text."""
    cases = {
        "numeric": ["1.5", "NaN", "Infinity", "-Infinity", "1e-19", "1e-18", "99999999999999999999.9", "1e20", "0"],
        "numeric(5,2)": ["NaN", "999.99", "-1.10", "0"],
        "date": ["2024-02-29", "infinity", "-infinity", "0044-03-15 BC", "10000-01-01", "0001-01-01", "9999-12-31"],
        "timestamp": ["infinity", "-infinity", "0001-01-01 00:00:00 BC", "10000-01-01 00:00:00", "2024-01-01 10:00:00"],
        "timestamptz": ["infinity", "12000-05-05 00:00:00+00", "0100-01-01 00:00:00+00 BC", "2024-01-01 10:00:00+00"],
        "integer[]": ["{1,2}", "{{1,2},{3,NULL}}", "{}", "[0:1]={5,6}"],
        "boolean[]": ["{t,NULL}", "{{t},{f}}"],
    }
    bad = {"null": {}, "text": {}}
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for policy, counts in bad.items():
            for pg_type, texts in cases.items():
                counts[pg_type] = _as_applied(conn, spark, pg_type, texts, policy)
    # the cases hold values spark-apply cannot store (else nothing was shown): numeric NaN, ±Infinity,
    # 1e-19 (19 decimals) and 1e20 (21 digits); dates BC, past 9999, ±infinity; multi-dimensional arrays
    expected = {"numeric": 5, "numeric(5,2)": 1, "date": 4, "timestamp": 2, "timestamptz": 2, "integer[]": 1}
    assert {k: v for k, v in bad["null"].items() if v} == {**expected, "boolean[]": 1}
