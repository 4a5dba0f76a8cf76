"""Converters against real servers.

For a broad set of values of every supported type, the server gives both forms of each value:
``<typoutput>(v)`` (what text-mode pgoutput and test_decoding carry; not ``v::text``, which differs
for ``character`` and ``inet``) and ``<typsend>(v)`` (what binary
pgoutput carries). Checked:

(a) the text converter's value equals an independent reading of the same datum (psycopg's own
    loaders: int, float, Decimal, bool, json.loads, bytes, lists), and types kept as text have no
    converter; by OID and by format_type name (test_decoding) alike;
(b) the binary converter gives exactly the JSON the text converter gives, for every value: this
    cross-check is what makes binary mode trustworthy (timestamps, intervals, numerics, inet...
    are rendered like the server's output functions).
"""

from __future__ import annotations

import base64
import decimal
import ipaddress
import json
import math
import struct
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgrecv.output.values import JSON_NULL, binary_converter, parse_array, text_converter
from pgrecv.pg.server import TempServer
from pgrecv.pg.types import TYPE_NAMES

Conn = psycopg.Connection[Any]

# type -> SQL expressions (each cast to the type). Edge values first.
CASES: dict[str, list[str]] = {
    "smallint": ["0", "-32768", "32767", "NULL"],
    "integer": ["0", "1", "-1", "-2147483648", "2147483647"],
    "bigint": ["-9223372036854775808", "9223372036854775807", "42"],
    "oid": ["0", "4294967295", "1259"],
    "xid": ["'0'", "'4294967295'", "'731'"],
    "xid8": ["'0'", "'18446744073709551615'"],
    "cid": ["'0'", "'4294967295'"],
    "real": [
        "0",
        "'-0'",
        "1.1",
        "0.1",
        "3.4028235e38",
        "1e-45",
        "1.17549435e-38",
        "16777217",
        "1e10",
        "123456.79",
        "-2.5",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "43875832",
        "1e-40",
        "'1.1754944e-38'",
        "'2.3509887e-38'",
        "16777216",
        "'1.7014118e+38'",
        "'3.0517578e-05'",
    ],
    "double precision": [
        "0",
        "'-0'",
        "0.1",
        "1e308",
        "5e-324",
        "1e16",
        "1e15",
        "123456789.123",
        "-1.5e-300",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
    ],
    "numeric": [
        "0",
        "0.00",
        "-0.5",
        "12.50",
        "'1e-20'",
        "10000",
        "99990000",
        "0.000000001",
        "-0.0001",
        "1.0000",
        "123456789012345678901234567890.123456789",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "'1e100'",
        "'-9999.99990000'",
        "'0.' || repeat('0', 100) || '1'",
        "1::numeric / 3",
        "round(2::numeric, 16383)",
    ],
    "boolean": ["true", "false", "NULL"],
    "text": [
        "''",
        "'a'",
        "'😀 emoji'",
        "'with \"quotes\" and ''apostrophes'''",
        "E'back\\\\slash'",
        "E'new\\nline\\r\\n'",
        "E'tab\\there'",
        "'NULL'",
        "repeat('x', 10000)",
        "'{1,2}'",
    ],
    "character varying(5)": ["'abc'", "''", "'ééééé'"],
    "character(5)": ["'ab'", "''", "'abcde'"],
    "name": ["'abc'", "'Ünï code'"],
    '"char"': ["'a'", "''", "chr(200)", "'\"'"],
    "json": [
        '\'{"a": [1, 2, {"b": null}]}\'',
        "'null'",
        "' null '",
        "E'\\nnull\\n'",
        "'[]'",
        "'\"str\"'",
        '\'{"k": "line1\\nline2"}\'',
        "E'{\\n\"a\":\\r\\n 1\\t}'",
        "'\"😀\"'",
        "'1.0e5'",
        "'-0'",
        '\'{"a": 1, "a": 2}\'',
        "'\"\\u2028 sep\"'",
    ],
    "jsonb": [
        '\'{"a": [1, 2, {"b": null}]}\'',
        "'null'",
        "' null '",
        "'[]'",
        "'\"str\"'",
        '\'{"k": "line1\\nline2"}\'',
        "E'{\\n\"a\":\\r\\n 1}'",
        "'\"😀\"'",
        "'1e400'",
        '\'{"b": 1, "a": [null, true, 1.50]}\'',
    ],
    "bytea": ["''", "'\\x00'", "'\\x00ff10'", "'abc'", "decode(repeat('ab', 1000), 'hex')", "'\\x5c22'"],
    "uuid": ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'"],
    "date": [
        "'2026-01-02'",
        "'0001-01-01'",
        "'0044-03-15 BC'",
        "'4713-01-01 BC'",
        "'5874897-12-31'",
        "'infinity'",
        "'-infinity'",
        "'2000-01-01'",
        "'1999-12-31'",
        "'1970-01-01'",
        "'2000-02-29'",
        "'1900-03-01'",
        "'0001-12-31 BC'",
        "'10000-01-01'",
    ],
    "timestamp without time zone": [
        "'2026-01-02 03:04:05.123456'",
        "'2026-01-02 03:04:05.5'",
        "'2026-01-02 00:00:00'",
        "'0044-03-15 12:00:00 BC'",
        "'4713-01-01 00:00:00 BC'",
        "'294276-12-31 23:59:59.999999'",
        "'infinity'",
        "'-infinity'",
        "'1999-12-31 23:59:59.999999'",
        "'10000-01-01 00:00:00.000001'",
        "'0001-01-01 00:00:00'",
        "'1969-07-20 20:17:40.01'",
    ],
    "timestamp with time zone": [
        "'2026-01-02 03:04:05.123456+00'",
        "'2026-06-01 12:00:00+05:30'",
        "'2026-06-01 12:00:00-08'",
        "'0044-03-15 12:00:00+00 BC'",
        "'infinity'",
        "'-infinity'",
        "'1999-12-31 23:59:59.999999+00'",
        "'4713-01-01 00:00:00+00 BC'",
        "'294276-12-31 23:59:59.999999+00'",
    ],
    "time without time zone": ["'00:00:00'", "'23:59:59.999999'", "'24:00:00'", "'12:34:56.5'", "'01:02:03.000040'"],
    "time with time zone": [
        "'12:34:56+05:30'",
        "'00:00:00-15:59'",
        "'12:00:00+01:02:03'",
        "'24:00:00+00'",
        "'08:00:00.25-03'",
    ],
    "interval": [
        "'0'",
        "'1 year 2 mons 3 days 04:05:06.789'",
        "'-1 year -2 mons'",
        "'1 day -01:00:00'",
        "'-1 days +02:03:00'",
        "'-0.5 seconds'",
        "'100 hours'",
        "'1 mon -1 day'",
        "'-178000000 years'",
        "'178000000 years'",
        "'1 year -1 second'",
        "'-1 year 1 day'",
        "'1 mon'",
        "'1 day'",
        "'2 days'",
        "'-1 day'",
        "'13 mons'",
        "'-13 mons'",
        "'00:00:00.000001'",
        "'-2562047788:00:54.775807'",
        "'1 year 1 mon 1 day 1 hour'",
        "'-1 year -1 mon -1 day -1 hour'",
    ],
    "inet": [
        "'192.168.0.1'",
        "'192.168.0.1/24'",
        "'10.0.0.0/8'",
        "'::1'",
        "'::'",
        "'::ffff:1.2.3.4'",
        "'::1.2.3.4'",
        "'2001:db8::1'",
        "'2001:db8:0:0:1:0:0:1'",
        "'1:0:2:0:3:0:4:0'",
        "'fe80::1/64'",
        "'0.0.0.0/0'",
        "'1::'",
        "'::ffff:0:1.2.3.4'",
        "'0:0:0:0:0:1:0:0'",
        "'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'",
        "'1:2:3:4:5:6:7::'",
        "'::2:3:4:5:6:7:8'",
        "'1:0:0:2::3'",
        "'::ffff'",
        "'::1:0'",
        "'::fffe:1.2.3.4'",
    ],
    "cidr": ["'10.0.0.0/8'", "'192.168.1.0/24'", "'2001:db8::/32'", "'::/0'", "'1.2.3.4/32'", "'::ffff:1.2.3.0/120'"],
    "macaddr": ["'08:00:2b:01:02:03'", "'ff:ff:ff:ff:ff:ff'"],
    "macaddr8": ["'08:00:2b:01:02:03:04:05'"],
    "bit(4)": ["B'0101'", "B'0000'"],
    "bit(10)": ["B'1010101011'"],
    "bit varying": ["B''", "B'1'", "B'101010101'", "B'11111111'"],
    "pg_lsn": ["'0/0'", "'16/B374D848'", "'FFFFFFFF/FFFFFFFF'"],
    "tid": ["'(0,1)'", "'(4294967295,65535)'"],
    "jsonpath": ["'$.a[*] ? (@ > 1)'", "'strict $.x'", "'$'"],
    "int4range": ["'[1,10)'", "'empty'", "'(,5]'", "'[3,)'", "'(,)'", "'[1,1]'"],
    "int8range": ["'[-9223372036854775808,9223372036854775807)'"],
    "numrange": ["'[1.5,2.50]'", "'(,0.000)'", "'[NaN,NaN]'"],
    "tsrange": ['\'["2026-01-01 00:00:00","2026-01-02 00:00:00.5")\'', "'[-infinity,infinity]'"],
    "tstzrange": ["'[2026-01-01 00:00:00+00,)'"],
    "daterange": ["'[2026-01-01,2026-02-01)'", "'[-infinity,infinity)'", "'[0044-01-01 BC,0001-01-01)'"],
    "int4multirange": ["'{[1,3),[5,7)}'", "'{}'"],
    "datemultirange": ["'{[2026-01-01,2026-02-01)}'"],
    "tsmultirange": ["'{[\"2026-01-01 00:00:00\",)}'"],
    "integer[]": [
        "'{}'",
        "'{1,2,NULL}'",
        "'{{1,2},{3,4}}'",
        "'[0:1]={1,2}'",
        "'[0:1][5:6]={{1,2},{3,4}}'",
        "'{{{1},{2}},{{3},{4}}}'",
        "'{{{{{{1}}}}}}'",
        "'{NULL}'",
        "'{{NULL,NULL},{NULL,1}}'",
    ],
    "text[]": [
        '\'{"a b","with \\"quote\\"","back\\\\\\\\slash",NULL,"NULL","","{}",",",null}\'',
        "ARRAY['😀', E'new\\nline', ' lead', 'trail ', 'null', 'Null', 'semi;colon', E'tab\\t', '}{', '']",
        "ARRAY[ARRAY['a','b'],ARRAY['c',NULL]]",
        "'{}'",
        "'[2:3]={x,y}'",
    ],
    "boolean[]": ["'{t,f,NULL}'"],
    "smallint[]": ["'{-32768,32767}'"],
    "bigint[]": ["'{-9223372036854775808,0,NULL}'"],
    "real[]": ["'{0.1,NaN,-Infinity,-0}'"],
    "double precision[]": ["'{0.1,NaN,Infinity,-0,1e300,NULL}'"],
    "numeric[]": ["'{1.50,NaN,-Infinity,NULL,0.000}'"],
    "jsonb[]": ["ARRAY['{\"a\": 1}'::jsonb, 'null'::jsonb, NULL, '\"s\"'::jsonb, E'\"\\\\n\"'::jsonb]"],
    "json[]": ["ARRAY[E'{\\n\"a\": 1}'::json, 'null'::json, NULL]"],
    "bytea[]": ["ARRAY['\\x00'::bytea, NULL, ''::bytea, 'ab']"],
    "timestamp with time zone[]": ["ARRAY['2026-01-02 03:04:05.5+00'::timestamptz, 'infinity', NULL]"],
    "timestamp without time zone[]": ["'{\"0044-03-15 12:00:00 BC\"}'"],
    "date[]": ["'{2026-01-02,infinity,NULL}'"],
    "time without time zone[]": ["'{12:00:00,24:00:00}'"],
    "interval[]": ["ARRAY['1 day'::interval, '-1 mon +02:00', NULL]"],
    "uuid[]": ["ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, NULL]"],
    "inet[]": ["'{::1,10.0.0.1/8}'"],
    "character varying[]": ["'{a,\"b c\"}'"],
    "character[]": ["'{a,bb}'"],
    '"char"[]': ["'{a,b,\"\\\\\\\\\"}'"],
    "name[]": ["'{pg_class,\"with space\"}'"],
    "oid[]": ["'{1,4294967295}'"],
    "int4range[]": ["ARRAY['[1,2)'::int4range, 'empty']"],
    "numrange[]": ["ARRAY['[1.5,2.5)'::numrange]"],
    "bit varying[]": ["'{101,\"\"}'"],
}

# Types whose binary form has no decoder: the binary converter gives base64 of the send() bytes
# (arrays of them: lists of base64 elements).
OPAQUE_BINARY: dict[str, list[str]] = {
    "money": ["12.34", "-1"],
    "point": ["'(1,2)'", "'(1e20,-0.5)'"],
    "box": ["'(1,1),(0,0)'"],
    "tsvector": ["'a fat cat'"],
    "regclass": ["'pg_class'"],
    "box[]": ["ARRAY['(1,1),(0,0)'::box, '(3,3),(2,2)']"],
    "point[]": ["'{\"(1,2)\",NULL}'"],
}

# Types whose text form psycopg reads independently (the text-converter oracle), by base type name.
PSYCOPG_ORACLE = {
    "smallint",
    "integer",
    "bigint",
    "oid",
    "real",
    "double precision",
    "numeric",
    "boolean",
    "json",
    "jsonb",
    "bytea",
}
CONVERTED_TEXT_TYPES = PSYCOPG_ORACLE | {"xid", "xid8", "cid"}


def _base(type_sql: str) -> str:
    return type_sql.split("(")[0].removesuffix("[]")


def _fetch(conn: Conn, type_sql: str, exprs: list[str]) -> list[tuple[Any, ...]]:
    """(oid, format_type name, text form, send() bytes, psycopg's reading or None) per expression."""
    row = conn.execute(
        "SELECT typsend::text, typoutput::text FROM pg_type WHERE oid = %s::regtype", (type_sql,)
    ).fetchone()
    assert row is not None
    send, out = row
    oracle = _base(type_sql) in PSYCOPG_ORACLE
    values = ", ".join(f"({i}, ({e})::{type_sql})" for i, e in enumerate(exprs))
    rows = conn.execute(
        f"SELECT {out}(v)::text, {send}(v), pg_typeof(v)::oid::int, format_type(pg_typeof(v), NULL),"
        f" {'v' if oracle else 'NULL'} FROM (VALUES {values}) t(i, v) ORDER BY i"
    ).fetchall()
    assert len(rows) == len(exprs)
    return [(oid, name, text, None if b is None else bytes(b), py) for text, b, oid, name, py in rows]


def _json(value: object) -> bytes:
    """How a converted value ends up in JSONL (JSON_NULL at the top level is a JSON null too)."""
    return orjson.dumps(value)


def _same_as_psycopg(ours: object, py: Any, base: str) -> bool:
    if isinstance(py, list) and isinstance(ours, list):  # an array (json arrays are Fragments)
        return len(ours) == len(py) and all(_same_as_psycopg(o, p, base) for o, p in zip(ours, py, strict=True))
    if base in ("json", "jsonb"):
        if ours is JSON_NULL:
            return py is None
        if ours is None:  # SQL NULL (psycopg reads JSON null as None too)
            return py is None
        raw = _json(ours)
        return b"\n" not in raw and b"\r" not in raw and json.loads(raw) == py
    if py is None or ours is None:
        return py is None and ours is None
    if base == "numeric":
        assert isinstance(ours, str)
        d = decimal.Decimal(ours)
        expected: decimal.Decimal = py
        if d.is_nan() or expected.is_nan():
            return d.is_nan() and expected.is_nan()
        return d == expected and d.as_tuple().exponent == expected.as_tuple().exponent  # same scale too
    if base in ("real", "double precision"):
        if math.isnan(py) or math.isinf(py):
            return ours == {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[str(py)]
        return type(ours) is float and ours == py and math.copysign(1, ours) == math.copysign(1, py)
    if base == "bytea":
        return isinstance(ours, str) and base64.b64decode(ours, validate=True) == py
    return type(ours) is type(py) and ours == py


def _check_type(conn: Conn, type_sql: str, exprs: list[str]) -> int:
    checked = 0
    base = _base(type_sql)
    for oid, name, text, data, py in _fetch(conn, type_sql, exprs):
        conv = text_converter(oid, name)
        assert text_converter(0, name) is conv or _json(_apply(text_converter(0, name), text)) == _json(
            _apply(conv, text)
        ), (type_sql, text)
        if base not in CONVERTED_TEXT_TYPES:
            assert conv is None or type_sql.endswith("[]"), (type_sql, "kept as server text")
        ours = _apply(conv, text)
        if base in PSYCOPG_ORACLE:
            assert _same_as_psycopg(ours, py, base), (type_sql, text, ours, py)
        if type_sql.endswith("[]"):
            assert isinstance(ours, list) or text is None, (type_sql, text)
        got = None if data is None else binary_converter(oid)(data)
        if got is JSON_NULL or ours is JSON_NULL:
            assert got is ours, (type_sql, text)
        assert _json(got) == _json(ours), (type_sql, text, data, got, ours)
        checked += 1
    return checked


def _apply(conv: Any, text: str | None) -> object:
    if text is None:
        return None
    return text if conv is None else conv(text)


@pytest.fixture(scope="module")
def conn(pg_server: TempServer) -> Iterator[Conn]:
    with psycopg.connect(pg_server.dsn(), autocommit=True) as c:
        row = c.execute("SHOW TimeZone").fetchone()
        assert row is not None and row[0] == "UTC", "binary timestamptz rendering assumes TimeZone=UTC"
        yield c


@pytest.mark.parametrize("type_sql", list(CASES))
def test_text_and_binary_agree(conn: Conn, type_sql: str) -> None:
    assert _check_type(conn, type_sql, CASES[type_sql]) == len(CASES[type_sql])


def test_xml_where_the_server_has_it(conn: Conn) -> None:
    try:
        conn.execute("SELECT '<a/>'::xml")
    except psycopg.errors.FeatureNotSupported:
        pytest.skip("server built without libxml")
    exprs = ["'<a>b</a>'", "'text &amp; more'", "''", "'<a x=\"1\">😀</a>'"]
    assert _check_type(conn, "xml", exprs) == len(exprs)


def test_interval_infinity_on_servers_that_have_it(conn: Conn, pg_server: TempServer) -> None:
    if int(str(pg_server.version).split(".")[0]) < 17:
        pytest.skip("interval infinity arrived in PostgreSQL 17")
    assert _check_type(conn, "interval", ["'infinity'", "'-infinity'"]) == 2
    assert _check_type(conn, "interval[]", ["'{infinity,-infinity}'"]) == 1


@pytest.mark.parametrize("type_sql", list(OPAQUE_BINARY))
def test_types_without_binary_decoder_give_base64(conn: Conn, type_sql: str) -> None:
    for oid, name, text, data, _ in _fetch(conn, type_sql, OPAQUE_BINARY[type_sql]):
        got = binary_converter(oid)(data)
        if type_sql.endswith("[]"):  # the array structure is known, its elements are opaque
            assert isinstance(got, list) and len(got) == 2
            elements = [None if g is None else base64.b64decode(g) for g in got]
            assert elements[0] is not None and elements[0] in data and len(elements[0]) in (16, 32)
        else:
            assert got == base64.b64encode(data).decode()
        ours = _apply(text_converter(oid, name), text)
        if type_sql == "box[]":
            assert ours == ["(1,1),(0,0)", "(3,3),(2,2)"]  # typdelim ';'
        elif type_sql == "point[]":
            assert ours == ["(1,2)", None]
        else:
            assert ours == text


def test_bytea_escape_output(conn: Conn) -> None:
    conn.execute("SET bytea_output = escape")
    try:
        exprs = ["''", "'\\x00015c7f80ff'", "'abc'", "'\\x5c5c'", "decode('00' || repeat('41', 300), 'hex')"]
        rows = _fetch(conn, "bytea", exprs)
        arrays = _fetch(conn, "bytea[]", ["ARRAY['\\x005c22'::bytea, NULL]"])
    finally:
        conn.execute("RESET bytea_output")
    for oid, name, text, data, py in rows:
        assert not text.startswith("\\x")
        assert base64.b64decode(text_converter(oid, name)(text)) == py == data  # type: ignore[misc,arg-type]
    oid, name, text, data, py = arrays[0]
    assert text_converter(oid, name)(text) == [base64.b64encode(b'\x00\\"').decode(), None]  # type: ignore[misc]


def test_every_type_in_the_cases_is_known(conn: Conn) -> None:
    for type_sql in [*CASES, *OPAQUE_BINARY]:
        row = conn.execute("SELECT %s::regtype::oid::int", (type_sql,)).fetchone()
        assert row is not None and row[0] in TYPE_NAMES


# --- random values: the server normalises, both forms must still agree -------------------------

SLOW = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


@SLOW
@given(st.lists(st.decimals(allow_nan=True, allow_infinity=True, places=None), min_size=1, max_size=40))
def test_random_numerics(conn: Conn, values: list[decimal.Decimal]) -> None:
    exprs = []
    for d in values:
        if d.is_nan():
            d = decimal.Decimal("NaN")  # PostgreSQL reads neither sNaN nor -NaN
        if d.is_finite() and (abs(d.adjusted()) > 1000 or -d.as_tuple().exponent > 16383):  # type: ignore[operator]
            continue
        exprs.append(_sql_str(str(d)))
    if exprs:
        _check_type(conn, "numeric", exprs)
        _check_type(conn, "numeric[]", ["ARRAY[" + ",".join(e + "::numeric" for e in exprs) + "]"])


@SLOW
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=60))
def test_random_reals(conn: Conn, bits: list[int]) -> None:
    exprs = []
    for b in bits:
        (v,) = struct.unpack(">f", b.to_bytes(4, "big"))
        exprs.append("'NaN'" if math.isnan(v) else _sql_str(f"{v:.9g}".replace("inf", "Infinity")))
    _check_type(conn, "real", exprs)


@SLOW
@given(st.lists(st.floats(allow_nan=False), min_size=1, max_size=60))
def test_random_doubles(conn: Conn, values: list[float]) -> None:
    _check_type(conn, "double precision", [_sql_str(repr(v).replace("inf", "Infinity")) for v in values])


# PostgreSQL's range: 4713-11-24 BC to 294276-12-31 AD in microseconds around 2000-01-01
_TS_MIN = -211813488000000000
_TS_MAX = 9223371331199999999


@SLOW
@given(st.lists(st.integers(_TS_MIN, _TS_MAX), min_size=1, max_size=60), st.integers(-15 * 3600, 15 * 3600))
def test_random_timestamps_dates_times(conn: Conn, micros: list[int], zone: int) -> None:
    stamps = [
        f"'2000-01-01'::timestamp + interval '{u // 1_000_000} seconds' + interval '{u % 1_000_000} microseconds'"
        for u in micros
    ]
    _check_type(conn, "timestamp without time zone", stamps)
    _check_type(conn, "timestamp with time zone", [f"({s})::text || '+00'" for s in stamps])
    _check_type(conn, "date", [f"({s})::date" for s in stamps])
    _check_type(conn, "time without time zone", [f"({s})::time" for s in stamps])
    z = f"{'-' if zone < 0 else '+'}{abs(zone) // 3600:02d}:{abs(zone) // 60 % 60:02d}:{abs(zone) % 60:02d}"
    _check_type(conn, "time with time zone", [f"(({s})::time)::text || '{z}'" for s in stamps])


@SLOW
@given(
    st.lists(
        st.tuples(
            st.integers(-(2**31) + 1, 2**31 - 2), st.integers(-(2**31) + 1, 2**31 - 2), st.integers(-(2**62), 2**62)
        ),
        min_size=1,
        max_size=60,
    )
)
def test_random_intervals(conn: Conn, parts: list[tuple[int, int, int]]) -> None:
    exprs = [
        f"make_interval(months => {m}) + make_interval(days => {d})"
        f" + interval '{u // 1_000_000} seconds' + interval '{u % 1_000_000} microseconds'"
        for m, d, u in parts
    ]
    _check_type(conn, "interval", exprs)


@SLOW
@given(st.lists(st.tuples(st.binary(min_size=16, max_size=16), st.integers(0, 128), st.booleans()), max_size=40))
def test_random_addresses(conn: Conn, addrs: list[tuple[bytes, int, bool]]) -> None:
    v6 = []
    v4 = []
    for raw, bits, zeros in addrs:
        if zeros:  # runs of zero words are where the formatting rules are
            raw = bytes(b if (k // 2) % 3 else 0 for k, b in enumerate(raw))
        v6.append(_sql_str(f"{ipaddress.IPv6Address(raw).exploded}/{bits}"))
        v4.append(_sql_str(f"{ipaddress.IPv4Address(raw[:4])}/{bits % 33}"))
    if addrs:
        _check_type(conn, "inet", v6 + v4)
        _check_type(conn, "cidr", [f"set_masklen(({e})::inet, masklen(({e})::inet))::cidr" for e in v6 + v4])


# --- the array parser against the server's own array_out ------------------------------------------

_array_text = st.text(max_size=8).map(lambda t: t.replace("\x00", ""))  # text cannot hold NUL


@SLOW
@given(
    st.lists(
        st.lists(
            st.one_of(st.none(), _array_text, st.sampled_from(["NULL", "", " ", '"', "\\", "{,}"])),
            min_size=2,
            max_size=2,
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(-3, 3),
)
def test_parse_array_reads_array_out(conn: Conn, rows: list[list[str | None]], lower: int) -> None:
    """Random text[] values built by the server (1-D, 2-D and with a lower bound that is not 1):
    parsing its array_out text gives back the elements; so does the binary form."""
    flat = [v for row in rows for v in row]
    one_d, two_d, shifted = _fetch_arrays(conn, flat, len(rows), lower)
    assert parse_array(one_d[0]) == flat and binary_converter(1009)(one_d[1]) == flat
    assert parse_array(two_d[0]) == rows and binary_converter(1009)(two_d[1]) == rows
    assert shifted[0].startswith("[") or lower == 1
    assert parse_array(shifted[0]) == flat and binary_converter(1009)(shifted[1]) == flat


def _fetch_arrays(conn: Conn, flat: list[str | None], nrows: int, lower: int) -> list[tuple[str, bytes]]:
    """(array_out text, array_send bytes) of: the 1-D array, its pairs as a 2-D array, and the
    1-D array with its lower bound moved to ``lower``."""
    out = []
    for query in (
        "SELECT %(v)s::text[]",
        "SELECT array_agg(ARRAY[(%(v)s::text[])[2 * i - 1], (%(v)s::text[])[2 * i]] ORDER BY i)"
        " FROM generate_series(1, %(n)s) i",
        "SELECT ('[' || %(lo)s || ':' || %(hi)s || ']=' || array_out(%(v)s::text[])::text)::text[]",
    ):
        row = conn.execute(
            f"SELECT array_out(a)::text, array_send(a) FROM ({query}) t(a)",
            {"v": flat, "n": nrows, "lo": lower, "hi": lower + len(flat) - 1},
        ).fetchone()
        assert row is not None
        out.append((row[0], bytes(row[1])))
    return out
