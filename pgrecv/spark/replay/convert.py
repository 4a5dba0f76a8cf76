"""JSONL values → typed Spark columns, as Spark SQL expressions (they run in the executors).

Each column of a row image arrives as its JSON text (strings unquoted) and becomes the Spark type
of docs/spark-apply.md's mapping (:mod:`pgrecv.spark.types`). Every conversion also says whether
the value could be stored exactly: a value the type cannot hold (numeric ``NaN``, a date past
9999, a multi-dimensional array, ``1.5`` for an integer) is *poison*; the run's value policy
(``--bad-values``) decides what happens to it, never a silent rounding.

json/jsonb columns keep the exact JSON text the server sent. Spark's SQL JSON functions cannot
give it (``from_json``/``get_json_object`` turn ``3.14159265358979323846264`` into a double and
``1e400`` into ``"Infinity"``), so those columns are cut out of the record's raw text by Python's
JSON scanner in an Arrow-batched UDF: the one rule here that Spark SQL cannot express.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgrecv.spark.read.envelope import JSON_LIMITS
from pgrecv.spark.schema import ColumnType, spark_ddl

if TYPE_CHECKING:
    from pyspark.sql import Column


_INT_TYPES = {
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "oid": "bigint",
    "xid": "bigint",
    "cid": "bigint",
}
_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_TIME = r"[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
_TS = rf"^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}} {_TIME}$"
_TSTZ = rf"^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}} {_TIME}[+-][0-9]{{2}}(:[0-9]{{2}}(:[0-9]{{2}})?)?$"
# Spark's PostgreSQL dialect reads 'infinity'/'-infinity' timestamps as the largest/smallest it holds.
TS_MAX = "9999-12-31 23:59:59.999999"
TS_MIN = "0001-01-01 00:00:00"


def scalar(raw: Column, ct: ColumnType) -> tuple[Column, Column]:
    """(typed value, ok) for a column whose raw JSON text is ``raw`` (NULL stays NULL, ok)."""
    from pyspark.sql import functions as F

    pg = ct.pg_type
    if pa.types.is_string(ct.arrow):  # text types, and any column kept as text (--bad-values text)
        return raw, F.lit(True)
    ddl = spark_ddl(ct.arrow)
    if pa.types.is_list(ct.arrow):
        return _array(raw, ct)
    if pg in _INT_TYPES or pg in ("real", "double precision"):
        v = _try_cast(raw, ddl)
    elif pg == "xid8":
        v = F.when(raw.rlike(r"^[0-9]+$"), _try_cast(raw, ddl))
    elif pa.types.is_decimal(ct.arrow):
        scale = ct.arrow.scale
        digits = F.length(F.regexp_extract(raw, r"\.([0-9]*[1-9])0*$", 1))
        v = F.when(raw.rlike(r"^-?[0-9]+(\.[0-9]+)?$") & (digits <= scale), _try_cast(raw, ddl))
    elif pg == "boolean":
        v = F.when(raw == "true", F.lit(True)).when(raw == "false", F.lit(False))
    elif pg == "bytea":
        v = F.try_to_binary(raw, F.lit("base64"))
    elif pg == "date":
        v = F.when(raw.rlike(_DATE), _try_cast(raw, "date"))
    elif pg == "timestamp without time zone":
        v = (
            F.when(raw == "infinity", F.lit(TS_MAX).cast("timestamp_ntz"))
            .when(raw == "-infinity", F.lit(TS_MIN).cast("timestamp_ntz"))
            .when(raw.rlike(_TS), _try_cast(raw, "timestamp_ntz"))
        )
    elif pg == "timestamp with time zone":
        v = (
            F.when(raw == "infinity", F.to_utc_timestamp(F.lit(TS_MAX), "UTC"))
            .when(raw == "-infinity", F.to_utc_timestamp(F.lit(TS_MIN), "UTC"))
            .when(raw.rlike(_TSTZ), _try_cast(raw, "timestamp"))
        )
    else:  # text, varchar, uuid, interval, json (cut out exactly beforehand), numeric > 38 digits, …
        return raw, F.lit(True)
    return v, raw.isNull() | v.isNotNull()


def _try_cast(col: Column, ddl: str) -> Column:
    return col.try_cast(ddl)


def _array(raw: Column, ct: ColumnType) -> tuple[Column, Column]:
    """One-dimensional arrays: each element converted like a scalar of the element type."""
    from pyspark.sql import functions as F

    from pgrecv.spark.schema import column_type

    element = column_type(ct.pg_type[:-2], -1)
    if element.is_json or pa.types.is_list(element.arrow):
        element = ColumnType(element.pg_type, pa.string())
    elements = F.from_json(raw, "array<string>", JSON_LIMITS)
    typed = F.transform(elements, lambda x: scalar(x, element)[0])
    ok_each = F.forall(elements, lambda x: x.isNull() | (~x.startswith("[") & scalar(x, element)[1]))
    ok = raw.isNull() | (elements.isNotNull() & ok_each)
    return F.when(ok, typed), ok


# --- json/jsonb: exact member text ----------------------------------------------------------------

_scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]
_WS = " \t\n\r"
_STRUCTURE = re.compile(r'["\[\]{}]')  # what a value's end depends on, inside an array or object
_SCALAR_END = re.compile(r"[,}\]\s]|$")


def member_text(text: str | None, name: str) -> str | None:
    """The exact JSON text of member ``name`` of the object ``text`` (None when absent or null,
    and when ``text`` is not an object: the replay holds such an image's table back, named, and
    a task must not fail on it first)."""
    if text is None or not text.lstrip(_WS).startswith("{"):
        return None
    try:
        return _member(text, name)
    except (ValueError, IndexError):  # not JSON after all
        return None


def _member(text: str, name: str) -> str | None:
    n = len(text)
    i = text.find("{") + 1
    while i < n:
        while i < n and text[i] in _WS:
            i += 1
        if i >= n or text[i] == "}":
            return None
        if text[i] == ",":
            i += 1
            continue
        key, i = _scanstring(text, i + 1)
        while text[i] in _WS or text[i] == ":":
            i += 1
        end = _value_end(text, i)
        if key == name:
            out = text[i:end]
            return None if out == "null" else out
        i = end
    return None


def _value_end(text: str, i: int) -> int:
    """Where the JSON value at ``i`` ends. Without recursion (jsonb nests thousands deep, past
    Python's recursion limit) and without checking it: the JSON reader parsed the image already."""
    if text[i] == '"':
        return int(_scanstring(text, i + 1)[1])
    if text[i] not in "[{":
        match = _SCALAR_END.search(text, i + 1)
        assert match is not None  # the pattern matches at the end of the text
        return match.start()
    depth = 0
    while True:
        match = _STRUCTURE.search(text, i)
        if match is None:
            raise ValueError("unterminated JSON value")
        i = match.start()
        c = text[i]
        if c == '"':
            i = _scanstring(text, i + 1)[1]
            continue
        depth += 1 if c in "[{" else -1
        i += 1
        if depth == 0:
            return i


def json_member(raw_image: Column, name: str) -> Column:
    """A Spark column: the exact text of json column ``name`` of the raw image (Arrow-batched)."""
    from pyspark.sql.pandas import functions as pf

    arrow_udf: Any = pf.arrow_udf  # its overloads do not know the plain Array -> Array form

    def cut(images: pa.Array) -> pa.Array:
        return pa.array([member_text(t, name) for t in images.to_pylist()], type=pa.string())

    member: Column = arrow_udf(cut, "string")(raw_image)
    return member
