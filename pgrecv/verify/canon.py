"""The canonical text of a value, the same on both sides: PostgreSQL computes it in SQL on the
snapshot, Spark from the lake's typed column. Equal rows give equal text, so their hashes agree.

The forms follow spark-apply's type mapping (docs/spark-apply.md): integers and decimals in plain
digits (decimals with the lake's scale; kept as text, without trailing zeros); floats by their exact binary
value (an integer mantissa and a power of two, computed alike on both sides); timestamps as
microseconds since the epoch (±infinity as spark-apply stores them: Spark's largest and smallest timestamps); dates as
days; bytea as hex; arrays of integers, booleans and strings as JSON; every type spark-apply
stores as PostgreSQL's text as that text (the type's output function, as pgoutput sends it). A
column of another shape is not compared, and the report names it.

A row's text is its values joined by a control character, those of text-like types as
``LENGTH:TEXT``, so no two different rows share one text; its hash is the first 60 bits of its
MD5. A key of one integer column is its own hash (no MD5 per row for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from psycopg import sql

from pgrecv.spark.model import BadValues
from pgrecv.spark.replay.convert import TS_MAX, TS_MIN
from pgrecv.spark.schema import quoted

_INTEGERS = {"smallint", "integer", "bigint", "oid", "xid", "cid", "xid8"}
_FLOATS = {"real", "double precision"}
_TIMESTAMPS = {"timestamp without time zone", "timestamp with time zone"}
_SIMPLE_ARRAY_ELEMENTS = _INTEGERS | {"boolean", "text", "character varying", "uuid", "name"}
# arrays whose JSON text (a column --bad-values text made a string) is the same from PostgreSQL's
# array_to_json as in the change files (no strings: their escapes' hex digits differ in case)
_JSON_TEXT_ELEMENTS = {"smallint", "integer", "bigint", "boolean"}


def _micros(text: str) -> int:
    """Microseconds since the epoch of a UTC timestamp's text."""
    moment = datetime.fromisoformat(text).replace(tzinfo=UTC)
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


# ±infinity as spark-apply stores them (pgrecv/spark/replay/convert.py: Spark's largest and smallest)
TS_MAX_MICROS = _micros(TS_MAX)
TS_MIN_MICROS = _micros(TS_MIN)

# Spark types (simpleString) a lake column may have for each comparison
_SPARK_INTS = {"smallint", "int", "bigint", "decimal(20,0)"}


@dataclass(frozen=True)
class Canon:
    """One column's canonical text on each side: PostgreSQL SQL and Spark SQL, NULL kept NULL."""

    pg: sql.Composable
    spark: str
    kind: str  # which form (a key of kind "integer" is its own hash: pgrecv/verify/sides.py)


def canon(name: str, pg_type: str, spark_type: str | None, bad_values: BadValues = "fail") -> Canon | None:
    """The canonical forms of column ``name`` of PostgreSQL type ``pg_type`` stored in the lake as
    ``spark_type`` (a Spark ``simpleString``; None: the lake has no such column, so its side is
    NULL); None when this pair has no shared form (the column is not compared). ``bad_values``:
    spark-apply's policy (under ``null``, a value its column type cannot hold is NULL on
    PostgreSQL's side too; under ``text`` the column is a string column, compared as text)."""
    c = sql.Identifier(name)
    s = quoted(name)
    kind = _kind(pg_type, spark_type)
    if kind is None:
        return None
    pg, spark = _FORMS[kind]
    if kind == "numeric" and spark_type is not None:
        # the lake's decimal(p,s) prints every value with its s decimals, as PostgreSQL's round(v, s)
        # does (a value with more decimals than s was never stored: spark-apply holds it back)
        scale = int(spark_type.rstrip(")").split(",")[1])
        pg = f"round({{c}}, {scale})::text"
    poison = _poison(kind, spark_type) if bad_values == "null" and spark_type is not None else None
    if poison is not None:
        pg = f"CASE WHEN {poison} THEN NULL ELSE {pg} END"
    lake = "CAST(NULL AS STRING)" if spark_type is None else spark.format(c=s)
    return Canon(sql.SQL(pg).format(c=c), lake, kind)


def _kind(pg_type: str, spark_type: str | None) -> str | None:
    st = spark_type
    if pg_type.endswith("[]"):
        if pg_type[:-2] in _SIMPLE_ARRAY_ELEMENTS and (st is None or st.startswith("array<")):
            return "array"
        if pg_type[:-2] in _JSON_TEXT_ELEMENTS and st == "string":  # --bad-values text: the array's JSON
            return "array_text"
        return None
    if st == "string" or (st is None and pg_type not in _INTEGERS | _FLOATS | _TIMESTAMPS):
        return "numeric_text" if pg_type == "numeric" else "text"
    if pg_type in _INTEGERS and (st is None or st in _SPARK_INTS):
        return "integer"
    if pg_type in _FLOATS and (st is None or st in ("float", "double")):
        return "float"
    if pg_type == "numeric" and (st is None or st.startswith("decimal(")):
        return "numeric"
    if pg_type == "boolean" and st in (None, "boolean"):
        return "boolean"
    if pg_type == "bytea" and st in (None, "binary"):
        return "bytea"
    if pg_type == "date" and st in (None, "date"):
        return "date"
    if pg_type in _TIMESTAMPS and (st is None or st in ("timestamp", "timestamp_ntz")):
        return "timestamp"
    return None


def _poison(kind: str, spark_type: str) -> str | None:
    """The PostgreSQL condition under which spark-apply cannot store a value of this kind in
    ``spark_type`` (its poison: pgrecv/spark/replay/convert.py), which ``--bad-values null`` stores as
    NULL: a numeric that is NaN or ±Infinity, has more decimals than the scale or too many digits;
    a date or timestamp outside years 1 to 9999 (BC, or past 9999: the text has no 4-digit year;
    a date's ±infinity too, a timestamp's is stored); an array of more than one dimension.
    Dates and timestamps are judged in this session's time zone, as the walsender printed them."""
    if kind == "numeric":
        precision, scale = (int(x) for x in spark_type[len("decimal(") : -1].split(","))
        return (
            "{c} IN ('NaN', 'Infinity', '-Infinity') OR "
            f"scale(trim_scale({{c}})) > {scale} OR abs({{c}}) >= 1e{precision - scale}"
        )
    if kind == "date":
        return "NOT isfinite({c}) OR NOT extract(year FROM {c}) BETWEEN 1 AND 9999"
    if kind == "timestamp":
        return "isfinite({c}) AND NOT extract(year FROM {c}) BETWEEN 1 AND 9999"
    if kind == "array":
        return "array_ndims({c}) > 1"
    return None


def _binary(pg: bool) -> str:
    """A float as its exact binary value, ``[-]Mp E`` (M an integer: x = M * 2^E), computed alike on
    both sides by scaling with powers of two, which is exact; no decimal text of either side's
    printing (PostgreSQL's and Java 17's shortest forms differ for some values) is involved.
    Normal numbers have 2^52 <= M < 2^53; subnormal ones E = -1074."""
    dbl, txt = ("float8", "TEXT") if pg else ("DOUBLE", "STRING")
    a = f"abs(CAST({{c}} AS {dbl}))"
    two = f"CAST(2 AS {dbl})"
    # off by one at worst (corrected by the ratio), and within a double's exponents: 2^1024 overflows
    e0 = f"least(greatest(floor(ln({a}) / ln({two})), -1074), 1023)"
    r = f"({a} / power({two}, {e0}))"
    e = f"({e0} + CASE WHEN {r} < 1 THEN -1 WHEN {r} >= 2 THEN 1 ELSE 0 END)"
    mantissa = f"CAST(CAST({a} / power({two}, {e} - 52) AS BIGINT) AS {txt})"
    normal = f"concat({mantissa}, 'p', CAST(CAST({e} - 52 AS BIGINT) AS {txt}))"
    sub = f"concat(CAST(CAST({a} * power({two}, 537) * power({two}, 537) AS BIGINT) AS {txt}), 'p-1074')"
    smallest_normal = f"CAST('2.2250738585072014e-308' AS {dbl})"
    sign = "CASE WHEN {c} < 0 THEN '-' ELSE '' END"
    return f"concat({sign}, CASE WHEN {a} < {smallest_normal} THEN {sub} ELSE {normal} END)"


_FLOAT_SPARK = (
    "CASE WHEN isnan({c}) THEN 'NaN' WHEN {c} = double('inf') THEN 'Infinity' WHEN {c} = double('-inf') "
    "THEN '-Infinity' WHEN {c} = 0 THEN '0' ELSE " + _binary(pg=False) + " END"
)
_FLOAT_PG = (
    "CASE WHEN {c} = 'NaN' THEN 'NaN' WHEN {c} = 'Infinity' THEN 'Infinity' WHEN {c} = '-Infinity' "
    "THEN '-Infinity' WHEN {c} = 0 THEN '0' ELSE " + _binary(pg=True) + " END"
)

# a decimal's digits without trailing zeros after the point (PostgreSQL: trim_scale)
_TRIM_SPARK = "CASE WHEN instr({c}, '.') > 0 THEN regexp_replace({c}, '\\\\.?0+$', '') ELSE {c} END"
_TS_PG = (
    f"CASE WHEN {{c}} = 'infinity' THEN '{TS_MAX_MICROS}' WHEN {{c}} = '-infinity' THEN '{TS_MIN_MICROS}' "
    "ELSE (extract(epoch FROM {c}) * 1000000)::bigint::text END"
)

# kind: (PostgreSQL form, Spark form); {c} is the column
_FORMS: dict[str, tuple[str, str]] = {
    "integer": ("{c}::text", "CAST({c} AS STRING)"),
    "float": (_FLOAT_PG, _FLOAT_SPARK),
    "numeric": ("trim_scale({c})::text", "CAST({c} AS STRING)"),
    "numeric_text": ("trim_scale({c})::text", _TRIM_SPARK),
    "boolean": ("CASE WHEN {c} THEN 't' ELSE 'f' END", "CASE WHEN {c} THEN 't' ELSE 'f' END"),
    "bytea": ("encode({c}, 'hex')", "lower(hex({c}))"),
    "date": (
        "CASE WHEN isfinite({c}) THEN ({c} - DATE '1970-01-01')::text ELSE {c}::text END",
        "CAST(datediff({c}, DATE'1970-01-01') AS STRING)",
    ),
    "timestamp": (_TS_PG, "CAST(unix_micros(CAST({c} AS TIMESTAMP)) AS STRING)"),
    "array": ("array_to_json({c})::text", "to_json({c})"),
    "array_text": ("array_to_json({c})::text", "{c}"),
    # the type's output function, as pgoutput sends it (concat keeps char(n)'s padding, ::text not)
    "text": ("CASE WHEN {c} IS NOT NULL THEN concat({c}) END", "{c}"),
}


# A row's text: its values joined by \x1f, NULL as \x1e. Every form but "text" is made of
# digits, letters and JSON (which escapes control characters), so never holds either; a value of
# the "text" form may hold anything, so it goes as LENGTH:TEXT.


def row_text_pg(values: list[Canon]) -> sql.Composable:
    """The row text of canonical values in PostgreSQL (``||``: concat takes at most 100 arguments)."""
    parts = [
        sql.SQL("CASE WHEN {v} IS NULL THEN chr(30) ELSE length({v})::text || ':' || {v} END").format(v=v.pg)
        if v.kind == "text"
        else sql.SQL("coalesce({v}, chr(30))").format(v=v.pg)
        for v in values
    ]
    return sql.SQL(" || chr(31) || ").join(parts) if parts else sql.SQL("''")


def row_text_spark(values: list[Canon]) -> str:
    """The row text of canonical values in Spark SQL."""
    parts = [
        f"CASE WHEN ({v.spark}) IS NULL THEN char(30) ELSE concat(length({v.spark}), ':', {v.spark}) END"
        if v.kind == "text"
        else f"coalesce({v.spark}, char(30))"
        for v in values
    ]
    return f"concat_ws(char(31), {', '.join(parts)})" if parts else "''"


def hash_pg(text: sql.Composable) -> sql.Composable:
    """The first 60 bits of the text's MD5 as a bigint."""
    return sql.SQL("('x' || substr(md5({t}), 1, 15))::bit(60)::bigint").format(t=text)


def hash_spark(text: str) -> str:
    return f"CAST(conv(substr(md5({text}), 1, 15), 16, 10) AS BIGINT)"
