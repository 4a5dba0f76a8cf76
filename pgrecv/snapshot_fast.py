"""The snapshot's hot path: COPY text blocks straight to snapshot JSON lines, in bulk.

The reference path (``copy_task_reference`` in :mod:`pgrecv.snapshot`) lets psycopg parse every
COPY row into a tuple of str and encodes it with :meth:`pgrecv.jsonl.JsonlEncoder.snapshot_rows`:
~3 µs of Python per row. Here the COPY stream is read as raw CopyData through libpq
(:func:`read_blocks`: one C call per row, no Python objects kept per row) and a block of many
lines becomes JSON lines with a handful of C-level operations per *column* rather than per
value (:class:`BlockEncoder`): split the block on tabs and newlines, rewrite a column's slice only
when it needs it, and join the block's fields with the bytes between them at once. Integers
are JSON as they are; numeric, date/time, uuid and pg_lsn texts only need quotes; bool t/f
becomes true/false; text needs nothing but quotes when it holds no quote, backslash or control
byte. Everything else goes value by value through the same converters as the reference, and a
block with anything unexpected (a conversion error, a JSON ``null`` document, a malformed line)
returns None, so the caller writes that block through the reference encoder, which also reports
every error. Tests prove both paths byte-identical on real servers.

The text of a value is exactly what psycopg would give: its COPY unescaping handles the escapes
PostgreSQL's COPY TO writes (``\\b \\f \\n \\r \\t \\v \\\\``) and leaves any other backslash as
it is, and so does :func:`unescape`. It assumes UTF-8 (the caller checks the client encoding).
"""

from __future__ import annotations

import re
import select
from collections.abc import Callable, Iterator
from typing import Any, Final

import orjson
import psycopg
from psycopg import pq

from pgrecv import events as ev
from pgrecv.errors import DecodeError
from pgrecv.lsn import lsn_str
from pgrecv.values import JSON_NULL, text_converter

_NULL: Final = b"\\N"
_ESC_RE: Final = re.compile(rb"\\[btnvfr\\]")
_ESC: Final[dict[bytes, bytes]] = {
    b"\\b": b"\b", b"\\t": b"\t", b"\\n": b"\n", b"\\v": b"\v", b"\\f": b"\f", b"\\r": b"\r", b"\\\\": b"\\",
}  # fmt: skip
_BOOL: Final[dict[bytes, bytes]] = {b"t": b"true", b"f": b"false", _NULL: b"null"}
# Bytes that a JSON string holds as they are (orjson escapes only '"', '\\' and controls < 0x20):
# a text column whose bytes all are such (and valid UTF-8, as the server sends) is just quoted.
_PLAIN: Final = bytes(b for b in range(256) if b >= 0x20 and b not in b'"\\')
_RAW_OIDS: Final = frozenset({20, 21, 23, 26, 28, 5069})  # int8 int2 int4 oid xid xid8: decimal text
# numeric, date, time, timestamp, timestamptz, timetz, interval, uuid, pg_lsn: ASCII without '"' or '\\'
_QUOTE_OIDS: Final = frozenset({1700, 1082, 1083, 1114, 1184, 1266, 1186, 2950, 3220})
RAW, QUOTE, BOOL, TEXT, OTHER = range(5)
BLOCK_BYTES: Final = 1 << 18  # COPY bytes per block: big enough that per-block work is noise


def _unesc_sub(m: re.Match[bytes]) -> bytes:
    return _ESC[m.group(0)]


def unescape(field: bytes) -> bytes:
    """A COPY text field's bytes without its backslash escapes (as psycopg unescapes them)."""
    return _ESC_RE.sub(_unesc_sub, field) if b"\\" in field else field


def parse_block(block: bytes) -> list[ev.Tuple]:
    """Lines of COPY text to value tuples (str or None), as psycopg's text COPY parser gives them."""
    lines = block.split(b"\n")
    if lines.pop():
        raise DecodeError("COPY data does not end with a newline; run pgrecv snapshot again")
    try:
        return [tuple(None if f == _NULL else str(unescape(f), "utf-8") for f in line.split(b"\t")) for line in lines]
    except UnicodeDecodeError as exc:
        raise DecodeError(f"COPY data is not valid UTF-8 ({exc.reason}); check the server's encoding") from None


def _kind(col: ev.Column) -> tuple[int, Callable[[str], object] | None]:
    conv = text_converter(col.type_oid, col.type_name)
    if conv is None:
        return (QUOTE if col.type_oid in _QUOTE_OIDS else TEXT), None
    if conv is int and col.type_oid in _RAW_OIDS:
        return RAW, None
    try:
        if conv("t") is True and conv("f") is False:
            return BOOL, None
    except (ValueError, TypeError):
        pass
    return OTHER, conv


def _text(v: bytes) -> bytes:
    if v == _NULL:
        return b"null"
    return orjson.dumps(str(unescape(v), "utf-8"))


class BlockEncoder:
    """Encodes blocks of one relation's COPY text lines as snapshot records; see the module doc."""

    def __init__(self, relation: ev.Relation, snapshot_lsn: int) -> None:
        self._n = len(relation.columns)
        kinds = [_kind(c) for c in relation.columns]
        self._kinds = [k for k, _ in kinds]
        self._convs = [c for _, c in kinds]
        head = orjson.dumps(
            {
                "v": 1,
                "op": "snapshot",
                "schema": relation.namespace,
                "table": relation.name,
                "snapshot_lsn": lsn_str(snapshot_lsn),
                "key": list(relation.key_names),
            }
        )
        self._head = head[:-1] + b',"new":{'
        self._keys = [(b"," if i else b"") + orjson.dumps(c.name) + b":" for i, c in enumerate(relation.columns)]
        self._tail = b'},"unchanged_toast":[]}\n'
        self._formats: dict[tuple[bool, ...], tuple[bytes, list[bytes], bytes]] = {}

    def _format(self, quoted: tuple[bool, ...]) -> tuple[bytes, list[bytes], bytes]:
        """The bytes around a block's fields: (first, the n between the fields of a row and the
        next row's first, last): one join of these and the fields makes the block's JSON lines."""
        segs = [self._head]
        for key, q in zip(self._keys, quoted, strict=True):
            segs[-1] += key + (b'"' if q else b"")
            segs.append(b'"' if q else b"")
        segs[-1] += self._tail
        fmt = self._formats[quoted] = (segs[0], [*segs[1:-1], segs[-1] + segs[0]], segs[-1])
        return fmt

    def encode(self, block: bytes) -> tuple[bytes, int] | None:
        """(the JSON lines, the row count) of ``block`` (whole COPY lines), or None: use the reference."""
        n = self._n
        if not n:
            return None
        fields = block.replace(b"\n", b"\t").split(b"\t")
        # The server escapes tabs and newlines inside values, so every line has n fields.
        if fields.pop() or len(fields) % n:
            return None
        rows = len(fields) // n
        clean = b"\\" not in block  # no escapes and no NULL anywhere
        quoted: list[bool] = []
        try:
            for j, kind in enumerate(self._kinds):
                if kind <= QUOTE and clean:  # as they are (quoted or not): not even sliced
                    quoted.append(kind == QUOTE)
                    continue
                col = fields[j::n]
                q = False
                if kind == RAW:
                    if _NULL in col:
                        fields[j::n] = [b"null" if v == _NULL else v for v in col]
                elif kind == QUOTE:
                    if _NULL not in col:
                        q = True
                    else:
                        fields[j::n] = [b"null" if v == _NULL else b'"' + v + b'"' for v in col]
                elif kind == BOOL:
                    fields[j::n] = list(map(_BOOL.__getitem__, col))
                elif kind == TEXT:
                    if b"".join(col).translate(None, _PLAIN):  # a quote, backslash or control byte
                        fields[j::n] = list(map(_text, col))
                    else:
                        q = True
                else:
                    conv = self._convs[j]
                    assert conv is not None
                    values = [None if v == _NULL else conv(str(unescape(v), "utf-8")) for v in col]
                    if JSON_NULL in values:  # the reference adds "json_nulls" to such a row
                        return None
                    fields[j::n] = list(map(orjson.dumps, values))
                quoted.append(q)
        except (KeyError, ValueError, TypeError, ArithmeticError, orjson.JSONEncodeError):
            return None  # the reference path writes the block, or reports the error
        key = tuple(quoted)
        first, between, last = self._formats.get(key) or self._format(key)
        seps = between * rows
        seps[-1] = last
        out: list[bytes] = [first] * (2 * len(fields) + 1)
        out[1::2] = fields
        out[2::2] = seps
        return b"".join(out), rows


def read_blocks(
    conn: psycopg.Connection[Any], check: Callable[[], None] = lambda: None, size: int | None = None
) -> Iterator[bytes]:
    """The rows of the COPY TO in progress on ``conn`` as blocks of whole lines (bytes).

    Reads CopyData messages (one row each) through libpq directly, appending them to one buffer:
    a fraction of the cost of psycopg's per-row generator. A block is cut when libpq's input is
    drained and it holds ``size`` bytes (default BLOCK_BYTES). Ends after the COPY's final result; raises the server's
    error as psycopg does. ``check`` runs at each wait (at most every second).
    """
    size = BLOCK_BYTES if size is None else size
    pgconn = conn.pgconn
    get = pgconn.get_copy_data
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN)
    buf = bytearray()
    while True:
        nbytes, data = get(1)
        if nbytes > 0:
            buf += data
            continue
        if nbytes < 0:
            break
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
        while not poller.poll(1000):
            check()
        pgconn.consume_input()
    if buf:
        yield bytes(buf)
    if nbytes == -2:
        raise psycopg.OperationalError(pgconn.get_error_message())
    while pgconn.is_busy():
        while not poller.poll(1000):
            check()
        pgconn.consume_input()
    error: psycopg.Error | None = None
    while (res := pgconn.get_result()) is not None:
        if res.status != pq.ExecStatus.COMMAND_OK and error is None:
            error = psycopg.errors.error_from_result(res, encoding=conn.info.encoding)
    if error is not None:
        raise error
