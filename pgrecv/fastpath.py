"""A fused fast path for the commonest record: a pgoutput Insert written as a JSONL line.

The reference path decodes the message into an :class:`~pgrecv.events.Insert`
(:mod:`pgrecv.decode.pgoutput`) and encodes that (:mod:`pgrecv.jsonl`). For a relation whose columns
all have a kind other than OTHER in :mod:`pgrecv.jsonl_format`'s table, this module generates one
function per relation that goes from the message bytes straight to the line the reference path
would write, byte for byte, with the record's bytes around the image cut from the reference's own
layout: integers are already valid JSON in their text form, numeric, date/time, uuid and similar
texts need only quotes, and only text columns go through orjson. Profiling showed the
intermediate event, tuple and dicts to cost more than half of a row's time on the stream's hot path.

It is only an accelerator: anything it does not handle (another type, NULL-free checks failing,
unchanged TOAST, binary values, a streamed chunk, a prepared transaction, a relation the encoder
has not written a relation record for yet, malformed bytes) returns False and the caller takes the
reference path, which also produces every error. Tests compare both paths on real captures.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson

from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.events import Insert, Relation
from pgrecv.jsonl import JsonlEncoder
from pgrecv.jsonl_format import IMAGE_TAIL, Kind, column_keys, column_kind, image_splice, row_record

_U32: Final = struct.Struct(">I").unpack_from
_U16: Final = struct.Struct(">H").unpack_from
# A row's lsn is spliced in per message: the record's head is cut around it.
_LSN_NULL: Final = b'"lsn":null'
_LSN_KEY: Final = b'"lsn":'

RowFn = Callable[[Any, int, bytes, bytes], bytes | None]


def compile_row(relation: Relation) -> RowFn | None:
    """The generated function for ``relation``, or None when a column type is not covered."""
    kinds = [column_kind(c.type_oid, c.type_name)[0] for c in relation.columns]
    if Kind.OTHER in kinds:
        return None
    n = len(kinds)
    lines = [
        "def row(data, lsn, head, mid):",
        f"    if data[5] != 78 or U16(data, 6)[0] != {n}:",
        "        return None",
    ]
    lines.append("    pos = 8")
    parts: list[str] = ["head", "(b'\"%X/%X\"' % (lsn >> 32, lsn & 0xFFFFFFFF) if lsn else b'null')", "mid"]
    ns: dict[str, Any] = {"U16": _U16, "U32": _U32, "dumps": orjson.dumps}
    keys = column_keys([c.name for c in relation.columns])
    for i, kind in enumerate(kinds):
        ns[f"K{i}"] = keys[i]
        parts += [f"K{i}", f"v{i}"]
        if kind == Kind.RAW:
            value = "data[s:pos]"
        elif kind == Kind.BOOL:
            value = "(b'true' if data[s] == 116 else b'false')"
        elif kind == Kind.QUOTE:
            value = "b'\"' + data[s:pos] + b'\"'"
        else:
            value = "dumps(str(data[s:pos], 'utf-8'))"
        lines += [
            "    k = data[pos]",
            "    if k == 116:",
            "        s = pos + 5",
            "        pos = s + U32(data, pos + 1)[0]",
            f"        v{i} = {value}",
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


class FastInserts:
    """Writes pgoutput Inserts through generated per-relation functions; see the module docstring.

    It reads the decoder's live relation cache (OID to the latest Relation). A relation is
    used here only after :meth:`learn` saw the reference path write one of its rows with this
    encoder (so its relation record is in the output already), and only while it is still the
    latest Relation for its OID.
    """

    def __init__(self, encoder: JsonlEncoder, decoder: PgOutputDecoder, write: Callable[[bytes], Any]) -> None:
        self._encoder = encoder
        self._decoder = decoder
        self._relations: Mapping[int, Relation] = decoder.relations
        self._write = write
        self._ready: dict[int, tuple[Relation, RowFn, list[Any]]] = {}
        self._refused: dict[int, Relation] = {}  # relations with a column type not covered, by id()

    def insert(self, data: Any, lsn: int) -> bool:
        """Write the Insert in ``data`` (a whole pgoutput message) if this path can; else False."""
        if self._decoder.in_stream:  # an xid prefix moves every field
            return False
        oid = _U32(data, 1)[0]
        entry = self._ready.get(oid)
        if entry is None:
            return False
        rel, fn, cache = entry
        if self._relations.get(oid) is not rel:
            del self._ready[oid]
            return False
        ctx = self._encoder.context
        if ctx is not cache[0]:
            xid, commit_lsn, commit_time, gid = ctx
            if gid is not None:  # rows of a prepared transaction carry more fields
                return False
            cache[0] = ctx
            record = row_record(
                "insert", rel.namespace, rel.name, xid, commit_lsn, None, commit_time, list(rel.key_names)
            )
            head, _ = image_splice(record)
            before, found, after = head.partition(_LSN_NULL)
            assert found, "row_record has an lsn field"
            cache[1], cache[2] = before + _LSN_KEY, after
        try:
            line = fn(data, lsn, cache[1], cache[2])
        except (IndexError, struct.error, UnicodeDecodeError, TypeError, ValueError):
            return False  # the reference path reports what is wrong
        if line is None:
            return False
        self._write(line)
        return True

    def learn(self, event: Insert) -> None:
        """The reference path just wrote ``event``: its relation may use the fast path from now."""
        rel = event.relation
        if event.xid is not None or id(rel) in self._refused or self._relations.get(rel.oid) is not rel:
            return
        fn = compile_row(rel)
        if fn is None:
            self._refused[id(rel)] = rel
            return
        self._ready[rel.oid] = (rel, fn, [None, b"", b""])
