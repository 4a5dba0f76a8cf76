"""PostgreSQL column types → Arrow/Spark types, and JSONL values → typed Python values.

The mapping follows Spark's PostgreSQL JDBC dialect (see docs/spark-apply.md for the table): it is
decided from the relation records alone, never inferred from values. Conversions are exact:
``numeric`` arrives as a string and becomes a ``Decimal``; a value that does not fit its column
type is an :class:`~pgrecv.errors.InputError`, never silently rounded or nulled.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Context, Decimal, InvalidOperation
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pgrecv.errors import InputError

UNCONSTRAINED_NUMERIC = (38, 18)  # Spark's DecimalType.SYSTEM_DEFAULT, as its JDBC dialect uses

Converter = Callable[[Any], Any]


@dataclass(frozen=True)
class ColumnType:
    """How one PostgreSQL column is stored: the Arrow type, and the JSON value → Python value step."""

    pg_type: str
    arrow: pa.DataType
    convert: Converter | None  # None: the JSON value is already right (ints, bools, strings)
    is_json: bool = False
    vector: str | None = None  # "decimal": a whole column of strings is cast by Arrow (see fast_column)


def _float(value: Any) -> float:
    return float(value)  # "NaN", "Infinity", "-Infinity" arrive as strings; float() takes them


def _bytea(value: Any) -> bytes:
    return base64.b64decode(value, validate=True)


def _date(value: Any) -> date:
    return date.fromisoformat(value)


def _timestamp(value: Any) -> datetime:
    return datetime.fromisoformat(value)


def _timestamptz(value: Any) -> datetime:
    stamp = datetime.fromisoformat(value)
    if stamp.tzinfo is None:
        raise ValueError("no time zone offset")
    return stamp.astimezone(UTC)


def _json_text(value: Any) -> str:
    return orjson.dumps(value).decode()


_WIDE = Context(prec=200)  # quantize within Decimal's default 28 digits refused numeric(38,s) values


def _numeric(scale: int) -> Converter:
    quantum = Decimal(1).scaleb(-scale)

    def convert(value: Any) -> Decimal:
        number = Decimal(value)
        if not number.is_finite():
            raise ValueError("NaN and infinities have no decimal form")
        exact = number.quantize(quantum, context=_WIDE)
        if exact != number:
            raise ValueError(f"more than {scale} digits after the point")
        return exact

    return convert


_SCALARS: dict[str, tuple[pa.DataType, Converter | None]] = {
    "smallint": (pa.int16(), None),
    "integer": (pa.int32(), None),
    "bigint": (pa.int64(), None),
    "oid": (pa.int64(), None),
    "xid": (pa.int64(), None),
    "cid": (pa.int64(), None),
    "xid8": (pa.decimal128(20, 0), Decimal),
    "real": (pa.float32(), _float),
    "double precision": (pa.float64(), _float),
    "boolean": (pa.bool_(), None),
    "bytea": (pa.binary(), _bytea),
    "date": (pa.date32(), _date),
    "timestamp without time zone": (pa.timestamp("us"), _timestamp),
    "timestamp with time zone": (pa.timestamp("us", tz="UTC"), _timestamptz),
}
_JSON_TYPES = {"json", "jsonb"}


def numeric_precision(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of ``numeric(p,s)`` from its typmod; None when unconstrained."""
    if typmod < 4:
        return None
    raw = typmod - 4
    precision = (raw >> 16) & 0xFFFF
    scale = raw & 0x7FF
    if scale & 0x400:  # PostgreSQL 15+: negative scales are stored as 11-bit two's complement
        scale -= 0x800
    return precision, scale


def _list_of(element: Converter | None) -> Converter:
    def convert(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise ValueError("not an array")
        out = []
        for item in value:
            if isinstance(item, list):
                raise ValueError("multi-dimensional arrays are not supported")
            out.append(item if item is None or element is None else element(item))
        return out

    return convert


def column_type(pg_type: str | None, typmod: int) -> ColumnType:
    """The storage type of a column, from the relation record's ``type`` and ``typmod``."""
    name = pg_type or "unknown"
    if name.endswith("[]"):
        element = column_type(name[:-2], typmod)
        if element.is_json or pa.types.is_list(element.arrow):
            return ColumnType(name, pa.list_(pa.string()), _list_of(element.convert))
        return ColumnType(name, pa.list_(element.arrow), _list_of(element.convert))
    if name == "numeric":
        ps = numeric_precision(typmod)
        precision, scale = ps if ps is not None else UNCONSTRAINED_NUMERIC
        if scale < 0:  # numeric(3,-2) holds integers up to 99900
            precision, scale = precision - scale, 0
        if precision > 38:
            return ColumnType(name, pa.string(), None)  # wider than Spark's decimal: keep the exact text
        return ColumnType(name, pa.decimal128(precision, scale), _numeric(scale), vector="decimal")
    if name in _JSON_TYPES:
        return ColumnType(name, pa.string(), _json_text, is_json=True)
    scalar = _SCALARS.get(name)
    if scalar is not None:
        return ColumnType(name, scalar[0], scalar[1])
    return ColumnType(name, pa.string(), None)  # text, varchar, uuid, interval, money, enums, …


def convert_value(ctype: ColumnType, value: Any, column: str, where: str) -> Any:
    """One JSON value → the Python value Arrow stores; a clear error when it cannot be exact."""
    if value is None:
        return None
    if ctype.convert is None and pa.types.is_string(ctype.arrow):
        # e.g. a user type decoded as base64 stays a string
        return value if isinstance(value, str) else _json_text(value)
    try:
        if ctype.convert is None:
            # ints and bools pass as they are, but only if Arrow can store them: checked here so
            # that a wrong value is reported with its file:line, not later for the whole column
            if isinstance(value, bool) != pa.types.is_boolean(ctype.arrow):
                raise TypeError(f"expected {'a boolean' if pa.types.is_boolean(ctype.arrow) else 'a number'}")
            pa.scalar(value, type=ctype.arrow)
            return value
        return ctype.convert(value)
    except (
        ValueError,
        TypeError,
        InvalidOperation,
        binascii.Error,
        OverflowError,
        pa.ArrowInvalid,
        pa.ArrowTypeError,
    ) as exc:
        raise InputError(
            f"{where}: value {value!r} of column {column} ({ctype.pg_type}) cannot be stored as "
            f"{ctype.arrow}: {exc}; see docs/spark-apply.md (type mapping)"
        ) from None


def _decimals(strings: pa.Array, arrow: pa.Decimal128Type) -> pa.Array | None:
    """PostgreSQL's numeric text → decimal(p,s), exact, or None (then the per-value path).

    Arrow's string → decimal cast wraps around silently when scaling the parsed value up
    overflows 128 bits ("391961049985222" → decimal(29,29) gave 0.612…): so only the plain form
    with at most max(p-s, 1) integer digits goes through, scaled in 256 bits (≤ 39 digits: no
    overflow), then narrowed to decimal(p,s), which checks the precision. Arrow refuses digits
    beyond the scale ("would cause data loss") instead of rounding.
    """
    pattern = rf"^-?[0-9]{{1,{max(arrow.precision - arrow.scale, 1)}}}(\.[0-9]+)?$"
    if not pc.all(pc.match_substring_regex(strings, pattern)).as_py():
        return None
    return strings.cast(pa.decimal256(76, arrow.scale)).cast(arrow)


def fast_column(ctype: ColumnType, values: list[Any]) -> pa.Array | None:
    """A whole column of JSON values → Arrow in C, or None: then :func:`convert_value` per value
    (which gives the same values, or the clear error for the value that cannot be stored).

    Only where Arrow is exact and agrees with the per-value path: values already right
    (``convert`` None: ints, bools, strings; a non-string in a string column needs JSON text),
    and decimals from their strings — Arrow's string → decimal cast refuses NaN, infinities,
    digits beyond the scale and values beyond the precision, instead of rounding.
    """
    try:
        if ctype.convert is None:
            return pa.array(values, type=ctype.arrow)
        if ctype.vector == "decimal":
            return _decimals(pa.array(values, type=pa.string()), ctype.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return None
    return None


def spark_ddl(arrow: pa.DataType) -> str:
    """The Spark SQL type for an Arrow type we produce (Spark's JDBC-dialect types)."""
    if pa.types.is_int16(arrow):
        return "smallint"
    if pa.types.is_int32(arrow):
        return "int"
    if pa.types.is_int64(arrow):
        return "bigint"
    if pa.types.is_float32(arrow):
        return "float"
    if pa.types.is_float64(arrow):
        return "double"
    if pa.types.is_boolean(arrow):
        return "boolean"
    if pa.types.is_binary(arrow):
        return "binary"
    if pa.types.is_date32(arrow):
        return "date"
    if pa.types.is_timestamp(arrow):
        return "timestamp" if arrow.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(arrow):
        return f"decimal({arrow.precision},{arrow.scale})"
    if pa.types.is_list(arrow):
        return f"array<{spark_ddl(arrow.value_type)}>"
    return "string"


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Type equality that ignores what storage layers change on the way (ns/us, tz spelling)."""
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        return (a.tz is None) == (b.tz is None)
    if pa.types.is_list(a) and pa.types.is_list(b):
        return same_type(a.value_type, b.value_type)
    if (pa.types.is_string(a) or pa.types.is_large_string(a)) and (
        pa.types.is_string(b) or pa.types.is_large_string(b)
    ):
        return True
    if (pa.types.is_binary(a) or pa.types.is_large_binary(a)) and (
        pa.types.is_binary(b) or pa.types.is_large_binary(b)
    ):
        return True
    return bool(a.equals(b))
