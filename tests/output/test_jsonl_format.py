"""The format table and record layouts that every row encoder splices from."""

from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgrecv import events as ev
from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.output.fastpath import FastRows, compile_row
from pgrecv.output.format import (
    FORMAT_VERSION,
    IMAGE_TAIL,
    BinaryKind,
    Kind,
    array_element,
    binary_kind,
    column_keys,
    column_kind,
    image_splice,
    record_pieces,
    row_record,
    snapshot_record,
)
from pgrecv.output.jsonl import JsonlEncoder
from pgrecv.snapshot.fast import BlockEncoder


@pytest.mark.parametrize(
    ("oid", "name", "kind"),
    [
        (20, "bigint", Kind.RAW),
        (21, "smallint", Kind.RAW),
        (23, "integer", Kind.RAW),
        (26, "oid", Kind.RAW),
        (28, "xid", Kind.RAW),
        (5069, "xid8", Kind.RAW),
        (16, "boolean", Kind.BOOL),
        (1700, "numeric", Kind.QUOTE),
        (1184, "timestamp with time zone", Kind.QUOTE),
        (2950, "uuid", Kind.QUOTE),
        (25, "text", Kind.TEXT),
        (869, "inet", Kind.TEXT),
        (0, "numeric(10,2)", Kind.TEXT),  # test_decoding names, no OID: text is always exact
        (16385, "public.mood", Kind.TEXT),  # an enum
        (3802, "jsonb", Kind.JSON),
        (114, "json", Kind.JSON),
        (701, "double precision", Kind.FLOAT),
        (700, "real", Kind.FLOAT),
        (1007, "integer[]", Kind.ARRAY),
        (0, "text[]", Kind.ARRAY),
        (17, "bytea", Kind.BYTEA),
        (16390, "public._mood", Kind.OTHER),  # a user-defined array: parsed only if it reads as one
    ],
)
def test_column_kinds(oid: int, name: str, kind: Kind) -> None:
    got, conv = column_kind(oid, name)
    assert got is kind
    assert (conv is not None) == (kind >= Kind.OTHER)


@pytest.mark.parametrize(
    ("oid", "element"),
    [
        (1007, (Kind.RAW, ",")),
        (1000, (Kind.BOOL, ",")),
        (1009, (Kind.TEXT, ",")),
        (1231, (Kind.TEXT, ",")),  # numeric[]: elements kept as their text
        (1022, (Kind.FLOAT, ",")),
        (3807, (Kind.JSON, ",")),
        (1001, (Kind.BYTEA, ",")),
        (1020, (Kind.TEXT, ";")),  # box[]
        (23, None),
    ],
)
def test_array_elements_come_from_the_reference_converter(oid: int, element: tuple[Kind, str] | None) -> None:
    assert array_element(oid, "") == element


@pytest.mark.parametrize(
    ("oid", "kind"),
    [
        (23, BinaryKind.INT4),
        (20, BinaryKind.INT8),
        (28, BinaryKind.UINT4),  # xid is read as oid is
        (25, BinaryKind.UTF8),
        (1043, BinaryKind.UTF8),
        (3802, BinaryKind.JSONB),
        (701, BinaryKind.FLOAT8),
        (700, BinaryKind.PY),  # float4's shortest decimal: Python's
        (1700, BinaryKind.PY),
        (790, BinaryKind.BYTEA),  # money: no decoder, the raw bytes in base64 as bytea's
    ],
)
def test_binary_kinds(oid: int, kind: BinaryKind) -> None:
    assert binary_kind(oid)[0] is kind


def test_kinds_are_numbered_as_the_c_module_knows_them() -> None:
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / "pgrecv" / "_copyfast.c").read_text()
    names = ", ".join(f"{k.name} = {k.value}" for k in Kind)
    assert f"enum {{ {names} }};" in source
    bnames = [f"B_{k.name}" for k in BinaryKind]
    assert f"enum {{ {bnames[0]} = 0, {', '.join(bnames[1:])}" in " ".join(source.split())


names = st.text(min_size=1, max_size=12)
values = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=20), st.booleans())


@given(
    schema=names,
    table=names,
    columns=st.dictionaries(names, values, max_size=5),
    key=st.lists(names, max_size=2),
    xid=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
)
def test_a_spliced_line_is_the_reference_record(
    schema: str, table: str, columns: dict[str, object], key: list[str], xid: int | None
) -> None:
    """head + keys and values + tail is byte for byte what orjson writes for the whole record."""
    record = row_record("insert", schema, table, xid, "0/16B3748", "0/16B3700", "2026-11-25T04:00:00Z", key)
    head, tail = image_splice(record)
    keys = column_keys(list(columns))
    spliced = head + b"".join(k + orjson.dumps(v) for k, v in zip(keys, columns.values(), strict=True)) + tail
    whole = orjson.dumps({**record, "new": columns, "unchanged_toast": []}, option=orjson.OPT_APPEND_NEWLINE)
    assert spliced == whole
    assert record["v"] == FORMAT_VERSION and tail == IMAGE_TAIL


def test_snapshot_record_layout() -> None:
    head, tail = image_splice(snapshot_record("s", "t", "0/1", ["id"]))
    assert head == b'{"v":1,"op":"snapshot","schema":"s","table":"t","snapshot_lsn":"0/1","key":["id"],"new":{'
    assert tail == b'},"unchanged_toast":[]}\n'


# --- the encoders that splice agree with the reference on the types the two OID tables disagreed on --

_XTYPES = ev.Relation(
    16400,
    "public",
    "xids",
    "d",
    (
        ev.Column("id", 23, -1, "integer", True),
        ev.Column("x", 28, -1, "xid", False),
        ev.Column("x8", 5069, -1, "xid8", False),
        ev.Column("c", 29, -1, "cid", False),
        ev.Column("addr", 869, -1, "inet", False),
    ),
)


def _relation_msg(rel: ev.Relation) -> bytes:
    out = b"R" + struct.pack(">I", rel.oid) + rel.namespace.encode() + b"\0" + rel.name.encode() + b"\0"
    out += rel.replica_identity.encode() + struct.pack(">H", len(rel.columns))
    for c in rel.columns:
        out += bytes([int(c.key)]) + c.name.encode() + b"\0" + struct.pack(">Ii", c.type_oid, c.type_modifier)
    return out


def _insert_msg(oid: int, row: tuple[str | None, ...]) -> bytes:
    body = struct.pack(">cIcH", b"I", oid, b"N", len(row))
    for v in row:
        body += b"n" if v is None else b"t" + struct.pack(">I", len(v.encode())) + v.encode()
    return body


rows = st.lists(
    st.tuples(
        st.integers(1, 2**31 - 1).map(str),
        st.one_of(st.none(), st.integers(0, 2**32 - 1).map(str)),
        st.one_of(st.none(), st.integers(0, 2**64 - 1).map(str)),
        st.one_of(st.none(), st.integers(0, 2**32 - 1).map(str)),
        st.one_of(st.none(), st.sampled_from(["10.0.0.1", "::1", "192.168.0.0/16"])),
    ),
    min_size=2,
    max_size=20,
)


def _stream(rows: list[tuple[str | None, ...]], fast: bool) -> tuple[bytes, int]:
    out: list[bytes] = []
    decoder = PgOutputDecoder()
    encoder = JsonlEncoder(out.append)
    fi = FastRows(encoder, decoder, out.append) if fast else None
    taken = 0
    encoder.feed(ev.Begin(final_lsn=0x16B3748, commit_time=0, xid=777))
    encoder.feed(decoder.decode(_relation_msg(_XTYPES), 0))
    for i, row in enumerate(rows):
        msg = _insert_msg(_XTYPES.oid, row)
        lsn = 0x16B3000 + i
        if fi is not None and fi.row(msg, lsn):
            taken += 1
            continue
        encoder.feed(decoder.decode(msg, lsn))
    return b"".join(out), taken


@given(rows)
def test_fast_inserts_cover_xid_cid_and_text_types_byte_for_byte(rows: list[tuple[str | None, ...]]) -> None:
    reference, _ = _stream(rows, fast=False)
    fast, taken = _stream(rows, fast=True)
    assert fast == reference
    assert taken == len(rows)  # the relation record is written: every row can take the fast path
    assert compile_row(_XTYPES) is not None


@given(rows)
def test_snapshot_blocks_cover_the_same_kinds(rows: list[tuple[str | None, ...]]) -> None:
    block = b"".join(b"\t".join(b"\\N" if v is None else v.encode() for v in row) + b"\n" for row in rows)
    encoded = BlockEncoder(_XTYPES, 0x16B3748).encode(block)
    assert encoded is not None
    out: list[bytes] = []
    JsonlEncoder(out.append).snapshot_rows(_XTYPES, rows, 0x16B3748)
    assert encoded == (b"".join(out[1:]), len(rows))  # out[0] is the relation record


_VALUES = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(),
    st.lists(st.text(), max_size=3),
    st.dictionaries(st.text(), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text()), max_size=3),
)


@given(st.dictionaries(st.text().filter(lambda k: k != "v"), _VALUES, max_size=6))
def test_record_pieces_put_around_values_give_what_orjson_writes(record: dict[str, object]) -> None:
    """spark-apply's carried-over records are these pieces around each value's JSON text."""
    names = list(record)
    pieces = record_pieces(names)
    assert len(pieces) == len(names) + 1
    values = [orjson.dumps(record[n]).decode() for n in names]
    line = pieces[0] + "".join(v + after for v, after in zip(values, pieces[1:], strict=True))
    assert line == orjson.dumps({"v": FORMAT_VERSION, **record}).decode()
