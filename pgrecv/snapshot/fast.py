"""The snapshot's hot path: COPY text blocks straight to snapshot JSON lines, in bulk.

The reference path (``copy_task_reference`` in :mod:`pgrecv.snapshot.core`) lets psycopg parse every
COPY row into a tuple of str and encodes it with :meth:`pgrecv.output.jsonl.JsonlEncoder.snapshot_rows`:
several µs of Python per row (bench/snapshot.py). Here the COPY stream is read as raw CopyData through libpq
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

Where the C module :mod:`pgrecv._copyfast` is built (``pip install`` compiles it; it is optional),
it takes the two loops that still cost per row: reading (one ``PQgetCopyData`` per row, in C,
without the GIL) and encoding blocks whose columns all are of the kinds above or floats,
json/jsonb, bytea and arrays of built-in types (the value encoders the stream's row encoder uses),
without the GIL unless a float needs Python's float formatting. :mod:`pgrecv.native` decides
whether the C module is used (``PGRECV_NO_NATIVE=1`` turns it off). That roughly halves the
client's CPU per row, which matters because the client shares the machine with the server's
COPY. It declines to the Python code what it does not do, so the output is the same with and
without it (tested both ways).

The text of a value is exactly what psycopg would give: its COPY unescaping handles the escapes
PostgreSQL's COPY TO writes (``\\b \\f \\n \\r \\t \\v \\\\``) and leaves any other backslash as
it is, and so does :func:`unescape`. It assumes UTF-8 (the caller checks the client encoding).
"""

from __future__ import annotations

import re
import select
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Final

import orjson
import psycopg
from psycopg import pq

from pgrecv import events as ev
from pgrecv.errors import DecodeError
from pgrecv.lsn import lsn_str
from pgrecv.native import copyfast as _copyfast
from pgrecv.native import pgconn_address
from pgrecv.output.format import (
    Kind,
    array_element,
    column_keys,
    column_kind,
    image_splice,
    native_kinds,
    snapshot_record,
)
from pgrecv.output.values import JSON_NULL

_NULL: Final = b"\\N"
_ESC_RE: Final = re.compile(rb"\\[btnvfr\\]")
_ESC: Final[dict[bytes, bytes]] = {
    b"\\b": b"\b", b"\\t": b"\t", b"\\n": b"\n", b"\\v": b"\v", b"\\f": b"\f", b"\\r": b"\r", b"\\\\": b"\\",
}  # fmt: skip
_BOOL: Final[dict[bytes, bytes]] = {b"t": b"true", b"f": b"false", _NULL: b"null"}
# Bytes that a JSON string holds as they are (orjson escapes only '"', '\\' and controls < 0x20):
# a text column whose bytes all are such (and valid UTF-8, as the server sends) is just quoted.
_PLAIN: Final = bytes(b for b in range(256) if b >= 0x20 and b not in b'"\\')
Buffer = bytes | memoryview
RAW, QUOTE, BOOL, TEXT, OTHER = Kind.RAW, Kind.QUOTE, Kind.BOOL, Kind.TEXT, Kind.OTHER
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


def _text(v: bytes) -> bytes:
    if v == _NULL:
        return b"null"
    return orjson.dumps(str(unescape(v), "utf-8"))


class BlockEncoder:
    """Encodes blocks of one relation's COPY text lines as snapshot records; see the module doc.

    :meth:`write_to`, for a relation with no column of the OTHER kind, first tries the C encoder
    of :mod:`pgrecv._copyfast`, which declines a block it cannot do exactly (a malformed line, a
    text that is not UTF-8, a JSON null document, a value only the Python converter reads) to
    :meth:`encode`, the Python path. ``server_major`` (the server's major version, when known)
    lets the C encoder take more of the floats itself (:func:`pgrecv.output.format.native_kinds`).
    """

    def __init__(self, relation: ev.Relation, snapshot_lsn: int, server_major: int | None = None) -> None:
        self._n = len(relation.columns)
        kinds = [column_kind(c.type_oid, c.type_name) for c in relation.columns]
        self._kinds = [k for k, _ in kinds]
        self._convs = [c for _, c in kinds]
        record = snapshot_record(relation.namespace, relation.name, lsn_str(snapshot_lsn), list(relation.key_names))
        self._head, self._tail = image_splice(record)
        self._keys = column_keys([c.name for c in relation.columns])
        self._formats: dict[tuple[bool, ...], tuple[bytes, list[bytes], bytes]] = {}
        self._out = bytearray()  # the C encoder's output, reused for every block
        self._native: Callable[[bytes], tuple[int, int] | None] | None = None
        if self._n and OTHER not in self._kinds and _copyfast is not None:
            elems = [array_element(c.type_oid, c.type_name) for c in relation.columns]
            kinds_c = native_kinds(self._kinds, server_major)
            elems_c = native_kinds(
                [e[0] if e and k == Kind.ARRAY else RAW for e, k in zip(elems, self._kinds, strict=True)], server_major
            )
            kind_bytes, keys, encode = bytes(kinds_c), tuple(self._keys), _copyfast.encode
            elem_bytes = bytes(elems_c)
            delims = "".join(e[1] if e and k == Kind.ARRAY else "," for e, k in zip(elems, self._kinds, strict=True))
            head, tail, out, delim_bytes = self._head, self._tail, self._out, delims.encode()
            self._native = lambda block: encode(block, out, kind_bytes, elem_bytes, delim_bytes, head, keys, tail)

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

    def write_to(self, block: bytes, write: Callable[[Buffer], object]) -> int | None:
        """Writes the JSON lines of ``block`` (whole COPY lines) with ``write``; returns the row
        count, or None having written nothing: the caller takes the reference path.

        ``write`` must not keep what it is given: a view of a buffer that the next block reuses.
        """
        if self._native is not None and (native := self._native(block)) is not None:
            nbytes, rows = native
            with memoryview(self._out) as view:
                write(view[:nbytes])
            return rows
        done = self.encode(block)
        if done is None:
            return None
        write(done[0])
        return done[1]

    def encode(self, block: bytes) -> tuple[bytes, int] | None:
        """(the JSON lines, the row count) of ``block`` (whole COPY lines) in Python, or None: use
        the reference."""
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
    conn: psycopg.Connection[Any],
    check: Callable[[], None] = lambda: None,
    size: int | None = None,
    native: bool = True,
) -> Iterator[bytes]:
    """The rows of the COPY TO in progress on ``conn`` as blocks of whole lines (bytes).

    Reads CopyData messages (one row each) through libpq directly: in C without the GIL when
    :mod:`pgrecv._copyfast` is built and bound to psycopg's libpq (:func:`native_reader`), else one
    ``get_copy_data`` call per row from Python, appending to one buffer (a fraction of the cost of
    psycopg's per-row generator, but still about half of the snapshot's CPU). A block holds about
    ``size`` bytes (default BLOCK_BYTES). The last block comes after the COPY's final result, so
    that leaving the loop on it never finds libpq between the CopyDone and the result (psycopg's
    ``copy()`` exit would cancel a COPY no longer there, and log two warnings onto pgrecv's
    error); raises the server's error as psycopg does. ``check`` runs at each wait (at most every second).
    """
    size = BLOCK_BYTES if size is None else size
    pgconn = conn.pgconn
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN)

    def wait() -> None:
        while not poller.poll(1000):
            check()
        pgconn.consume_input()

    read = native_reader(conn) if native else None
    if read is not None:
        parts: list[bytes] = []
        have = 0
        while True:
            status, data = read(size - have)
            if data:
                parts.append(data)
                have += len(data)
                if have >= size and status >= 0:  # with the COPY's end, the rows wait for its result
                    yield parts[0] if len(parts) == 1 else b"".join(parts)
                    parts, have = [], 0
            if status == 0:
                wait()
            elif status < 0:
                break
        last = b"".join(parts)
    else:
        get = pgconn.get_copy_data
        buf = bytearray()
        while True:
            status, row = get(1)
            if status > 0:
                buf += row
                continue
            if status < 0:
                break
            if len(buf) >= size:
                yield bytes(buf)
                buf.clear()
            wait()
        last = bytes(buf)
    if status == -2:
        raise psycopg.OperationalError(pgconn.get_error_message())
    while pgconn.is_busy():
        wait()
    error: psycopg.Error | None = None
    while (res := pgconn.get_result()) is not None:
        if res.status != pq.ExecStatus.COMMAND_OK and error is None:
            error = psycopg.errors.error_from_result(res, encoding=conn.info.encoding)
    if error is not None:
        raise error
    if last:  # only now: a consumer that fails on it leaves a connection with no COPY half-ended
        yield last


def native_reader(conn: psycopg.Connection[Any]) -> Callable[[int], tuple[int, bytes]] | None:
    """``pgrecv._copyfast.read`` bound to ``conn`` (it takes the byte limit) if it can serve
    ``conn`` (:func:`pgrecv.native.pgconn_address`), else None (the Python loop is used)."""
    ptr = pgconn_address(conn.pgconn)
    return None if ptr is None or _copyfast is None else partial(_copyfast.read, ptr)
