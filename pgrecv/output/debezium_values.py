"""Column values as Debezium's PostgreSQL connector writes them (its JsonConverter output), and the
Kafka Connect field schema of each column.

Debezium's defaults, except where a default loses information:

* ``time.precision.mode=adaptive``: ``date`` → days since 1970-01-01 (int32, ``io.debezium.time.Date``);
  ``time(0-3)`` → ms since midnight (int32, ``Time``), ``time``/``time(4-6)`` → µs (int64, ``MicroTime``);
  ``timestamp(0-3)`` → ms since the epoch (int64, ``Timestamp``), ``timestamp``/``timestamp(4-6)`` → µs
  (int64, ``MicroTimestamp``); ``timestamptz`` → ISO 8601 in UTC with a ``Z`` (``ZonedTimestamp``);
  ``timetz`` → ``HH:MM:SS[.ffffff]Z`` in UTC (``ZonedTime``). ``±infinity`` timestamps become
  9223372036825200000 / -9223372036832400000 (what Debezium documents, after PgJDBC), dates
  2147483647 / -2147483648, ``timestamptz`` the strings ``infinity`` / ``-infinity``.
* ``decimal.handling.mode=string`` (not Debezium's default ``precise``): ``numeric`` and ``money``
  as their exact decimal text, ``NaN``/``±Infinity`` included; lossless, and readable by any JSON
  consumer (Flink reads it into ``DECIMAL(p,s)`` or ``STRING``).
* ``interval.handling.mode=string`` (not the default ``numeric``, whose µs count takes a month as
  30.4375 days): ``P<y>Y<m>M<d>DT<h>H<mi>M<s>S`` (``io.debezium.time.Interval``).
* ``binary.handling.mode=bytes``: ``bytea`` as base64 (JsonConverter's encoding of bytes).
* ``json``/``jsonb`` (and ``xml``, ``uuid``) as strings holding the server's text
  (``io.debezium.data.Json``/``Xml``/``Uuid``); ``bit(1)`` as a boolean, other ``bit``/``varbit``
  as little-endian bytes (``io.debezium.data.Bits``); ``point`` as ``{x, y, wkb, srid}``
  (``io.debezium.data.geometry.Point``); arrays as JSON arrays of their elements' encodings.
* Every other type (enums, ranges, network, geometric, composite, ...) as the server's text.

Text values are expected in PostgreSQL's default output styles (``DateStyle`` ISO, ``IntervalStyle``
postgres), which is also what the binary decoders of :mod:`pgrecv.output.values` render.
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pgrecv import events as ev
from pgrecv.dates import days_from_civil
from pgrecv.output.values import (
    ValueFormatError,
    _ymd,
    binary_converter,
    parse_array,
    text_converter,
)
from pgrecv.pg.types import ARRAY_DELIMITER, ARRAY_ELEMENT, TYPE_NAMES, oid_for_name

UNAVAILABLE: Final = "__debezium_unavailable_value"
"""Debezium's ``unavailable.value.placeholder``: an unchanged TOASTed value the server did not send."""

_UNAVAILABLE_B64: Final = base64.b64encode(UNAVAILABLE.encode()).decode("ascii")
# PgJDBC's (and so Debezium's) stand-ins for timestamp 'infinity' / '-infinity'
TIMESTAMP_INFINITY: Final = 9223372036825200000
TIMESTAMP_MINUS_INFINITY: Final = -9223372036832400000
DATE_INFINITY: Final = 2**31 - 1
DATE_MINUS_INFINITY: Final = -(2**31)

_UNIX_TO_PG_DAYS: Final = 10_957  # 1970-01-01 to 2000-01-01
_DATE_RE: Final = re.compile(r"(\d{4,})-(\d\d)-(\d\d)")
_STAMP_RE: Final = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::(\d\d)(?::(\d\d))?)?)?( BC)?"
)
_TIME_RE: Final = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::(\d\d)(?::(\d\d))?)?)?")
_INTERVAL_PART: Final = re.compile(r"([+-]?\d+) (year|mon|day)s?|([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_PRECISION: Final = re.compile(r"\((\d+)\)")
_POINT: Final = struct.Struct("<BIdd")

Converter = Callable[[Any], object]


# --- calendar arithmetic (proleptic Gregorian, year 0 = 1 BC; datetime stops at year 1) ------


def _micros(frac: str | None) -> int:
    return int(frac.ljust(6, "0")) if frac else 0


def _zone_seconds(sign: str | None, hh: str | None, mm: str | None, ss: str | None) -> int:
    """Seconds east of UTC."""
    if not sign:
        return 0
    secs = int(hh or 0) * 3600 + int(mm or 0) * 60 + int(ss or 0)
    return secs if sign == "+" else -secs


def _bad(what: str, text: object) -> ValueFormatError:
    return ValueFormatError(f"not a {what} in ISO DateStyle: {text!r}")


def epoch_days(text: str) -> int:
    """``date`` text → days since 1970-01-01."""
    if text == "infinity":
        return DATE_INFINITY
    if text == "-infinity":
        return DATE_MINUS_INFINITY
    bc = text.endswith(" BC")
    m = _DATE_RE.fullmatch(text[:-3] if bc else text)
    if m is None:
        raise _bad("date", text)
    y = int(m.group(1))
    return days_from_civil(1 - y if bc else y, int(m.group(2)), int(m.group(3)))


def epoch_micros(text: str) -> int:
    """``timestamp``/``timestamptz`` text → µs since 1970-01-01 00:00 UTC."""
    m = _STAMP_RE.fullmatch(text)
    if m is None:
        raise _bad("timestamp", text)
    y, mo, d, hh, mi, ss, frac, sign, zh, zm, zs, bc = m.groups()
    year = 1 - int(y) if bc else int(y)
    secs = days_from_civil(year, int(mo), int(d)) * 86_400 + int(hh) * 3600 + int(mi) * 60 + int(ss)
    return (secs - _zone_seconds(sign, zh, zm, zs)) * 1_000_000 + _micros(frac)


def _timestamp(millis: bool) -> Converter:
    def convert(text: str) -> int:
        if text == "infinity":
            return TIMESTAMP_INFINITY
        if text == "-infinity":
            return TIMESTAMP_MINUS_INFINITY
        us = epoch_micros(text)
        return us // 1000 if millis else us

    return convert


def _civil(days: int) -> tuple[int, int, int]:
    """(year, month, day) from days since 1970-01-01."""
    return _ymd(days - _UNIX_TO_PG_DAYS)


def _fraction(us: int) -> str:
    """Java's ISO formatting of a fraction: none, or 3, 6 digits (trailing zero groups dropped)."""
    if not us:
        return ""
    if us % 1000 == 0:
        return f".{us // 1000:03d}"
    return f".{us:06d}"


def zoned_timestamp(text: str) -> str:
    """``timestamptz`` text → ISO 8601 in UTC, e.g. ``2026-01-01T21:34:05.123Z`` (ZonedTimestamp)."""
    if text in ("infinity", "-infinity"):
        return text
    if text.endswith("+00") and len(text) >= 22 and text[4] == "-" and text[10] == " ":
        # the common case (a server in UTC, years 1000-9999): rearranged, no arithmetic
        digits = text[20:-3]
        dot = "." + digits.ljust(3 if len(digits) <= 3 else 6, "0") if digits else ""
        return f"{text[:10]}T{text[11:19]}{dot}Z"
    us = epoch_micros(text)
    days, rest = divmod(us, 86_400_000_000)
    secs, frac = divmod(rest, 1_000_000)
    y, m, d = _civil(days)
    year = f"{y:04d}" if 0 <= y <= 9999 else f"{y:+05d}"
    hms = f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    return f"{year}-{m:02d}-{d:02d}T{hms}{_fraction(frac)}Z"


def _time_micros(text: str) -> tuple[int, int]:
    m = _TIME_RE.fullmatch(text)
    if m is None:
        raise _bad("time", text)
    hh, mi, ss, frac, sign, zh, zm, zs = m.groups()
    us = ((int(hh) * 60 + int(mi)) * 60 + int(ss)) * 1_000_000 + _micros(frac)
    return us, _zone_seconds(sign, zh, zm, zs)


def _time(millis: bool) -> Converter:
    def convert(text: str) -> int:
        us, _ = _time_micros(text)
        return us // 1000 if millis else us

    return convert


def zoned_time(text: str) -> str:
    """``timetz`` text → the time in UTC, ``HH:MM:SS[.fff[fff]]Z`` (ZonedTime)."""
    us, east = _time_micros(text)
    us = (us - east * 1_000_000) % 86_400_000_000
    secs, frac = divmod(us, 1_000_000)
    return f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}{_fraction(frac)}Z"


def iso_interval(text: str) -> str:
    """``interval`` text (IntervalStyle postgres) → ``P<y>Y<m>M<d>DT<h>H<mi>M<s>S`` (Debezium's Interval)."""
    years = months = days = 0
    hours = minutes = 0
    micros = 0
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _INTERVAL_PART.match(text, pos)
        if m is None:
            raise ValueFormatError(f"not an interval in IntervalStyle postgres: {text!r}")
        if m.group(1) is not None:
            n = int(m.group(1))
            unit = m.group(2)
            if unit == "year":
                years += n
            elif unit == "mon":
                months += n
            else:
                days += n
        else:
            sign = -1 if m.group(3) == "-" else 1
            hours += sign * int(m.group(4))
            minutes += sign * int(m.group(5))
            micros += sign * (int(m.group(6)) * 1_000_000 + _micros(m.group(7)))
        pos = m.end()
        while pos < len(text) and text[pos] == " ":
            pos += 1
    whole, frac = divmod(abs(micros), 1_000_000)
    seconds = ("-" if micros < 0 else "") + str(whole) + (f".{frac:06d}".rstrip("0") if frac else "")
    return f"P{years}Y{months}M{days}DT{hours}H{minutes}M{seconds}S"


def _money(text: str) -> str:
    """``money`` text (``$1,234.56``, ``-$0.01``) → ``1234.56``."""
    neg = text.startswith("-") or text.startswith("(")
    digits = "".join(ch for ch in text if ch.isdigit() or ch == ".")
    if not digits:
        raise ValueFormatError(f"not a money value: {text!r}")
    return "-" + digits if neg else digits


def _money_binary(data: bytes) -> str:
    cents = int.from_bytes(data, "big", signed=True)
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{whole}.{frac:02d}"


def _bits(text: str) -> str:
    """Bits as Debezium's ``Bits``: the value as a little-endian byte array of ceil(n/8) bytes, base64."""
    n = len(text)
    value = int(text, 2) if n else 0
    return base64.b64encode(value.to_bytes((n + 7) // 8, "little")).decode("ascii")


def _bit1(text: str) -> bool:
    return text == "1"


def _point(x: float, y: float) -> dict[str, object]:
    wkb = base64.b64encode(_POINT.pack(1, 1, x, y)).decode("ascii")
    return {"x": x, "y": y, "wkb": wkb, "srid": None}


def _point_text(text: str) -> dict[str, object]:
    x, _, y = text.strip("()").partition(",")
    return _point(float(x), float(y))


def _point_binary(data: bytes) -> dict[str, object]:
    x, y = struct.unpack(">dd", data)
    return _point(x, y)


def _json_binary(jsonb: bool) -> Converter:
    def convert(data: bytes) -> str:
        if jsonb:
            if data[:1] != b"\x01":
                raise ValueFormatError(f"unknown binary jsonb version {data[:1]!r}")
            data = data[1:]
        return data.decode()

    return convert


def _fragment_text(value: object) -> object:
    """A JSON document inside an array decoded by :mod:`pgrecv.output.values` (an orjson Fragment) as text."""
    return orjson.dumps(value).decode() if isinstance(value, orjson.Fragment) else value


# --- per column -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColumnCodec:
    """How one column's values are written: from text, from binary, for an unchanged TOAST value,
    and the column's Kafka Connect field schema (without ``field``/``optional``)."""

    text: Converter
    binary: Converter
    unavailable: object
    schema: dict[str, object]


def _typmod(col: ev.Column) -> int:
    """The precision/length typmod; -1 when unknown (test_decoding prints type names without it)."""
    if col.type_oid and col.type_modifier >= 0:
        return col.type_modifier
    m = _PRECISION.search(col.type_name or "")
    return int(m.group(1)) if m else -1


def _base_oid(col: ev.Column) -> int:
    if col.type_oid in TYPE_NAMES:
        return col.type_oid
    return oid_for_name(col.type_name) if col.type_name else 0


def _named(kind: str, name: str, **params: str) -> dict[str, object]:
    out: dict[str, object] = {"type": kind, "name": name, "version": 1}
    if params:
        out["parameters"] = params
    return out


_PLAIN_SCHEMA: Final[dict[int, dict[str, object]]] = {
    16: {"type": "boolean"},
    17: {"type": "bytes"},
    20: {"type": "int64"},
    21: {"type": "int16"},
    23: {"type": "int32"},
    26: {"type": "int64"},
    700: {"type": "float"},
    701: {"type": "double"},
    114: _named("string", "io.debezium.data.Json"),
    3802: _named("string", "io.debezium.data.Json"),
    142: _named("string", "io.debezium.data.Xml"),
    2950: _named("string", "io.debezium.data.Uuid"),
    1700: {"type": "string"},
    790: {"type": "string"},
    1184: _named("string", "io.debezium.time.ZonedTimestamp"),
    1266: _named("string", "io.debezium.time.ZonedTime"),
    1186: _named("string", "io.debezium.time.Interval"),
    1082: _named("int32", "io.debezium.time.Date"),
    600: {
        "type": "struct",
        "name": "io.debezium.data.geometry.Point",
        "version": 1,
        "fields": [
            {"type": "double", "optional": False, "field": "x"},
            {"type": "double", "optional": False, "field": "y"},
            {"type": "bytes", "optional": True, "field": "wkb"},
            {"type": "int32", "optional": True, "field": "srid"},
        ],
    },
}


def _scalar(oid: int, precision: int, bit_length: int) -> tuple[Converter | None, Converter | None, dict[str, object]]:
    """(post-conversion of pgrecv's JSONL value or None, binary override or None, field schema)."""
    if oid == 1082:
        return epoch_days, None, _PLAIN_SCHEMA[oid]
    if oid == 1114:
        millis = precision <= 3
        name = "io.debezium.time.Timestamp" if millis else "io.debezium.time.MicroTimestamp"
        return _timestamp(millis), None, _named("int64", name)
    if oid == 1184:
        return zoned_timestamp, None, _PLAIN_SCHEMA[oid]
    if oid == 1083:
        millis = precision <= 3
        if millis:
            return _time(True), None, _named("int32", "io.debezium.time.Time")
        return _time(False), None, _named("int64", "io.debezium.time.MicroTime")
    if oid == 1266:
        return zoned_time, None, _PLAIN_SCHEMA[oid]
    if oid == 1186:
        return iso_interval, None, _PLAIN_SCHEMA[oid]
    if oid == 790:
        return _money, _money_binary, _PLAIN_SCHEMA[oid]
    if oid == 1560 and bit_length == 1:
        return _bit1, None, {"type": "boolean"}
    if oid in (1560, 1562):
        length = str(bit_length if bit_length > 0 else 2**31 - 1)
        return _bits, None, _named("bytes", "io.debezium.data.Bits", length=length)
    if oid == 600:
        return _point_text, _point_binary, _PLAIN_SCHEMA[oid]
    if oid in (114, 3802):
        return None, _json_binary(oid == 3802), _PLAIN_SCHEMA[oid]
    return None, None, _PLAIN_SCHEMA.get(oid, {"type": "string"})


def _identity(value: object) -> object:
    return value


def _compose(first: Converter | None, then: Converter | None) -> Converter:
    if first is None:
        return then or _identity
    if then is None:
        return first
    return lambda v: then(first(v))


def _deep(conv: Converter) -> Converter:
    """``conv`` on every non-NULL leaf of nested lists."""

    def walk(value: object) -> object:
        if isinstance(value, list):
            return [walk(v) for v in value]
        return None if value is None else conv(value)

    return walk


def column_codec(col: ev.Column) -> ColumnCodec:
    """The codec of one column (worked out once per relation)."""
    oid = _base_oid(col)
    typmod = _typmod(col)
    precision = 6 if typmod < 0 else typmod  # unknown: µs, which loses nothing
    bit_length = typmod
    base_binary = binary_converter(col.type_oid)
    elem = ARRAY_ELEMENT.get(oid)
    if elem is not None or (oid == 0 and col.type_name.endswith("[]")):
        post: Converter | None = None
        item_schema: dict[str, object] = {"type": "string"}
        elem_text: Converter | None = None
        delim = ","
        if elem is not None:
            post, _, item_schema = _scalar(elem, precision, bit_length)
            # json elements: the documents' own text, not pgrecv's embedded JSON
            elem_text = None if elem in (114, 3802) else text_converter(elem, "")
            delim = ARRAY_DELIMITER.get(elem, ",")
        text_elem = _compose(elem_text, post)
        binary_walk = _deep(_compose(post, _fragment_text))

        def text_array(s: str) -> object:
            return parse_array(s, text_elem, delim)

        def binary_array(b: bytes) -> object:
            return binary_walk(base_binary(b))

        schema: dict[str, object] = {"type": "array", "items": {**item_schema, "optional": True}}
        return ColumnCodec(text_array, binary_array, [UNAVAILABLE], schema)
    post, binary_override, schema = _scalar(oid, precision, bit_length)
    base_text = None if oid in (114, 3802) else text_converter(col.type_oid, col.type_name)
    text = _compose(base_text, post)
    binary = binary_override or _compose(base_binary, post)
    unavailable: object = _UNAVAILABLE_B64 if schema.get("type") == "bytes" else UNAVAILABLE
    return ColumnCodec(text, binary, unavailable, schema)
