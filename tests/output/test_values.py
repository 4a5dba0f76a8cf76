"""Value converters without a server: the array literal parser, text rules, binary decoders and
their failure modes. tests/output/test_values_server.py checks both forms against real servers."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgrecv.dates import days_from_civil
from pgrecv.errors import DecodeError
from pgrecv.output import values
from pgrecv.output.values import (
    BYTEA_ENCODING,
    JSON_NULL,
    ValueFormatError,
    binary_converter,
    parse_array,
    text_converter,
)
from pgrecv.pg.types import ARRAY_ELEMENT, TYPE_NAMES

# --- array_out formatting, as the server does it (for round trips) ---------------------------

_NEEDS_QUOTES = set('"\\{} \t\n\r\v\f')


def _quote(s: str, delim: str) -> str:
    if s == "" or s.upper() == "NULL" or delim in s or not _NEEDS_QUOTES.isdisjoint(s):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return s


def _array_out(value: list[Any], delim: str = ",") -> str:
    parts = []
    for v in value:
        if isinstance(v, list):
            parts.append(_array_out(v, delim))
        else:
            parts.append("NULL" if v is None else _quote(v, delim))
    return "{" + delim.join(parts) + "}"


_tricky = st.sampled_from(["NULL", "null", "Null", "", " ", '"', "\\", "{}", "{", "}", ",", ";", "a b", '\\"', "é😀"])
_elements = st.one_of(st.none(), st.text(max_size=12), _tricky)
_nested = st.recursive(
    st.lists(_elements, min_size=1, max_size=6),
    lambda inner: st.lists(inner, min_size=1, max_size=4),
    max_leaves=40,
)


@given(st.one_of(st.just([]), _nested), st.sampled_from([",", ";"]), st.sampled_from(["", "[0:1]=", "[-3:2][1:1]="]))
def test_parse_array_round_trips_array_out(value: list[Any], delim: str, bounds: str) -> None:
    assert parse_array(bounds + _array_out(value, delim), None, delim) == value


@given(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=20))
def test_parse_array_converts_elements(ints: list[int | None]) -> None:
    text = "{" + ",".join("NULL" if i is None else str(i) for i in ints) + "}"
    assert parse_array(text, int) == ints
    assert text_converter(1016, "bigint[]")(text) == ints  # type: ignore[misc]


@given(st.text(alphabet='{}",\\ aNUL1[]:=;', max_size=30))
def test_parse_array_garbage_raises_value_format_error_only(text: str) -> None:
    try:
        result = parse_array(text)
    except ValueFormatError as exc:
        assert isinstance(exc, DecodeError) and isinstance(exc, ValueError)
    else:
        assert isinstance(result, list)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{}", []),
        ("{1,2,NULL}", ["1", "2", None]),
        (
            '{"a b","with \\"quote\\"","back\\\\slash",NULL,"NULL"}',
            ["a b", 'with "quote"', "back\\slash", None, "NULL"],
        ),
        ("{{1,2},{3,4}}", [["1", "2"], ["3", "4"]]),
        ("[0:1]={1,2}", ["1", "2"]),
        ("[0:1][5:6]={{1,2},{3,4}}", [["1", "2"], ["3", "4"]]),
        ('{"(1,a)","(2,\\"b\\")"}', ["(1,a)", '(2,"b")']),
        ("{nUlL,x}", [None, "x"]),
        ("{a\\,b}", ["a,b"]),  # array_in's escapes in unquoted elements
        ('{"",""}', ["", ""]),
        ('{{"}"},{"{"}}', [["}"], ["{"]]),
    ],
)
def test_parse_array_examples(text: str, expected: list[Any]) -> None:
    assert parse_array(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "1,2", "{1,2", "{1,2}x", '{"a}', "{a,,b}", "{,}", "{{1},}", "[1:2]{1,2}", "[1:2", '{"a"b}', "{{1}", "{a}}"],
)
def test_parse_array_malformed(text: str) -> None:
    with pytest.raises(ValueFormatError):
        parse_array(text)


def test_box_arrays_split_on_semicolons() -> None:
    conv = text_converter(1020, "box[]")
    assert conv is not None and conv("{(1,1),(0,0);(3,3),(2,2)}") == ["(1,1),(0,0)", "(3,3),(2,2)"]
    by_name = text_converter(0, "box[]")
    assert by_name is not None and by_name("{(1,1),(0,0);(3,3),(2,2)}") == ["(1,1),(0,0)", "(3,3),(2,2)"]


# --- text converters -------------------------------------------------------------------------


def _conv(oid: int, name: str = "") -> Any:
    conv = text_converter(oid, name)
    assert conv is not None
    return conv


def test_integers_and_booleans() -> None:
    for oid in (20, 21, 23, 26, 28, 29, 5069):
        assert _conv(oid)("-12" if oid in (20, 21, 23) else "12") in (-12, 12)
    b = _conv(16)
    assert (b("t"), b("f"), b("true"), b("false")) == (True, False, True, False)
    with pytest.raises(ValueFormatError, match="not a boolean"):
        b("yes")


def test_floats_keep_non_finite_values_as_text() -> None:
    for oid in (700, 701):
        f = _conv(oid)
        assert f("1.5") == 1.5 and f("-0").hex() == "-0x0.0p+0" and f("1e-300") == 1e-300
        assert [f(s) for s in ("NaN", "Infinity", "-Infinity")] == ["NaN", "Infinity", "-Infinity"]
        with pytest.raises(ValueError):
            f("abc")


def test_types_kept_as_text_have_no_converter() -> None:
    kept = [
        "numeric",
        "text",
        "character varying",
        "timestamp with time zone",
        "date",
        "interval",
        "uuid",
        "inet",
        "money",
        "int4range",
        "public.mood",
        "mood",
        '"My Type"',
        "tsvector",
    ]
    for name in kept:
        assert text_converter(0, name) is None, name
    for oid in (1700, 25, 1043, 1184, 1082, 1186, 2950, 869, 790, 3904, 16384):
        assert text_converter(oid, "") is None, oid


def test_names_from_test_decoding_find_the_builtin_converter() -> None:
    assert text_converter(0, "integer") is text_converter(23, "")
    assert text_converter(0, "numeric(10,2)[]") is text_converter(1231, "")
    assert text_converter(0, "character varying(5)[]") is text_converter(1015, "")
    assert _conv(0, "double precision[]")("{1.5,NaN,NULL}") == [1.5, "NaN", None]
    # an OID wins over the name
    assert text_converter(23, "text") is text_converter(23, "")


def test_user_defined_arrays() -> None:
    assert _conv(0, "mood[]")('{happy,"very sad",NULL}') == ["happy", "very sad", None]
    assert _conv(0, "public.mood[]")("{a}") == ["a"]
    # pgoutput names a user array type by its catalog name, _mood
    user = _conv(16390, "public._mood")
    assert user("{happy,sad}") == ["happy", "sad"] and user("[0:0]={x}") == ["x"]
    assert user("not an array") == "not an array" and user("{broken") == "{broken"


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=20,
    ),
    st.sampled_from([None, 0, 2, "\t"]),
)
def test_json_is_embedded_on_one_line(doc: object, indent: int | str | None) -> None:
    text = json.dumps(doc, indent=indent, ensure_ascii=False)
    text = text.replace("\n", "\r\n") if isinstance(indent, int) and indent else text
    for oid in (114, 3802):
        value = _conv(oid)(text)
        if doc is None:
            assert value is JSON_NULL
            continue
        out = orjson.dumps({"v": value})
        assert b"\n" not in out and b"\r" not in out
        assert json.loads(out) == {"v": doc}


def test_json_null_document_and_sql_null() -> None:
    conv = _conv(3802)
    for text in ("null", " null ", "\nnull\r\n", "\tnull"):
        assert conv(text) is JSON_NULL
    assert conv('"null"') is not JSON_NULL and conv("[null]") is not JSON_NULL
    assert orjson.dumps(JSON_NULL) == b"null"
    # inside arrays: a null document is JSON_NULL, an SQL NULL element None; both print null
    parsed = _conv(3807)('{"null",NULL,"{\\"a\\": null}"}')
    assert parsed[0] is JSON_NULL and parsed[1] is None
    assert orjson.dumps(parsed) == b'[null,null,{"a": null}]'


@given(st.binary(max_size=300))
def test_bytea_hex_and_escape_forms(data: bytes) -> None:
    assert BYTEA_ENCODING == "base64"
    conv = _conv(17)
    hex_form = "\\x" + data.hex()
    escape_form = "".join("\\\\" if b == 92 else (chr(b) if 32 <= b < 127 else f"\\{b:03o}") for b in data)
    expected = base64.b64encode(data).decode()
    assert conv(hex_form) == conv(escape_form) == expected
    assert _conv(1001)(_array_out([hex_form, None])) == [expected, None]


@pytest.mark.parametrize("text", ["\\xZZ", "\\x0", "\\8", "\\", "a\\1", "\\400", "é"])
def test_bytea_malformed(text: str) -> None:
    with pytest.raises(ValueFormatError):
        _conv(17)(text)


# --- binary converters -----------------------------------------------------------------------


def _numeric_send(d: Decimal) -> bytes:
    """numeric_send of a finite Decimal, written from the format's definition."""
    sign, digit_tuple, exp = d.as_tuple()
    assert isinstance(exp, int)
    digits = "".join(map(str, digit_tuple))
    dscale = max(0, -exp)
    if exp >= 0:
        int_part, frac = digits + "0" * exp, ""
    else:
        digits = digits.rjust(-exp + 1, "0")
        int_part, frac = digits[:exp], digits[exp:]
    int_part = int_part.rjust(-(-len(int_part) // 4) * 4, "0")
    frac = frac.ljust(-(-len(frac) // 4) * 4, "0")
    groups = [int(int_part[k : k + 4]) for k in range(0, len(int_part), 4)]
    groups += [int(frac[k : k + 4]) for k in range(0, len(frac), 4)]
    weight = len(int_part) // 4 - 1
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    flag = 0x4000 if sign and groups else 0
    return struct.pack(f">hhHH{len(groups)}H", len(groups), weight, flag, dscale, *groups)


def _in_numeric_range(d: Decimal) -> bool:
    exp = d.as_tuple().exponent
    return isinstance(exp, int) and -4000 < exp < 4000 and len(d.as_tuple().digits) < 4000


_finite = st.decimals(allow_nan=False, allow_infinity=False).filter(_in_numeric_range)


@given(_finite)
def test_numeric_binary_prints_like_numeric_out(d: Decimal) -> None:
    expected = format(abs(d) if d.is_zero() else d, "f")  # the server has no negative zero
    got = binary_converter(1700)(_numeric_send(d))
    assert got == expected
    assert isinstance(got, str) and Decimal(got) == d


def test_numeric_binary_specials() -> None:
    conv = binary_converter(1700)
    for sign, text in ((0xC000, "NaN"), (0xD000, "Infinity"), (0xF000, "-Infinity")):
        assert conv(struct.pack(">hhHH", 0, 0, sign, 0)) == text
    assert conv(struct.pack(">hhHH", 0, 0, 0, 3)) == "0.000"
    # digits beyond dscale are truncated, as numeric_recv does
    assert conv(struct.pack(">hhHHHH", 2, 0, 0, 1, 1, 2345)) == "1.2"
    for bad in (
        struct.pack(">hhHH", 1, 0, 0, 0),  # digit missing
        struct.pack(">hhHHH", 1, 0, 0x2000, 0, 1),  # bad sign
        struct.pack(">hhHHH", 1, 0, 0, 0, 10000),  # digit out of range
        struct.pack(">hhHHH", 1, 0, 0, 0x4000, 1),  # scale out of range
        struct.pack(">hhHH", -1, 0, 0, 0),
        b"\x00",
    ):
        with pytest.raises(ValueFormatError):
            conv(bad)


_PG_EPOCH = datetime(2000, 1, 1)
_MICROS_1_TO_9999 = st.integers(
    (datetime(1, 1, 1) - _PG_EPOCH) // timedelta(microseconds=1),
    (datetime(9999, 12, 31, 23, 59, 59, 999999) - _PG_EPOCH) // timedelta(microseconds=1),
)


def _iso(dt: datetime) -> str:
    text = dt.strftime("%H:%M:%S.%f").rstrip("0").rstrip(".")
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d} {text}"


@given(_MICROS_1_TO_9999)
def test_timestamps_match_pythons_calendar(micros: int) -> None:
    dt = _PG_EPOCH + timedelta(microseconds=micros)
    data = struct.pack(">q", micros)
    assert binary_converter(1114)(data) == _iso(dt)
    assert binary_converter(1184)(data) == _iso(dt) + "+00"
    days = struct.pack(">i", micros // 86_400_000_000)
    assert binary_converter(1082)(days) == _iso(dt)[:10]


def test_timestamp_edges() -> None:
    ts, tstz, date = binary_converter(1114), binary_converter(1184), binary_converter(1082)
    assert ts(struct.pack(">q", 2**63 - 1)) == "infinity" and tstz(struct.pack(">q", -(2**63))) == "-infinity"
    assert date(struct.pack(">i", 2**31 - 1)) == "infinity" and date(struct.pack(">i", -(2**31))) == "-infinity"
    # 0001-01-01 is 730119 days before 2000-01-01; the day before is in 1 BC, the proleptic
    # calendar's year 0, a leap year
    assert date(struct.pack(">i", -730_119)) == "0001-01-01"
    assert date(struct.pack(">i", -730_120)) == "0001-12-31 BC"
    assert date(struct.pack(">i", -730_120 - 365)) == "0001-01-01 BC"
    assert date(struct.pack(">i", -730_120 - 366)) == "0002-12-31 BC"
    assert date(struct.pack(">i", -730_120 - 306)) == "0001-02-29 BC"
    assert tstz(struct.pack(">q", -730_120 * 86_400_000_000 + 1)) == "0001-12-31 00:00:00.000001+00 BC"
    assert ts(struct.pack(">q", -1)) == "1999-12-31 23:59:59.999999"
    assert binary_converter(1083)(struct.pack(">q", 86_400_000_000)) == "24:00:00"
    assert binary_converter(1266)(struct.pack(">qi", 3_600_000_000, -19800)) == "01:00:00+05:30"
    assert binary_converter(1266)(struct.pack(">qi", 0, 3723)) == "00:00:00-01:02:03"


@pytest.mark.parametrize(
    ("usecs", "days", "months", "text"),
    [
        (0, 0, 0, "00:00:00"),
        (14_706_789_000, 3, 14, "1 year 2 mons 3 days 04:05:06.789"),
        (0, 0, -14, "-1 years -2 mons"),
        (-3_600_000_000, 1, 0, "1 day -01:00:00"),
        (7_380_000_000, -1, 0, "-1 days +02:03:00"),
        (-500_000, 0, 0, "-00:00:00.5"),
        (0, 1, -1, "-1 mons +1 day"),
        (2**63 - 1, 2**31 - 1, 2**31 - 1, "infinity"),
        (-(2**63), -(2**31), -(2**31), "-infinity"),
    ],
)
def test_interval_binary(usecs: int, days: int, months: int, text: str) -> None:
    assert binary_converter(1186)(struct.pack(">qii", usecs, days, months)) == text


def test_small_binary_types() -> None:
    b = binary_converter
    assert (b(16)(b"\x01"), b(16)(b"\x00"), b(16)(b"\x07")) == (True, False, True)
    assert b(21)(b"\x80\x00") == -32768 and b(23)(b"\xff\xff\xff\xfe") == -2 and b(20)(b"\x00" * 7 + b"\x2a") == 42
    assert b(26)(b"\xff\xff\xff\xff") == 2**32 - 1 and b(5069)(b"\xff" * 8) == 2**64 - 1
    assert b(701)(struct.pack(">d", float("nan"))) == "NaN" and str(b(701)(struct.pack(">d", -0.0))) == "-0.0"
    assert b(700)(struct.pack(">f", 0.1)) == 0.1 and b(700)(struct.pack(">f", float("-inf"))) == "-Infinity"
    # 43875830 lies exactly between two float4s and reads back by ties-to-even, but float4out
    # (Ryu without bounds) does not take a midpoint: it prints 4.3875832e+07
    assert b(700)(struct.pack(">f", 43875832.0)) == 43875832.0 and b(700)(struct.pack(">f", -1e-45)) == -1e-45
    assert b(25)("é😀".encode()) == "é😀" and b(1043)(b"") == ""
    assert b(18)(b"\xc8") == "\\310" and b(18)(b"\x00") == "" and b(18)(b"a") == "a"
    assert b(17)(b"\x00\xff") == base64.b64encode(b"\x00\xff").decode()
    assert b(2950)(bytes(range(16))) == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert b(3802)(b'\x01{"a": 1}') is not None and b(3802)(b"\x01null") is JSON_NULL
    assert b(114)(b"null") is JSON_NULL and orjson.dumps(b(114)(b'{\n"a": 1}')) == b'{ "a": 1}'
    assert b(869)(bytes([2, 32, 0, 4, 10, 0, 0, 1])) == "10.0.0.1"
    assert b(650)(bytes([2, 8, 1, 4, 10, 0, 0, 0])) == "10.0.0.0/8"
    assert b(869)(bytes([3, 128, 0, 16]) + bytes(15) + b"\x01") == "::1"
    assert b(869)(bytes([3, 64, 0, 16]) + bytes(10) + b"\xff\xff\x01\x02\x03\x04") == "::ffff:1.2.3.4/64"
    assert b(829)(bytes([8, 0, 0x2B, 1, 2, 3])) == "08:00:2b:01:02:03"
    assert b(1560)(b"\x00\x00\x00\x04\x50") == "0101" and b(1562)(b"\x00\x00\x00\x00") == ""
    assert b(3220)(struct.pack(">Q", 0x16_B374D848)) == "16/B374D848"
    assert b(27)(struct.pack(">IH", 7, 3)) == "(7,3)"
    assert b(4072)(b"\x01$.a") == "$.a"


def test_ranges_and_multiranges() -> None:
    int4 = struct.pack(">ii", 4, 1) + struct.pack(">ii", 4, 10)
    assert binary_converter(3904)(b"\x02" + int4) == "[1,10)"
    assert binary_converter(3904)(b"\x01") == "empty"
    assert binary_converter(3904)(b"\x18") == "(,)"
    ts = struct.pack(">iq", 8, 0)
    assert binary_converter(3908)(b"\x12" + ts) == '["2000-01-01 00:00:00",)'
    one = b"\x06" + int4
    assert binary_converter(4451)(struct.pack(">ii", 2, len(one)) + one + struct.pack(">i", 1) + b"\x01") == (
        "{[1,10],empty}"
    )
    assert binary_converter(4451)(struct.pack(">i", 0)) == "{}"


def _array_send(dims: list[tuple[int, int]], elemtype: int, elements: Sequence[bytes | None]) -> bytes:
    out = struct.pack(">iiI", len(dims), int(any(e is None for e in elements)), elemtype)
    for n, lb in dims:
        out += struct.pack(">ii", n, lb)
    for e in elements:
        out += struct.pack(">i", -1) if e is None else struct.pack(">i", len(e)) + e
    return out


def test_binary_arrays() -> None:
    i4 = [struct.pack(">i", v) for v in (1, 2, 3, 4, 5, 6)]
    conv = binary_converter(1007)
    assert conv(_array_send([], 23, [])) == []
    assert conv(_array_send([(3, 1)], 23, [i4[0], None, i4[2]])) == [1, None, 3]
    assert conv(_array_send([(2, 0), (3, 5)], 23, i4)) == [[1, 2, 3], [4, 5, 6]]
    assert conv(_array_send([(1, 1), (2, 1), (3, 1)], 23, i4)) == [[[1, 2, 3], [4, 5, 6]]]
    # the element type in the data decides (a domain's array carries the base type's OID too)
    assert conv(_array_send([(1, 1)], 25, [b"x"])) == ["x"]
    assert binary_converter(3807)(_array_send([(2, 1)], 3802, [b"\x01null", None]))[0] is JSON_NULL  # type: ignore[index]
    assert binary_converter(1009)(_array_send([(2, 1)], 25, [b"a", b""])) == ["a", ""]


def test_unknown_types_give_base64() -> None:
    conv = binary_converter(16384)
    assert conv(b"\x00\x01") == "AAE=" and binary_converter(790)(b"\x00" * 8) == "AAAAAAAAAAA="


# --- malformed binary: ValueFormatError and nothing else --------------------------------------

_BINARY_OIDS = sorted(set(values._BINARY_BY_OID) | set(ARRAY_ELEMENT))


def _valid_samples() -> list[tuple[int, bytes]]:
    i4 = struct.pack(">i", 7)
    return [
        (1700, _numeric_send(Decimal("-1234.5678"))),
        (1007, _array_send([(2, 1), (1, 1)], 23, [i4, None])),
        (3807, _array_send([(1, 1)], 3802, [b"\x01{}"])),
        (1186, struct.pack(">qii", 1, 2, 3)),
        (869, bytes([3, 128, 0, 16]) + bytes(16)),
        (3904, b"\x02" + struct.pack(">ii", 4, 1) + struct.pack(">ii", 4, 10)),
        (4451, struct.pack(">ii", 1, 1) + b"\x01"),
        (1562, b"\x00\x00\x00\x09\xff\x80"),
        (1184, struct.pack(">q", 123)),
        (2950, bytes(16)),
        (1266, struct.pack(">qi", 1, 2)),
    ]


def _accepts_or_value_error(oid: int, data: bytes) -> None:
    try:
        result = binary_converter(oid)(data)
    except ValueFormatError:
        return
    orjson.dumps(result)  # whatever comes out is serialisable


@settings(max_examples=400)
@given(st.sampled_from(_BINARY_OIDS), st.binary(max_size=48))
def test_random_binary_raises_only_value_format_error(oid: int, data: bytes) -> None:
    _accepts_or_value_error(oid, data)


@given(st.sampled_from(_valid_samples()), st.data())
def test_cut_or_extended_binary_raises_only_value_format_error(sample: tuple[int, bytes], data: st.DataObject) -> None:
    oid, raw = sample
    orjson.dumps(binary_converter(oid)(raw))
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(ValueFormatError):
        binary_converter(oid)(raw[:cut])
    with pytest.raises(ValueFormatError):
        binary_converter(oid)(raw + data.draw(st.binary(min_size=1, max_size=4)))


def test_fixed_width_lengths_are_checked() -> None:
    for oid in (16, 18, 20, 21, 23, 26, 700, 701, 1082, 1083, 1114, 1184, 1186, 1266, 2950, 829, 774, 3220, 27):
        with pytest.raises(ValueFormatError):
            binary_converter(oid)(b"\x00" * 17)
    with pytest.raises(ValueFormatError, match="UTF-8"):
        binary_converter(25)(b"\xff")
    with pytest.raises(ValueFormatError, match="version"):
        binary_converter(3802)(b"\x02{}")


def test_every_builtin_type_has_a_binary_converter_that_returns_something() -> None:
    for oid in TYPE_NAMES:
        assert callable(binary_converter(oid))


@given(st.dates())
def test_days_from_civil_matches_datetime(day: date) -> None:
    """The one calendar helper (test_decoding's timestamps, Debezium's dates) agrees with datetime
    where datetime reaches, and _ymd inverts it."""
    days = days_from_civil(day.year, day.month, day.day)
    assert days == (day - date(1970, 1, 1)).days
    assert values._ymd(days - 10_957) == (day.year, day.month, day.day)


@given(st.integers(-5_000_000, 5_000_000))
def test_days_from_civil_inverts_ymd_beyond_datetime(days_since_2000: int) -> None:
    y, m, d = values._ymd(days_since_2000)
    assert days_from_civil(y, m, d) - 10_957 == days_since_2000
