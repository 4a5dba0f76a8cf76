"""The fused row-change-to-JSONL path must write exactly what the reference path writes.

With the C extension (pgrecv.native) the fast path takes inserts, updates and deletes of every
kind; without it (PGRECV_NO_NATIVE=1) only the inserts compile_row covers. Either way the output
must be byte for byte the reference's, and whatever the fast path declines the reference writes
(or reports as an error) itself.
"""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgrecv.decode.assemble import StreamAssembler
from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.errors import DecodeError
from pgrecv.lsn import LSN
from pgrecv.native import copyfast
from pgrecv.output.fastpath import FastRows, compile_row
from pgrecv.output.jsonl import JsonlEncoder
from tests.util import awkward_doubles, sql

GOLDEN = Path(__file__).parent.parent / "golden"
NATIVE = copyfast is not None
ROW_TYPES = frozenset(b"IUD")


def messages(path: Path) -> tuple[dict[str, Any], list[tuple[bytes, int]]]:
    lines = path.read_bytes().splitlines()
    meta = orjson.loads(lines[0])["meta"]
    return meta, [(bytes.fromhex(r["data"]), int(LSN.parse(r["lsn"]))) for r in map(orjson.loads, lines[1:])]


def run(msgs: list[tuple[bytes, int]], proto: int, *, fast: bool, assemble: bool = True) -> tuple[bytes, int]:
    """Decode and encode like the streamer does; returns (output, rows written by the fast path).
    An error of the reference path is written as an ERR line, so both runs must agree on it."""
    out: list[bytes] = []
    decoder = PgOutputDecoder(proto)
    encoder = JsonlEncoder(out.append)
    fastpath = FastRows(encoder, decoder, out.append) if fast else None
    assembler = StreamAssembler()
    taken = 0
    for payload, lsn in msgs:
        for msg, at in assembler.feed(payload, lsn) if assemble else [(payload, lsn)]:
            if fastpath is not None and fastpath.row(msg, at):
                taken += 1
                continue
            try:
                encoder.feed(decoder.decode(msg, at))
            except DecodeError as exc:
                out.append(b"ERR " + str(exc).encode()[:60] + b"\n")
    return b"".join(out), taken


def golden_files() -> Iterator[Path]:
    yield from sorted(GOLDEN.glob("pg*/*.pgoutput.jsonl"))


@pytest.mark.parametrize("path", list(golden_files()), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_captures_identical(path: Path) -> None:
    meta, msgs = messages(path)
    reference, none_taken = run(msgs, meta["proto_version"], fast=False)
    fast, taken = run(msgs, meta["proto_version"], fast=True)
    assert none_taken == 0
    assert fast == reference
    if NATIVE and path.name.split(".")[0] in ("types", "toast", "replica_identity", "binary", "binary_text"):
        assert taken > 0


# --- a real server: every kind, updates and deletes, old images, TOAST, text and binary -----------

_SCHEMA = """
CREATE TABLE t (id bigint PRIMARY KEY, small smallint, i int, o oid, b boolean, n numeric,
                d date, ts timestamp, tz timestamptz, u uuid, tx text, vc varchar(20), nm name,
                f8 float8, f4 real, j jsonb, js json, by bytea, ia int[], ta text[], fa float8[],
                ba boolean[], ja jsonb[], bya bytea[], na numeric[], ia2 int[], inet inet, big text,
                mood mood, moods mood[]);
ALTER TABLE t REPLICA IDENTITY FULL;
CREATE TABLE k (a int, b text, c jsonb, PRIMARY KEY (a, b));
CREATE TABLE p (id int PRIMARY KEY, s text);
CREATE TABLE dd (id int PRIMARY KEY, n int, big text);
CREATE PUBLICATION pub FOR ALL TABLES
"""
_ROWS = r"""
INSERT INTO t VALUES
 (1, -32768, 2147483647, 4294967295, true, 'NaN', 'infinity', '-infinity', '1999-12-31 23:59:59.999999+00',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', E'quote " back \\ nl \n tab \t bell \x07 emoji 😀', 'ünïcödé', 'x"y',
  'NaN', '-Infinity', '{"a": [1, 2.5, null], "b": "\n"}', E'{"x":\n 1}', E'\\x00ff10', '{1,NULL,-3}',
  '{"a b",NULL,"NULL","q\"uote","back\\slash",""}', '{1.5,NaN,-Infinity,1e-05,1e+300}', '{t,f,NULL}',
  ARRAY['{"k": null}'::jsonb, 'null'::jsonb, NULL], ARRAY['\x00'::bytea, NULL], '{1.50,NaN}',
  '{{1,2},{3,4}}', '10.0.0.1/8', (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g),
  'happy', '{happy,sad}'),
 (2, NULL, NULL, NULL, false, '-1.500000000000000000001', '4713-01-01 BC', '2000-01-01 00:00:00.5', NULL,
  NULL, '', '', '', 1e-7, 0.1, 'null', 'null', '', '{}', '{}', '{0.1}', '{}', '{}', '{}', '{}', '{}',
  NULL, NULL, NULL, NULL),
 (3, 0, 0, 0, NULL, 'Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.30000000000000004, 3.4028235e38,
  '[]', '"s"', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO t (id, tx, f8, j, ia) SELECT g, repeat('z', g), g / 7.0, jsonb_build_object('g', g), ARRAY[g, -g]
  FROM generate_series(10, 200) g;
UPDATE t SET tx = tx || '!', f8 = -f8 WHERE id % 2 = 0;
UPDATE t SET small = 7 WHERE id = 1;
DELETE FROM t WHERE id % 5 = 0;
INSERT INTO k VALUES (1, 'a', 'null'), (2, 'b', '{"x": 1}');
UPDATE k SET a = 10 WHERE a = 1;
UPDATE k SET c = '[1]' WHERE a = 2;
DELETE FROM k;
INSERT INTO p SELECT g, 'p' || g FROM generate_series(1, 50) g;
INSERT INTO dd VALUES (1, 0, (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g));
UPDATE dd SET n = 1;
"""


def _capture(dsn: str, binary: bool) -> list[tuple[bytes, int]]:
    options = "'proto_version', '1', 'publication_names', 'pub'" + (", 'binary', 'true'" if binary else "")
    rows = sql(
        dsn,
        f"SELECT lsn - '0/0'::pg_lsn, data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, {options})",
    )
    return [(bytes(data), int(lsn)) for lsn, data in rows]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_every_kind_on_a_real_server(db_dsn: str, binary: bool) -> None:
    sql(db_dsn, "CREATE TYPE mood AS ENUM ('happy', 'sad')")
    sql(db_dsn, _SCHEMA)
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    sql(db_dsn, _ROWS)
    msgs = _capture(db_dsn, binary)
    reference, _ = run(msgs, 1, fast=False)
    fast, taken = run(msgs, 1, fast=True)
    assert fast == reference
    assert b"ERR" not in reference
    rows = sum(1 for m, _ in msgs if m[0] in ROW_TYPES)
    if NATIVE:
        assert taken == rows  # the relation record precedes each table's rows: every row is taken
        for part in (
            b'"json_nulls":["j","js"]',
            b'"old_kind":"key"',
            b'"unchanged_toast":[],"toast_from_old":["big"]',
            b'"unchanged_toast":["big"],"old":null',
        ):
            assert part in fast
    else:  # the Python fallback: inserts of table p (int and text) in text format only
        assert taken == (0 if binary else 50)
    assert rows > 300


# --- generated relations and tuples ---------------------------------------------------------------


def _float_text(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    r = repr(x)
    return r[:-2] if r.endswith(".0") else r


_ARRAY_SPECIAL = set('{},"\\ \t\n\r\v\f')


def _array_item(s: str | None) -> str:
    if s is None:
        return "NULL"
    if not s or s.upper() == "NULL" or _ARRAY_SPECIAL & set(s):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return s


def _array(items: list[str | None]) -> str:
    return "{" + ",".join(map(_array_item, items)) + "}"


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
json_docs = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
).map(lambda v: orjson.dumps(v).decode())
json_texts = st.one_of(json_docs, st.sampled_from(["null", " null\n", '{"a":\r\n1}', "\tnull ", '"x"']))
float_texts = st.one_of(
    st.floats().map(_float_text),
    st.floats(width=32).map(_float_text),
    st.sampled_from(["1e-05", "1e-07", "-0", "1e400", "0.10000000000000001", " 1.5", "1_0", "inf", "x", "1e+16"]),
)
int_texts = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str), st.sampled_from(["007", "-0", "+5", " 1", "1_000", "x", ""])
)
bytea_texts = st.one_of(
    st.binary(max_size=20).map(lambda b: "\\x" + b.hex()),
    st.binary(max_size=8).map(lambda b: "\\x" + b.hex().upper()),
    st.sampled_from(["abc\\\\d\\001", "\\x0", "\\xzz", "\\x 00"]),
)

# (type oid, type name, text values, binary values or None)
TYPES: list[tuple[int, str, st.SearchStrategy[str], st.SearchStrategy[bytes] | None]] = [
    (23, "integer", int_texts, st.integers(-(2**31), 2**31 - 1).map(lambda v: struct.pack(">i", v))),
    (20, "bigint", int_texts, st.integers(-(2**63), 2**63 - 1).map(lambda v: struct.pack(">q", v))),
    (21, "smallint", int_texts, st.integers(-(2**15), 2**15 - 1).map(lambda v: struct.pack(">h", v))),
    (26, "oid", st.integers(0, 2**32 - 1).map(str), st.integers(0, 2**32 - 1).map(lambda v: struct.pack(">I", v))),
    (16, "boolean", st.sampled_from(["t", "f", "true", "x"]), st.sampled_from([b"\x00", b"\x01", b"\x07", b""])),
    (1700, "numeric", st.decimals().map(str), None),
    (1184, "timestamp with time zone", st.sampled_from(["2020-01-01 00:00:00+00", "infinity"]), None),
    (2950, "uuid", st.uuids().map(str), st.binary(min_size=16, max_size=16)),
    (25, "text", texts, texts.map(str.encode)),
    (869, "inet", st.sampled_from(["10.0.0.1", "::1/128"]), None),
    (701, "double precision", float_texts, st.floats().map(lambda v: struct.pack(">d", v))),
    (700, "real", float_texts, st.floats(width=32).map(lambda v: struct.pack(">f", v))),
    (3802, "jsonb", json_texts, json_texts.map(lambda t: b"\x01" + t.encode())),
    (114, "json", json_texts, json_texts.map(str.encode)),
    (17, "bytea", bytea_texts, st.binary(max_size=20)),
    (1007, "integer[]", st.lists(st.none() | st.integers(-99, 99).map(str), max_size=4).map(_array), None),
    (1009, "text[]", st.lists(st.none() | texts, max_size=4).map(_array), None),
    (1022, "double precision[]", st.lists(st.none() | float_texts, max_size=3).map(_array), None),
    (1000, "boolean[]", st.lists(st.none() | st.sampled_from(["t", "f"]), max_size=3).map(_array), None),
    (3807, "jsonb[]", st.lists(st.none() | json_texts, max_size=3).map(_array), None),
    (1001, "bytea[]", st.lists(st.none() | bytea_texts, max_size=3).map(_array), None),
    (1231, "numeric[]", st.lists(st.decimals().map(str), max_size=3).map(_array), None),
    (
        1007,
        "integer[]",
        st.sampled_from(
            ["{{1,2},{3,4}}", "[0:1]={1,2}", "{{},{}}", "{1,{2}}", "{ 1}", "{1,,2}", "{NuLl}", "{{1},{2,3}}"]
        ),
        None,
    ),
    (16390, "public._mood", st.sampled_from(["{happy,sad}", "{}", "plain"]), None),
    (1560, "bit", st.sampled_from(["101"]), st.sampled_from([b"\x00\x00\x00\x03\xa0", b"\x00"])),
]


@st.composite
def relations_and_messages(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    cols = draw(st.lists(st.sampled_from(range(len(TYPES))), min_size=1, max_size=6))
    keys = [draw(st.booleans()) for _ in cols]
    ident = draw(st.sampled_from(b"dfin"))
    rel = struct.pack(">cI", b"R", 99) + b"public\x00" + b"t\x00" + bytes([ident]) + struct.pack(">H", len(cols))
    for i, (t, key) in enumerate(zip(cols, keys, strict=True)):
        oid, name = TYPES[t][0], f"c{i}" if i % 3 else f'we"ird {i}\n'
        rel += struct.pack(">B", key) + name.encode() + b"\x00" + struct.pack(">Ii", oid, -1)

    def tuple_data() -> bytes:
        out = struct.pack(">H", len(cols))
        for t in cols:
            _, _, text, binary = TYPES[t]
            what = draw(st.sampled_from("tttnub" if binary is not None else "tttnu"))
            if what == "n" or what == "u":
                out += what.encode()
                continue
            raw = draw(text).encode() if what == "t" else draw(binary)  # type: ignore[union-attr]
            out += what.encode() + struct.pack(">I", len(raw)) + raw
        return out

    msgs = []
    for _ in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from("IUUD"))
        body = struct.pack(">cI", op.encode(), 99)
        if op == "I":
            body += b"N" + tuple_data()
        elif op == "U":
            old = draw(st.sampled_from(["", "K", "O"]))
            if old:
                body += old.encode() + tuple_data()
            body += b"N" + tuple_data()
        else:
            body += draw(st.sampled_from([b"K", b"O"])) + tuple_data()
        msgs.append(body)
    return rel, msgs


def _transaction(rel: bytes, rows: list[bytes], lsn: int = 0x10000) -> list[tuple[bytes, int]]:
    begin = struct.pack(">cQqI", b"B", lsn + 10_000, 0, 7)
    commit = struct.pack(">cbQQq", b"C", 0, lsn + 10_000, lsn + 10_050, 0)
    return [(begin, lsn), (rel, 0), *((m, lsn + i) for i, m in enumerate(rows)), (commit, lsn + 10_050)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(relations_and_messages())
def test_generated_rows_identical(case: tuple[bytes, list[bytes]]) -> None:
    msgs = _transaction(*case)
    reference, _ = run(msgs, 1, fast=False, assemble=False)
    fast, _ = run(msgs, 1, fast=True, assemble=False)
    assert fast == reference


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(relations_and_messages(), st.data())
def test_malformed_rows_are_declined_or_identical(case: tuple[bytes, list[bytes]], data: st.DataObject) -> None:
    """Garbled row messages: the fast path declines them (the reference reports the error) or
    writes exactly the reference's line; it never crashes."""
    rel, rows = case
    garbled = []
    for m in rows:
        how = data.draw(st.sampled_from(["cut", "flip", "insert", "length", "keep"]))
        at = data.draw(st.integers(0, len(m) - 1))
        if how == "cut":
            m = m[:at]
        elif how == "flip":
            m = m[:at] + bytes([m[at] ^ data.draw(st.integers(1, 255))]) + m[at + 1 :]
        elif how == "insert":
            m = m[:at] + data.draw(st.binary(min_size=1, max_size=4)) + m[at:]
        elif how == "length" and len(m) > 12:
            m = m[:8] + b"t\xff\xff\xff\xf0" + m[8:]
        garbled.append(m or b"I")
    msgs = _transaction(rel, garbled)
    reference, _ = run(msgs, 1, fast=False, assemble=False)
    fast, _ = run(msgs, 1, fast=True, assemble=False)
    assert fast == reference


@pytest.mark.skipif(not NATIVE, reason="the C extension is not built or PGRECV_NO_NATIVE is set")
@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_native_floats_as_orjson_writes_them(x: float) -> None:
    assert copyfast is not None
    assert copyfast.float_json(x) == orjson.dumps(x)


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(
        st.from_regex(r"-?[0-9]{1,20}(\.[0-9]{0,20})?(e[+-]?[0-9]{1,3})?", fullmatch=True)
        | st.floats(allow_nan=False).map(lambda x: f"{x:.{abs(hash(x)) % 18}e}"),
        min_size=1,
        max_size=8,
    )
)
def test_float_texts_read_as_float_reads_them(values: list[str]) -> None:
    """Decimal texts of every length and exponent: the C reader (a one-rounding fast path, else
    strtod) gives the double float() gives, and so the same JSON."""
    rel = struct.pack(">cI", b"R", 99) + b"public\x00t\x00d" + struct.pack(">H", 1)
    rel += b"\x01f\x00" + struct.pack(">Ii", 701, -1)
    rows = []
    for v in values:
        raw = v.encode()
        rows.append(struct.pack(">cIcH", b"I", 99, b"N", 1) + b"t" + struct.pack(">I", len(raw)) + raw)
    msgs = _transaction(rel, rows)
    reference, _ = run(msgs, 1, fast=False, assemble=False)
    fast, taken = run(msgs, 1, fast=True, assemble=False)
    assert fast == reference
    assert taken == len(rows) or not NATIVE


def test_float_texts_at_the_layout_boundaries() -> None:
    """orjson's layout changes at decimal exponents -5/-6 and 15/16; the C encoder lays out texts of
    15 digits or fewer itself and must switch at the same places."""
    mantissas = ["1", "-1", "1.5", "123456789012345", "9.99999999999999", "100", "0.000"]
    texts = [f"{m}e{e}" for m in mantissas for e in (-7, -6, -5, -4, 0, 14, 15, 16, 17, 300, -300, 301, -301)]
    texts += ["0", "-0", "0.00001", "0.000001", "1000000000000000", "10000000000000000", "5e-324", "1e308"]
    test_float_texts_read_as_float_reads_them.hypothesis.inner_test(texts)  # type: ignore[attr-defined]


def _float_rows(values: list[str]) -> list[tuple[bytes, int]]:
    """Inserts into a table of a float8 and a float8[] column, each row holding one value twice."""
    rel = struct.pack(">cI", b"R", 99) + b"public\x00t\x00d" + struct.pack(">H", 2)
    rel += b"\x01f\x00" + struct.pack(">Ii", 701, -1) + b"\x00fa\x00" + struct.pack(">Ii", 1022, -1)
    rows = []
    for v in values:
        row = struct.pack(">cIcH", b"I", 99, b"N", 2)
        for raw in (v.encode(), b"{" + v.encode() + b",NULL}"):
            row += b"t" + struct.pack(">I", len(raw)) + raw
        rows.append(row)
    return _transaction(rel, rows)


# 16- and 17-digit doubles on both sides of the layout's switches (decimal exponents -5 and 16)
_LONG = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: len(repr(x).lstrip("-").split("e")[0]) > 16)


@pytest.mark.parametrize("proto", [1, 4])
@settings(max_examples=1500, deadline=None)
@given(st.lists(st.floats(allow_nan=False) | _LONG | _LONG.map(lambda x: x * 1e-12) | _LONG.map(lambda x: x * 1e12),
                min_size=1, max_size=8))  # fmt: skip
def test_long_float_texts_identical(proto: int, values: list[float]) -> None:
    """Doubles whose texts have 16 or 17 digits, alone and in arrays (as repr writes them: the
    shortest texts): under protocol 1 the C encoder reads them into a double and writes what
    orjson writes, as the reference does; under protocol 2+ (PostgreSQL 14+) it takes the digits
    of those below 10^15 as they are (Kind.SHORTEST), with the same result."""
    msgs = _float_rows([_float_text(x) for x in values])
    reference, _ = run(msgs, proto, fast=False, assemble=False)
    fast, taken = run(msgs, proto, fast=True, assemble=False)
    assert fast == reference
    assert taken == len(values) or not NATIVE


@pytest.mark.skipif(not NATIVE, reason="the C encoder's float path (PGRECV_NO_NATIVE is set)")
def test_doubles_from_the_server_identical(db_dsn: str) -> None:
    """float8 texts written by the walsender (pgoutput, protocol 2): the C encoder takes 16- and
    17-digit texts below 10^15 as they are and must still write what the reference writes, at the
    switches (10^15, 2^53, 2.7e22, whose text from the server is not the shortest) too."""
    xs = awkward_doubles(5000)
    sql(db_dsn, "CREATE TABLE dbl (id int PRIMARY KEY, x float8, xs float8[])")
    sql(db_dsn, "CREATE PUBLICATION pub FOR TABLE dbl")
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    sql(db_dsn, "INSERT INTO dbl SELECT i, x, ARRAY[x, -x] FROM unnest(%s::float8[]) WITH ORDINALITY AS u(x, i)", (xs,))
    options = "'proto_version', '2', 'publication_names', 'pub'"
    rows = sql(
        db_dsn,
        f"SELECT lsn - '0/0'::pg_lsn, data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, {options})",
    )
    msgs = [(bytes(data), int(lsn)) for lsn, data in rows]
    reference, _ = run(msgs, 2, fast=False)
    fast, taken = run(msgs, 2, fast=True)
    assert fast == reference
    assert taken == len(xs)


def test_fallback_switch() -> None:
    """PGRECV_NO_NATIVE=1 turns the C extension off in pgrecv.native, the one place that loads it;
    unset (or 0), pgrecv.native has it whenever it is built."""
    import importlib.util

    built = importlib.util.find_spec("pgrecv._copyfast") is not None
    code = "from pgrecv.native import copyfast; print(copyfast is not None)"
    for value, on in (("1", False), ("0", built), ("", built)):
        env = {**os.environ, "PGRECV_NO_NATIVE": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == str(on), value


def test_uncovered_types_have_no_python_fast_path() -> None:
    from pgrecv.events import Column, Relation

    covered = Relation(1, "public", "t", "d", (Column("a", 23, -1, "integer", True),))
    other = Relation(
        2, "public", "u", "d", (Column("a", 23, -1, "integer", True), Column("j", 3802, -1, "jsonb", False))
    )
    assert compile_row(covered) is not None
    assert compile_row(other) is None


@pytest.mark.skipif(not NATIVE, reason="the C extension is not built or PGRECV_NO_NATIVE is set")
def test_row_encoder_declines_while_it_is_busy() -> None:
    """A converter the C encoder calls may let another thread run; an encode_row from there must
    not share the buffers of the one in progress: it declines (its caller takes the reference)."""
    from pgrecv.output.format import IMAGE_FIELDS, OLD_KINDS, Kind
    from pgrecv.output.values import JSON_NULL, binary_converter

    assert copyfast is not None
    inner: list[bytes | None] = []
    msg = struct.pack(">cIcH", b"I", 99, b"N", 1) + b"t" + struct.pack(">I", 1) + b"x"
    heads = (b'{"before":', b',"after":0') * 3

    def converter(text: str) -> str:
        inner.append(copyfast.encode_row(msg, 1, plan, heads))  # type: ignore[union-attr]
        return text.upper()

    plan = copyfast.make_plan(
        bytes([Kind.OTHER]), b"\0", b",", b"\0", b"\1", (b'"a"',), (converter,), (binary_converter(25),),
        IMAGE_FIELDS, OLD_KINDS, orjson.dumps, JSON_NULL,
    )  # fmt: skip
    line = copyfast.encode_row(msg, 0x10, plan, heads)
    assert line == b'{"before":"0/10","after":0,"new":{"a":"X"},"unchanged_toast":[]}\n'
    assert inner == [None]
    assert copyfast.encode_row(msg, 0x10, plan, heads) == line  # and it is free again afterwards
    assert inner == [None, None]


@pytest.mark.parametrize(
    "value", [b"-9223373000000000000", b"18446744073709551616", b"99999999999999999999999", b"-9223372036854775808"]
)
def test_integers_past_what_json_carries_are_malformed_not_a_crash(value: bytes) -> None:
    """An integer column's text past orjson's range (-2^63 to 2^64-1; only a garbled message has
    one) is a malformed value the reference reports, and the fast path agrees: found by
    test_malformed_rows_are_declined_or_identical in CI on 2026-12-05, where orjson's TypeError
    escaped the encoder."""
    rel = (
        b"R\x00\x00\x00cpublic\x00t\x00d\x00\x02\x00a\x00\x00\x00\x00\x14\xff\xff\xff\xff"
        b"\x00b\x00\x00\x00\x00\x17\xff\xff\xff\xff"
    )
    row = b"I\x00\x00\x00cN\x00\x02t" + len(value).to_bytes(4, "big") + value + b"t\x00\x00\x00\x010"
    msgs = _transaction(rel, [row])
    reference, _ = run(msgs, 1, fast=False, assemble=False)
    fast, _ = run(msgs, 1, fast=True, assemble=False)
    assert fast == reference
    fits = -(2**63) <= int(value) <= 2**64 - 1
    assert (b"ERR cannot convert column a (bigint) of public.t: integer value" in reference) != fits, reference
