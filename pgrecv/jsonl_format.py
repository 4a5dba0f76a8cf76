"""The JSONL format's one source: its version, each column type's JSON kind, and record layouts.

Three encoders write row records and must stay byte-identical: the reference
(:class:`pgrecv.jsonl.JsonlEncoder`, dicts through orjson), the streaming fast path for inserts
(:mod:`pgrecv.fastpath`) and the snapshot's block encoder (:mod:`pgrecv.snapshot_fast`, and its C
half in ``_copyfast.c``). The byte-splicing ones take from here what they splice: which kind of JSON a
column's text becomes (:func:`column_kind`) and the bytes around a row image, cut out of the very
record the reference writes (:func:`image_splice`), so a field added to a record reaches them all.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Final

import orjson

from pgrecv.values import TextConverter, bool_from_text, text_converter

FORMAT_VERSION: Final = 1


class Kind(IntEnum):
    """How the text PostgreSQL sends for a value becomes JSON. The numbers are ``_copyfast.c``'s."""

    RAW = 0  # already a JSON number: the decimal text of an integer type
    QUOTE = 1  # a JSON string once quoted: ASCII that never holds '"', '\\' or a control byte
    BOOL = 2  # t / f
    TEXT = 3  # any string: escaped as JSON strings are
    OTHER = 4  # a converter of pgrecv.values makes the value (floats, json, arrays, bytea, ...)


# numeric, date, time, timestamp, timestamptz, timetz, interval, uuid, pg_lsn: their output
# functions write ASCII digits, signs, letters, ':', '-', '.', '+' and spaces only.
QUOTE_OIDS: Final = frozenset({1700, 1082, 1083, 1114, 1184, 1266, 1186, 2950, 3220})


def column_kind(type_oid: int, type_name: str) -> tuple[Kind, TextConverter | None]:
    """The column's kind, and for :attr:`Kind.OTHER` the converter the reference uses.

    Derived from :func:`pgrecv.values.text_converter`, so no second table of types can drift
    from the reference: a type the reference keeps as text is TEXT (or QUOTE where its output is
    known to need no escaping), one it parses with ``int`` is RAW.
    """
    conv = text_converter(type_oid, type_name)
    if conv is None:
        return (Kind.QUOTE if type_oid in QUOTE_OIDS else Kind.TEXT), None
    if conv is int:
        return Kind.RAW, None
    if conv is bool_from_text:
        return Kind.BOOL, None
    return Kind.OTHER, conv


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


def column_keys(names: list[str] | tuple[str, ...]) -> list[bytes]:
    """``"name":`` for each column, the first without a leading comma: an image is these keys
    each followed by its value."""
    return [(b"," if i else b"") + orjson.dumps(name) + b":" for i, name in enumerate(names)]
