"""The JSONL format's one source: its version, each column type's JSON kind, and record layouts.

Three encoders write row records and must stay byte-identical: the reference
(:class:`pgrecv.output.jsonl.JsonlEncoder`, dicts through orjson), the streaming fast path for inserts
(:mod:`pgrecv.output.fastpath`) and the snapshot's block encoder (:mod:`pgrecv.snapshot.fast`, and its C
half in ``_copyfast.c``). The byte-splicing ones take from here what they splice: which kind of JSON a
column's text becomes (:func:`column_kind`) and the bytes around a row image, cut out of the very
record the reference writes (:func:`image_splice`), so a field added to a record reaches them all.
"""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import Any, Final

import orjson

from pgrecv.output.values import (
    BinaryConverter,
    TextConverter,
    binary_converter,
    bool_from_text,
    int_from_text,
    text_converter,
)

FORMAT_VERSION: Final = 1


class Kind(IntEnum):
    """How the text PostgreSQL sends for a value becomes JSON. The numbers are ``_copyfast.c``'s.

    Every kind from OTHER on has a converter of :mod:`pgrecv.output.values` (the reference); the native
    encoder does FLOAT, JSON, BYTEA and ARRAY itself and calls the converter for OTHER.
    """

    RAW = 0  # already a JSON number: the decimal text of an integer type
    QUOTE = 1  # a JSON string once quoted: ASCII that never holds '"', '\\' or a control byte
    BOOL = 2  # t / f
    TEXT = 3  # any string: escaped as JSON strings are
    OTHER = 4  # only the converter of pgrecv.output.values knows (a user-defined array, ...)
    FLOAT = 5  # real, double precision: a JSON number, or the text of NaN/Infinity as a string
    JSON = 6  # json, jsonb: the document embedded, a JSON null document singled out
    BYTEA = 7  # bytea: base64 of the bytes
    ARRAY = 8  # an array of a built-in type: nested lists of its elements' kind
    # FLOAT where the server is known to write float8 as its shortest exact text (PostgreSQL 12+):
    # the C encoder then reformats 16 and 17 digits too instead of calling float(). Never a column's
    # kind by itself: :func:`native_kinds` puts it in for a server of that kind.
    SHORTEST = 9


# numeric, date, time, timestamp, timestamptz, timetz, interval, uuid, pg_lsn: their output
# functions write ASCII digits, signs, letters, ':', '-', '.', '+' and spaces only.
QUOTE_OIDS: Final = frozenset({1700, 1082, 1083, 1114, 1184, 1266, 1186, 2950, 3220})


# A scalar kind, by the converter the reference gives one built-in type of that kind.
_BY_CONVERTER: Final = {
    id(text_converter(oid, "")): kind for oid, kind in ((701, Kind.FLOAT), (3802, Kind.JSON), (17, Kind.BYTEA))
}


def column_kind(type_oid: int, type_name: str) -> tuple[Kind, TextConverter | None]:
    """The column's kind, and from :attr:`Kind.OTHER` on the converter the reference uses.

    Derived from :func:`pgrecv.output.values.text_converter`, so no second table of types can drift
    from the reference: a type the reference keeps as text is TEXT (or QUOTE where its output is
    known to need no escaping), one it parses with ``int_from_text`` is RAW, one it parses with the same
    converter as ``float8`` is FLOAT, and so on; an array is ARRAY when :func:`array_element`
    knows its elements.
    """
    conv = text_converter(type_oid, type_name)
    if conv is None:
        return (Kind.QUOTE if type_oid in QUOTE_OIDS else Kind.TEXT), None
    if conv is int_from_text:
        return Kind.RAW, None
    if conv is bool_from_text:
        return Kind.BOOL, None
    kind = _BY_CONVERTER.get(id(conv))
    if kind is not None:
        return kind, conv
    if _array_parts(conv) is not None:
        return Kind.ARRAY, conv
    return Kind.OTHER, conv


def native_kinds(kinds: list[Kind], server_major: int | None) -> list[Kind]:
    """``kinds`` as the C encoder takes them from a server of ``server_major`` (None: unknown):
    FLOAT becomes SHORTEST from PostgreSQL 12 on, whose float8out writes 16 or 17 digits only as
    the double's shortest exact text (with extra_float_digits <= 0 it writes 15 at most)."""
    if server_major is None or server_major < 12:
        return kinds
    return [Kind.SHORTEST if k == Kind.FLOAT else k for k in kinds]


def _array_parts(conv: TextConverter) -> tuple[Kind, str] | None:
    """(element kind, delimiter) of an array converter of :mod:`pgrecv.output.values`: read from the
    converter's own closure (``parse_array(text, conv, delimiter)``), so they cannot drift."""
    code = getattr(conv, "__code__", None)
    cells = getattr(conv, "__closure__", None)
    if code is None or not cells or getattr(conv, "__qualname__", "") != "_text_array.<locals>.convert":
        return None
    bound = dict(zip(code.co_freevars, (c.cell_contents for c in cells), strict=True))
    elem, delim = bound.get("conv"), bound.get("delimiter")
    if not isinstance(delim, str) or len(delim) != 1 or not delim.isascii() or delim in '{}"\\':
        return None
    if elem is None:
        return Kind.TEXT, delim
    for kind in (Kind.RAW, Kind.BOOL):
        if elem is (int_from_text if kind is Kind.RAW else bool_from_text):
            return kind, delim
    scalar = _BY_CONVERTER.get(id(elem))
    return (scalar, delim) if scalar is not None else None


def array_element(type_oid: int, type_name: str) -> tuple[Kind, str] | None:
    """For an ARRAY column: its elements' kind (RAW, BOOL, TEXT, FLOAT, JSON or BYTEA) and the
    delimiter between them; else None."""
    conv = text_converter(type_oid, type_name)
    return None if conv is None else _array_parts(conv)


class BinaryKind(IntEnum):
    """How the native encoder reads a value sent in binary (pgoutput's ``binary`` option); the
    numbers are ``_copyfast.c``'s. PY: the converter of :func:`pgrecv.output.values.binary_converter`."""

    PY = 0
    INT2 = 1
    INT4 = 2
    INT8 = 3
    UINT4 = 4
    UINT8 = 5
    BOOL = 6
    FLOAT8 = 7
    UTF8 = 8
    BYTEA = 9
    JSON = 10
    JSONB = 11
    UUID = 12


# One built-in type per binary kind: a column is of that kind when the reference reads it with
# the very converter it reads that type with (so unknown types, read as bytea is, are BYTEA).
_BINARY_PROTOTYPES: Final = (
    (21, BinaryKind.INT2),
    (23, BinaryKind.INT4),
    (20, BinaryKind.INT8),
    (26, BinaryKind.UINT4),
    (5069, BinaryKind.UINT8),
    (16, BinaryKind.BOOL),
    (701, BinaryKind.FLOAT8),
    (25, BinaryKind.UTF8),
    (17, BinaryKind.BYTEA),
    (114, BinaryKind.JSON),
    (3802, BinaryKind.JSONB),
    (2950, BinaryKind.UUID),
)


def binary_kind(type_oid: int) -> tuple[BinaryKind, BinaryConverter]:
    """The column's binary kind and the converter the reference uses for its binary values."""
    conv = binary_converter(type_oid)
    for oid, kind in _BINARY_PROTOTYPES:
        if binary_converter(oid) is conv:
            return kind, conv
    return BinaryKind.PY, conv


# --- record layouts -----------------------------------------------------------------------------


def row_record(
    op: str,
    schema: str,
    table: str,
    xid: int | None,
    commit_lsn: str | None,
    lsn: str | None,
    commit_time: str | None,
    key: list[str],
) -> dict[str, Any]:
    """The fields every insert/update/delete record starts with, in the format's order; the
    image fields (``new``, ``unchanged_toast``, ...) follow."""
    return {
        "v": FORMAT_VERSION,
        "op": op,
        "schema": schema,
        "table": table,
        "xid": xid,
        "commit_lsn": commit_lsn,
        "lsn": lsn,
        "commit_time": commit_time,
        "key": key,
    }


def snapshot_record(schema: str, table: str, snapshot_lsn: str, key: list[str]) -> dict[str, Any]:
    """The fields a ``snapshot`` record starts with; ``new`` and ``unchanged_toast`` follow."""
    return {
        "v": FORMAT_VERSION,
        "op": "snapshot",
        "schema": schema,
        "table": table,
        "snapshot_lsn": snapshot_lsn,
        "key": key,
    }


_NEW: Final = b',"new":{'
# After a new image's last column when no column is an unchanged TOAST value: the record's end.
IMAGE_TAIL: Final = b"}," + orjson.dumps({"unchanged_toast": []})[1:] + b"\n"


def image_splice(record: dict[str, Any]) -> tuple[bytes, bytes]:
    """(the bytes before a new image's first column, after its last) for ``record``: a line is
    ``head + '"col":value,...' + tail``, exactly what orjson writes for the record with that
    image and no unchanged TOAST column."""
    return orjson.dumps(record)[:-1] + _NEW, IMAGE_TAIL


# The fields after a row record's head, as the native encoder writes them (pgrecv/output/jsonl.py's order).
IMAGE_FIELDS: Final = tuple(
    b"," + orjson.dumps({name: None})[1:-5]
    for name in (
        "new",
        "unchanged_toast",
        "toast_from_old",
        "json_nulls",
        "old",
        "old_kind",
        "old_unchanged_toast",
        "old_json_nulls",
    )
)
OLD_KINDS: Final = (orjson.dumps("key"), orjson.dumps("full"))


def column_keys(names: list[str] | tuple[str, ...]) -> list[bytes]:
    """``"name":`` for each column, the first without a leading comma: an image is these keys
    each followed by its value."""
    return [(b"," if i else b"") + orjson.dumps(name) + b":" for i, name in enumerate(names)]


# --- the fields a replay reads ------------------------------------------------------------------


class FieldKind(Enum):
    """What JSON a record field holds, for readers and writers that take records field by field."""

    INT = "int"  # a JSON integer
    TEXT = "text"  # a JSON string
    LSN = "lsn"  # a JSON string: an LSN as pg_lsn prints it ("16/B374D848")
    IMAGE = "image"  # a row image: a JSON object of column name → value
    NAMES = "names"  # a list of column names
    TABLES = "tables"  # a truncate's tables: a list of {"schema", "table"}
    COLUMNS = "columns"  # a relation's columns: a list of {"name", "type", "type_oid", "typmod", "key"}


# Every field a consumer that replays changes into tables reads (spark-apply's envelope), with its
# kind; the other fields (old_kind, end_lsn, messages' ...) are for people and other consumers.
REPLAY_FIELDS: Final[tuple[tuple[str, FieldKind], ...]] = (
    ("v", FieldKind.INT),
    ("op", FieldKind.TEXT),
    ("schema", FieldKind.TEXT),
    ("table", FieldKind.TEXT),
    ("xid", FieldKind.INT),
    ("subxid", FieldKind.INT),
    ("commit_lsn", FieldKind.LSN),
    ("lsn", FieldKind.LSN),
    ("commit_time", FieldKind.TEXT),
    ("gid", FieldKind.TEXT),
    ("snapshot_lsn", FieldKind.LSN),
    ("new", FieldKind.IMAGE),
    ("old", FieldKind.IMAGE),
    ("unchanged_toast", FieldKind.NAMES),
    ("old_unchanged_toast", FieldKind.NAMES),
    ("json_nulls", FieldKind.NAMES),
    ("old_json_nulls", FieldKind.NAMES),
    ("tables", FieldKind.TABLES),
    ("replica_identity", FieldKind.TEXT),
    ("key", FieldKind.NAMES),
    ("columns", FieldKind.COLUMNS),
)


def record_pieces(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The text around the values of a record of ``v`` and then ``names``, as orjson writes it:
    the line is ``pieces[0] + value_0 + pieces[1] + ... + value_n-1 + pieces[n]``, each value its
    JSON text (``null`` for none). For a writer that cannot hand records to an encoder here:
    spark-apply assembles the prepared transactions it carries over in Spark SQL."""
    head = orjson.dumps({"v": FORMAT_VERSION})[:-1].decode()
    keys = [orjson.dumps(name).decode() + ":" for name in names]
    if not keys:
        return (head + "}",)
    return (head + "," + keys[0], *("," + k for k in keys[1:]), "}")
