"""A fused fast path for row changes: a pgoutput Insert, Update or Delete written as a JSONL line.

The reference path decodes the message into an event (:mod:`pgrecv.decode.pgoutput`) and encodes
that (:mod:`pgrecv.output.jsonl`); profiling showed the intermediate event, tuples and dicts to cost more
than half of a row's time on the stream's hot path. :class:`FastRows` goes from the message bytes
straight to the line the reference path would write, byte for byte, with the record's bytes
around the images cut from the reference's own layout (:mod:`pgrecv.output.format`):

* with the C extension (:mod:`pgrecv.native`), ``encode_row`` does inserts, updates and deletes,
  old images (key or full), unchanged TOAST values (an update's taken from its old image where
  that holds them, as :func:`pgrecv.events.fill_from_old` does for the reference), text and binary
  values of every kind; a value of a type it has no encoder for goes to the reference's converter
  for that column alone;
* without it, a function generated per relation does inserts of relations whose columns all are
  of the RAW, QUOTE, BOOL and TEXT kinds (:func:`compile_row`).

It is only an accelerator: anything it does not handle (a streamed chunk, a prepared
transaction, a relation the encoder has not written a relation record for yet, malformed bytes, a
value no converter accepts) returns False and the caller takes the reference path, which also
produces every error. Tests compare both paths on real captures, generated and garbled messages.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson

from pgrecv.decode.kinds import INSERT
from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.events import Relation
from pgrecv.native import copyfast
from pgrecv.output.format import (
    IMAGE_FIELDS,
    IMAGE_TAIL,
    OLD_KINDS,
    Kind,
    array_element,
    binary_kind,
    column_keys,
    column_kind,
    native_kinds,
    row_record,
)
from pgrecv.output.jsonl import JsonlEncoder
from pgrecv.output.values import JSON_NULL, text_converter

_U32: Final = struct.Struct(">I").unpack_from
_U16: Final = struct.Struct(">H").unpack_from
# A row's lsn is spliced in per message: the record's head is cut around it.
_LSN_NULL: Final = b'"lsn":null'
_LSN_KEY: Final = b'"lsn":'
_NEW: Final = IMAGE_FIELDS[0] + b"{"  # after an insert's head: where compile_row's image starts
_ROW_TYPES: Final = frozenset(b"IUD")
# int() gives these texts back unchanged (no sign +, leading zero, "-0", "_" or space); orjson
# writes integers up to 64 bits. Printable ASCII but '"' and '\\' is a JSON string once quoted.
_INT_SHAPE: Final = re.compile(rb"(?:0|-?[1-9][0-9]{0,19})").fullmatch


def _int_text(v: bytes) -> bool:
    return _INT_SHAPE(v) is not None and (len(v) < 19 or -(2**63) <= int(v) <= 2**64 - 1)


_PLAIN_TEXT: Final = re.compile(rb"[ !#-\[\]-~]*").fullmatch

RowFn = Callable[[Any, int, bytes, bytes], bytes | None]


def compile_row(relation: Relation) -> RowFn | None:
    """The generated function for ``relation``, or None when a column type is not covered."""
    kinds = [column_kind(c.type_oid, c.type_name)[0] for c in relation.columns]
    if any(k > Kind.TEXT for k in kinds):
        return None
    n = len(kinds)
    lines = [
        "def row(data, lsn, head, mid):",
        f"    if data[5] != 78 or U16(data, 6)[0] != {n}:",
        "        return None",
    ]
    lines.append("    pos = 8")
    parts: list[str] = ["head", "(b'\"%X/%X\"' % (lsn >> 32, lsn & 0xFFFFFFFF) if lsn else b'null')", "mid"]
    ns: dict[str, Any] = {"U16": _U16, "U32": _U32, "dumps": orjson.dumps, "INT": _int_text, "PLAIN": _PLAIN_TEXT}
    keys = column_keys([c.name for c in relation.columns])
    for i, kind in enumerate(kinds):
        ns[f"K{i}"] = keys[i]
        parts += [f"K{i}", f"v{i}"]
        # Only texts the reference's converter turns into the same bytes; anything else declines.
        if kind == Kind.RAW:
            value = [f"        v{i} = data[s:pos]", f"        if not INT(v{i}):", "            return None"]
        elif kind == Kind.BOOL:
            value = [
                f"        v{i} = BOOL.get(data[s:pos])",
                f"        if v{i} is None:",
                "            return None",
            ]
            ns["BOOL"] = {b"t": b"true", b"f": b"false"}
        elif kind == Kind.QUOTE:
            value = [
                f"        v{i} = data[s:pos]",
                f"        if not PLAIN(v{i}):",
                "            return None",
                f"        v{i} = b'\"' + v{i} + b'\"'",
            ]
        else:
            value = [f"        v{i} = dumps(str(data[s:pos], 'utf-8'))"]
        lines += [
            "    k = data[pos]",
            "    if k == 116:",
            "        s = pos + 5",
            "        pos = s + U32(data, pos + 1)[0]",
            *value,
            "    elif k == 110:",
            "        pos += 1",
            f"        v{i} = b'null'",
            "    else:",
            "        return None",
        ]
    lines += ["    if pos != len(data):", "        return None", f"    return b''.join(({', '.join(parts)}, TAIL))"]
    ns["TAIL"] = IMAGE_TAIL
    exec(compile("\n".join(lines), f"<pgrecv fast insert {relation.namespace}.{relation.name}>", "exec"), ns)
    fn: RowFn = ns["row"]
    return fn


_OPS: Final = ("insert", "update", "delete")


def make_plan(relation: Relation, server_major: int | None = None) -> Any:
    """The C encoder's plan for ``relation`` (its columns' kinds, names and the reference's
    converters), or None when there is no C encoder or two columns share a name. ``server_major``:
    see :func:`pgrecv.output.format.native_kinds`."""
    if copyfast is None:
        return None
    cols = relation.columns
    names = [c.name for c in cols]
    if len(set(names)) != len(names):  # one dict key in the reference: not worth mimicking
        return None
    kinds = [column_kind(c.type_oid, c.type_name)[0] for c in cols]
    elems = [
        array_element(c.type_oid, c.type_name) if k == Kind.ARRAY else None for c, k in zip(cols, kinds, strict=True)
    ]
    binary = [binary_kind(c.type_oid) for c in cols]
    return copyfast.make_plan(
        bytes(native_kinds(kinds, server_major)),
        bytes(native_kinds([e[0] if e else Kind.RAW for e in elems], server_major)),
        "".join(e[1] if e else "," for e in elems).encode(),
        bytes(b[0] for b in binary),
        bytes(1 if c.key else 0 for c in cols),
        tuple(orjson.dumps(name) for name in names),
        tuple(text_converter(c.type_oid, c.type_name) for c in cols),
        tuple(b[1] for b in binary),
        IMAGE_FIELDS,
        OLD_KINDS,
        orjson.dumps,
        JSON_NULL,
    )


def _heads(rel: Relation, ctx: tuple[int | None, str | None, str | None, str | None]) -> tuple[bytes, ...]:
    """For insert, update and delete records in context ``ctx``: the bytes before the row's lsn
    and after it (up to the images), cut from the reference's record."""
    xid, commit_lsn, commit_time, _ = ctx
    out: list[bytes] = []
    for op in _OPS:
        record = row_record(op, rel.namespace, rel.name, xid, commit_lsn, None, commit_time, list(rel.key_names))
        head = orjson.dumps(record)[:-1]
        before, found, after = head.partition(_LSN_NULL)
        assert found, "row_record has an lsn field"
        out += [before + _LSN_KEY, after]
    return tuple(out)


class FastRows:
    """Writes pgoutput row changes through the C encoder (or generated functions); see the module
    docstring.

    It reads the decoder's live relation cache (OID to the latest Relation). A relation is used
    here only once the encoder has written its relation record (:meth:`JsonlEncoder.announced`),
    and only while it is still the latest Relation for its OID.
    """

    def __init__(self, encoder: JsonlEncoder, decoder: PgOutputDecoder, write: Callable[[bytes], Any]) -> None:
        self._encoder = encoder
        self._decoder = decoder
        self._relations: Mapping[int, Relation] = decoder.relations
        self._write = write
        self._native = copyfast is not None
        # pgoutput's protocol 2 needs PostgreSQL 14: a server whose float texts the C encoder may
        # take as they are (native_kinds); under protocol 1 the server may be older, so it does not.
        self._major = 14 if decoder.proto_version >= 2 else None
        # OID -> (relation, C plan or generated function, [context, heads, (plan, heads)])
        self._ready: dict[int, tuple[Relation, Any, list[Any]]] = {}
        self._refused: dict[int, Relation] = {}  # relations with no fast path, by id()
        self.plans: dict[int, tuple[Any, tuple[bytes, ...]]] = {}
        """OID -> (C plan, heads) of the relations whose rows :attr:`row` wrote natively in the
        transaction under way: what ``copyfast.pump`` may write without asking :attr:`row`. Valid
        only until the next message that is not a row change (a Begin changes the heads, a
        Relation the plan, a Stream Start the layout): the streamer empties it then."""

        self.row: Callable[[Any, int], bool] = self._row_function()
        """``row(message, lsn)``: write the row change in ``message`` (a whole pgoutput message)
        if this path can; else False."""

    def _row_function(self) -> Callable[[Any, int], bool]:
        """:attr:`row`, a closure over everything it reads: it runs once per message."""
        decoder, encoder, ready, relations, write, plans = (
            self._decoder,
            self._encoder,
            self._ready,
            self._relations,
            self._write,
            self.plans,
        )
        prepare, unpack = self._prepare, _U32
        encode_row = copyfast.encode_row if copyfast is not None else None

        def row(data: Any, lsn: int) -> bool:
            if decoder.in_stream:  # an xid prefix moves every field
                return False
            try:
                oid = unpack(data, 1)[0]
            except struct.error:
                return False
            entry = ready.get(oid)
            if entry is None or relations.get(oid) is not entry[0]:
                if data[0] not in _ROW_TYPES:
                    return False
                entry = prepare(oid)
                if entry is None:
                    return False
            rel, plan, cache = entry
            ctx = encoder.context
            if ctx is not cache[0]:
                if ctx[3] is not None:  # rows of a prepared transaction carry more fields
                    return False
                cache[0] = ctx
                cache[1] = _heads(rel, ctx)
                cache[2] = (plan, cache[1])  # this transaction's entry of ``plans``
            if encode_row is not None:
                line = encode_row(data, lsn, plan, cache[1])
                if line is not None:
                    plans[oid] = cache[2]
            elif data[0] == INSERT:
                try:
                    line = plan(data, lsn, cache[1][0], cache[1][1] + _NEW)
                except (IndexError, struct.error, UnicodeDecodeError, TypeError, ValueError):
                    return False  # the reference path reports what is wrong
            else:
                return False
            if line is None:
                return False
            write(line)
            return True

        return row

    def _prepare(self, oid: int) -> tuple[Relation, Any, list[Any]] | None:
        self._ready.pop(oid, None)
        rel = self._relations.get(oid)
        if rel is None or id(rel) in self._refused or not self._encoder.announced(rel):
            return None
        plan = make_plan(rel, self._major) if self._native else compile_row(rel)
        if plan is None:
            self._refused[id(rel)] = rel
            return None
        entry = self._ready[oid] = (rel, plan, [None, (), None])
        return entry
