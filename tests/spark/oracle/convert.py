"""The oracle's values: a JSON value → the Python value Arrow stores, one by one (or a whole column
where Arrow is exact), with a clear error when it cannot be exact. The product converts in Spark
SQL (:mod:`pgrecv.spark.replay.convert`); these are written apart on purpose."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Context, Decimal, InvalidOperation
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pgrecv.errors import InputError
from pgrecv.spark.schema import ColumnType

Converter = Callable[[Any], Any]


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


_SCALARS: dict[str, Converter] = {
    "xid8": Decimal,
    "real": _float,
    "double precision": _float,
    "bytea": _bytea,
    "date": _date,
    "timestamp without time zone": _timestamp,
    "timestamp with time zone": _timestamptz,
}


def converter(ct: ColumnType) -> Converter | None:
    """The step from a JSON value to the Python value of ``ct``'s Arrow type (None: the JSON value
    is already right: ints, bools, strings)."""
    if ct.pg_type.endswith("[]") and pa.types.is_list(ct.arrow):
        name = ct.pg_type[:-2]
        element = ColumnType(name, ct.arrow.value_type, name in ("json", "jsonb"))
        return _list_of(converter(element))
    if ct.is_json:
        return _json_text
    if ct.pg_type == "numeric" and pa.types.is_decimal(ct.arrow):
        return _numeric(ct.arrow.scale)
    if pa.types.is_string(ct.arrow) or pa.types.is_list(ct.arrow):
        return None
    return _SCALARS.get(ct.pg_type)


def convert_value(ctype: ColumnType, value: Any, column: str, where: str) -> Any:
    """One JSON value → the Python value Arrow stores; a clear error when it cannot be exact."""
    if value is None:
        return None
    convert = converter(ctype)
    if convert is None and pa.types.is_string(ctype.arrow):
        # e.g. a user type decoded as base64 stays a string
        return value if isinstance(value, str) else _json_text(value)
    try:
        if convert is None:
            # ints and bools pass as they are, but only if Arrow can store them: checked here so
            # that a wrong value is reported with its file:line, not later for the whole column
            if isinstance(value, bool) != pa.types.is_boolean(ctype.arrow):
                raise TypeError(f"expected {'a boolean' if pa.types.is_boolean(ctype.arrow) else 'a number'}")
            pa.scalar(value, type=ctype.arrow)
            return value
        return convert(value)
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
    convert = converter(ctype)
    try:
        if convert is None:
            return pa.array(values, type=ctype.arrow)
        if ctype.pg_type == "numeric" and pa.types.is_decimal(ctype.arrow):
            return _decimals(pa.array(values, type=pa.string()), ctype.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return None
    return None
