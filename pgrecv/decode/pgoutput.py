"""Decoder for the pgoutput plugin's binary messages, protocol versions 1 to 4.

One call, one message: :meth:`PgOutputDecoder.decode` turns the payload of an XLogData message
(or a ``data`` value of ``pg_logical_slot_peek_binary_changes``) into one :mod:`pgrecv.events`
event. The decoder is pure; its only state is what the protocol makes the client remember:

* the Relation cache (OID -> :class:`~pgrecv.events.Relation`, replaced when 'R' comes again),
  which row messages refer to by OID;
* the Type cache (OID -> :class:`~pgrecv.events.TypeInfo`) for naming user-defined column types;
* whether a streamed chunk is open (between Stream Start and Stream Stop): only there do
  Insert/Update/Delete/Truncate/Relation/Type/Message carry the transaction's xid first.

Layouts follow PostgreSQL's ``proto.c`` ("Logical Replication Message Formats"). Bytes that are
cut short, garbled or unknown raise :class:`~pgrecv.errors.DecodeError` naming the message type and
the offset; nothing else escapes (bounds are not checked field by field: the decode runs in one
``try`` that translates the low-level errors, and a final length check catches short slices and
trailing bytes).

Stream Abort: with protocol 4 and ``streaming = parallel`` the server adds the abort LSN and time.
Since a message always arrives whole, its length tells which layout it is (9 or 25 bytes), so the
decoder infers it; pass ``streaming_parallel=True``/``False`` to insist on one layout instead.

Message types are decoded whatever ``proto_version`` says (a stage before the decoder may
synthesise Begin Prepare/Prepare for a streamed two-phase transaction on any protocol); the version
only matters for the Stream Abort layout.

Column type names (:attr:`Column.type_name`): :func:`pgrecv.pg.types.type_name` for built-in
types, else ``namespace.name`` from the Type cache (just ``name`` in pg_catalog: pgoutput names a
domain by its base type), else ``""`` - unknown, which the JSONL output shows as null. Looked up
once per Relation message, never per row.

The row path (Insert/Update/Delete) is the hot path of every stream: precompiled
``Struct.unpack_from``, per-width generated tuple readers (:func:`tuple_reader`), and events built
as writable twins whose class is then switched (:func:`_drafts_work`). What a row costs, against
a plain copy of its bytes: bench/decode.py.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import Any, Final

from pgrecv.decode import kinds as K
from pgrecv.decode.kinds import BEGIN, COMMIT, DELETE, INSERT, UPDATE
from pgrecv.errors import DecodeError, UsageError
from pgrecv.events import (
    UNCHANGED,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Insert,
    Message,
    OldKind,
    Origin,
    Prepare,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Tuple,
    TypeInfo,
    Update,
    fill_from_old,
)
from pgrecv.pg.types import type_name as builtin_type_name

PROTO_VERSIONS: Final = (1, 2, 3, 4)

MESSAGE_NAMES: Final[dict[int, str]] = {
    K.BEGIN: "Begin",
    K.COMMIT: "Commit",
    K.ORIGIN: "Origin",
    K.RELATION: "Relation",
    K.TYPE: "Type",
    K.INSERT: "Insert",
    K.UPDATE: "Update",
    K.DELETE: "Delete",
    K.TRUNCATE: "Truncate",
    K.MESSAGE: "Message",
    K.STREAM_START: "Stream Start",
    K.STREAM_STOP: "Stream Stop",
    K.STREAM_COMMIT: "Stream Commit",
    K.STREAM_ABORT: "Stream Abort",
    K.BEGIN_PREPARE: "Begin Prepare",
    K.PREPARE: "Prepare",
    K.COMMIT_PREPARED: "Commit Prepared",
    K.ROLLBACK_PREPARED: "Rollback Prepared",
    K.STREAM_PREPARE: "Stream Prepare",
}

_IDENTITIES: Final[dict[int, ReplicaIdentity]] = {ord("d"): "d", ord("n"): "n", ord("f"): "f", ord("i"): "i"}

# Precompiled layouts (network byte order). Lengths are read unsigned so that a garbled length
# points past the end of the message instead of backwards.
_U32 = struct.Struct(">I").unpack_from
_U16 = struct.Struct(">H").unpack_from
_XID = _U32
_OID_MARK = struct.Struct(">IB").unpack_from  # relation OID, tuple marker
_XID_OID_MARK = struct.Struct(">IIB").unpack_from
_OID_MARK_NCOLS = struct.Struct(">IBH").unpack_from  # Insert: OID, 'N', column count
_XID_OID_MARK_NCOLS = struct.Struct(">IIBH").unpack_from
_BEGIN = struct.Struct(">QqI").unpack_from  # final LSN, commit time, xid
_COMMIT = struct.Struct(">BQQq").unpack_from  # flags, commit LSN, end LSN, commit time
_LSN = struct.Struct(">Q").unpack_from
_IDENT_NCOLS = struct.Struct(">BH").unpack_from
_TYPE_MOD = struct.Struct(">Ii").unpack_from  # type OID, typmod (signed: -1 is "none")
_NRELS_FLAGS = struct.Struct(">IB").unpack_from
_MSG_HEAD = struct.Struct(">BQ").unpack_from  # flags, message LSN
_STREAM_START = struct.Struct(">IB").unpack_from
_STREAM_COMMIT = struct.Struct(">IBQQq").unpack_from
_STREAM_ABORT = struct.Struct(">II").unpack_from
_STREAM_ABORT_PARALLEL = struct.Struct(">IIQq").unpack_from
_BEGIN_PREPARE = struct.Struct(">QQqI").unpack_from  # prepare LSN, end LSN, prepare time, xid
_PREPARE = struct.Struct(">BQQqI").unpack_from  # flags, then as Begin Prepare (also Commit Prepared)
_ROLLBACK_PREPARED = struct.Struct(">BQQqqI").unpack_from

_KEY, _OLD, _NEW = ord("K"), ord("O"), ord("N")  # tuple markers inside Update/Delete


class _InsertDraft:
    """Writable twin of :class:`Insert` (same slots): filled in, then switched to Insert."""

    __slots__ = Insert.__slots__
    relation: Relation
    new: Tuple
    xid: int | None
    lsn: int


class _UpdateDraft:
    __slots__ = Update.__slots__
    relation: Relation
    new: Tuple
    old: Tuple | None
    old_kind: OldKind
    xid: int | None
    lsn: int
    toast_from_old: tuple[str, ...]


class _DeleteDraft:
    __slots__ = Delete.__slots__
    relation: Relation
    old: Tuple | None
    old_kind: OldKind
    xid: int | None
    lsn: int


def _drafts_work() -> bool:
    """Whether row events can be built as drafts whose class is then switched.

    The frozen dataclass ``__init__`` sets each field through ``object.__setattr__``, a large part
    of the whole decode of a typical row (bench/NOTES.md). A draft with the same slots
    is filled by plain attribute stores and then becomes the event by ``__class__`` assignment,
    which CPython allows only between classes of identical layout (it raises TypeError
    otherwise). Checked once at import, field by field, so that a change of the event classes
    makes the decoder fall back to their constructors instead of building broken events.
    """
    rel = Relation(1, "s", "t", "d", ())
    samples = (
        (_InsertDraft, Insert(rel, ("a",), 2, 3)),
        (_UpdateDraft, Update(rel, ("a",), (None,), "K", 2, 3, ("b",))),
        (_DeleteDraft, Delete(rel, ("a",), "O", 2, 3)),
    )
    for draft_cls, event in samples:
        names = tuple(f.name for f in fields(event))
        if set(names) != set(draft_cls.__slots__):
            return False
        draft = _new(draft_cls)
        for name in names:
            setattr(draft, name, getattr(event, name))
        try:
            draft.__class__ = type(event)
        except TypeError:
            return False
        if draft != event:
            return False
    return True


_new = object.__new__
_DRAFTS: Final = _drafts_work()


def _make_update(
    relation: Relation,
    new: Tuple,
    old: Tuple | None,
    old_kind: OldKind,
    xid: int | None,
    lsn: int,
    toast_from_old: tuple[str, ...],
) -> Update:
    if not _DRAFTS:
        return Update(relation, new, old, old_kind, xid, lsn, toast_from_old)
    ev = _new(_UpdateDraft)
    ev.relation = relation
    ev.new = new
    ev.old = old
    ev.old_kind = old_kind
    ev.xid = xid
    ev.lsn = lsn
    ev.toast_from_old = toast_from_old
    ev.__class__ = Update  # type: ignore[assignment]
    return ev  # type: ignore[return-value]


def _make_delete(relation: Relation, old: Tuple, old_kind: OldKind, xid: int | None, lsn: int) -> Delete:
    if not _DRAFTS:
        return Delete(relation, old, old_kind, xid, lsn)
    ev = _new(_DeleteDraft)
    ev.relation = relation
    ev.old = old
    ev.old_kind = old_kind
    ev.xid = xid
    ev.lsn = lsn
    ev.__class__ = Delete  # type: ignore[assignment]
    return ev  # type: ignore[return-value]


TupleReader = Callable[[bytes, int], tuple[Tuple, int]]
"""Reads the columns of a TupleData at an offset (after its column count): (values, offset after)."""


_readers: dict[int, TupleReader] = {}


def tuple_reader(ncols: int) -> TupleReader:
    """The reader for TupleData of ``ncols`` columns, shared by relations of that width.

    Generated with the column loop unrolled: per column one kind test, one length read, one
    slice (decoded for text), the value kept in a local and the tuple built at once; about 15%
    faster than a loop, and decoding columns is most of the work per row. Slices do not check
    bounds: the caller's final length check catches a value that runs past the end. The source
    depends on ``ncols`` only; it is compiled once per width.
    """
    reader = _readers.get(ncols)
    if reader is None:
        lines = ["def read(data, pos):"]
        for i in range(ncols):
            lines += [
                "    kind = data[pos]",
                f"    if kind == {K.COLUMN_TEXT}:",
                "        start = pos + 5",
                "        pos = start + _U32(data, pos + 1)[0]",
                f"        c{i} = data[start:pos].decode()",
                f"    elif kind == {K.COLUMN_NULL}:",
                f"        c{i} = None",
                "        pos += 1",
                f"    elif kind == {K.COLUMN_UNCHANGED}:",
                f"        c{i} = UNCHANGED",
                "        pos += 1",
                f"    elif kind == {K.COLUMN_BINARY}:",
                "        start = pos + 5",
                "        pos = start + _U32(data, pos + 1)[0]",
                f"        c{i} = data[start:pos]",
                "    else:",
                "        raise _BadColumnKind(kind, pos)",
            ]
        lines.append(f"    return ({''.join(f'c{i}, ' for i in range(ncols))}), pos")
        namespace: dict[str, Any] = {"_U32": _U32, "UNCHANGED": UNCHANGED, "_BadColumnKind": _BadColumnKind}
        exec(compile("\n".join(lines), f"<pgoutput tuple reader, {ncols} columns>", "exec"), namespace)
        reader = _readers[ncols] = namespace["read"]
    return reader


class _BadColumnKind(Exception):
    """Raised inside the tuple loop; turned into a DecodeError that names the message."""

    def __init__(self, kind: int, pos: int) -> None:
        super().__init__(kind, pos)
        self.kind = kind
        self.pos = pos


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    """A NUL-terminated string at ``pos``; returns it and the offset after the NUL."""
    end = data.index(0, pos)
    return data[pos:end].decode(), end + 1


class PgOutputDecoder:
    """Stateful decoder of one pgoutput stream (see the module docstring).

    ``proto_version`` is the ``proto_version`` option the stream was started with (1-4).
    ``streaming_parallel``: None infers the Stream Abort layout from its length; True/False
    requires the protocol 4 ``streaming = parallel`` layout (abort LSN and time) or the short one.
    Use one decoder per stream, or call :meth:`reset` when a stream is restarted.
    """

    __slots__ = ("_in_stream", "_relations", "_rels", "_types", "proto_version", "streaming_parallel")

    def __init__(self, proto_version: int = 1, *, streaming_parallel: bool | None = None) -> None:
        if proto_version not in PROTO_VERSIONS:
            raise UsageError(f"pgoutput proto_version must be 1, 2, 3 or 4, not {proto_version}")
        if streaming_parallel and proto_version < 4:
            raise UsageError(f"pgoutput streaming=parallel needs proto_version 4, not {proto_version}")
        self.proto_version = proto_version
        self.streaming_parallel = streaming_parallel
        # OID -> (relation, column count, tuple reader): the count is checked against every tuple.
        self._rels: dict[int, tuple[Relation, int, TupleReader]] = {}
        self._relations: dict[int, Relation] = {}
        self._types: dict[int, TypeInfo] = {}
        self._in_stream = False

    @property
    def relations(self) -> Mapping[int, Relation]:
        """The Relation cache: the latest Relation message per table OID (read-only view)."""
        return MappingProxyType(self._relations)

    @property
    def types(self) -> Mapping[int, TypeInfo]:
        """The Type cache: the latest Type message per type OID (read-only view)."""
        return MappingProxyType(self._types)

    @property
    def in_stream(self) -> bool:
        """True between Stream Start and Stream Stop, where row messages carry an xid."""
        return self._in_stream

    def reset(self) -> None:
        """Forget an open streamed chunk (the stream was cut and restarts at a transaction
        boundary). The caches stay: the server sends Relation messages again anyway."""
        self._in_stream = False

    def decode(self, data: bytes | bytearray | memoryview, lsn: int = 0) -> Event:
        """One pgoutput message to one event; ``lsn`` becomes the row events' ``lsn``."""
        if type(data) is not bytes:
            data = bytes(data)
        if not data:
            raise DecodeError("pgoutput: empty message: expected at least a message type byte")
        kind = data[0]
        try:
            if kind == INSERT:  # the hot path, inlined
                if self._in_stream:
                    xid, oid, marker, ncols = _XID_OID_MARK_NCOLS(data, 1)
                    pos = 12
                else:
                    xid = None
                    oid, marker, ncols = _OID_MARK_NCOLS(data, 1)
                    pos = 8
                entry = self._rels.get(oid)
                if entry is None:
                    raise _unknown_relation(kind, oid, pos - 7)
                if marker != _NEW:
                    raise _error(kind, pos - 3, f"expected tuple marker 'N', got {_show(marker)}")
                rel, rel_ncols, reader = entry
                if ncols != rel_ncols:
                    raise _ncols_mismatch(kind, rel, ncols, pos - 2)
                values, pos = reader(data, pos)
                if pos != len(data):
                    raise _length_error(kind, data, pos)
                if not _DRAFTS:
                    return Insert(rel, values, xid, lsn)
                ev = _new(_InsertDraft)
                ev.relation = rel
                ev.new = values
                ev.xid = xid
                ev.lsn = lsn
                ev.__class__ = Insert  # type: ignore[assignment]
                return ev  # type: ignore[return-value]
            if kind == UPDATE:
                return self._update(data, lsn)
            if kind == DELETE:
                return self._delete(data, lsn)
            if kind == BEGIN:
                self._in_stream = False
                self._expect_len(kind, data, 21)
                final_lsn, commit_time, xid = _BEGIN(data, 1)
                return Begin(final_lsn, commit_time, xid)
            if kind == COMMIT:
                self._expect_len(kind, data, 26)
                flags, commit_lsn, end_lsn, commit_time = _COMMIT(data, 1)
                return Commit(flags, commit_lsn, end_lsn, commit_time)
            handler = self._HANDLERS.get(kind)
            if handler is None:
                raise _error(kind, 0, f"unknown message type {_show(kind)}", unknown=True)
            return handler(self, data, lsn)
        except _BadColumnKind as exc:
            raise _error(kind, exc.pos, f"unknown column kind {_show(exc.kind)} in TupleData") from None
        except UnicodeDecodeError as exc:
            text = exc.object if isinstance(exc.object, bytes) else b""
            if exc.reason == "unexpected end of data" and text and data.endswith(text):
                # a value cut by the end of the message, inside a multi-byte character
                raise _truncated(kind, data, str(exc)) from None
            start = data.find(text) if text else -1
            where = f" at offset {start + exc.start}" if start >= 0 else ""
            raise DecodeError(
                f"pgoutput: invalid UTF-8 in {_name(kind)} message{where} (pgrecv reads text from UTF8 databases only)",
                detail=str(exc),
            ) from None
        except (struct.error, IndexError, ValueError) as exc:
            # unpack_from past the end, data[pos] past the end, bytes.index without a NUL
            raise _truncated(kind, data, str(exc)) from None

    # --- row messages ---------------------------------------------------------------------

    def _row_head(self, kind: int, data: bytes) -> tuple[int | None, tuple[Relation, int, TupleReader], int, int]:
        """[xid] OID marker -> (xid, relation cache entry, marker, offset after the marker)."""
        if self._in_stream:
            xid, oid, marker = _XID_OID_MARK(data, 1)
            pos = 10
        else:
            xid = None
            oid, marker = _OID_MARK(data, 1)
            pos = 6
        entry = self._rels.get(oid)
        if entry is None:
            raise _unknown_relation(kind, oid, pos - 5)
        return xid, entry, marker, pos

    def _update(self, data: bytes, lsn: int) -> Update:
        kind = UPDATE
        xid, entry, marker, pos = self._row_head(kind, data)
        rel, rel_ncols, reader = entry
        old: Tuple | None = None
        old_kind: OldKind = None
        if marker in (_KEY, _OLD):
            old_kind = "K" if marker == _KEY else "O"
            if _U16(data, pos)[0] != rel_ncols:
                raise _ncols_mismatch(kind, rel, _U16(data, pos)[0], pos)
            old, pos = reader(data, pos + 2)
            marker = data[pos]
            pos += 1
        if marker != _NEW:
            raise _error(kind, pos - 1, f"expected tuple marker 'K', 'O' or 'N', got {_show(marker)}")
        if _U16(data, pos)[0] != rel_ncols:
            raise _ncols_mismatch(kind, rel, _U16(data, pos)[0], pos)
        new, pos = reader(data, pos + 2)
        if pos != len(data):
            raise _length_error(kind, data, pos)
        filled: tuple[str, ...] = ()
        if old is not None and UNCHANGED in new:
            new, filled = fill_from_old(rel, new, old, old_kind)
        return _make_update(rel, new, old, old_kind, xid, lsn, filled)

    def _delete(self, data: bytes, lsn: int) -> Delete:
        kind = DELETE
        xid, entry, marker, pos = self._row_head(kind, data)
        rel, rel_ncols, reader = entry
        if marker != _KEY and marker != _OLD:
            raise _error(kind, pos - 1, f"expected tuple marker 'K' or 'O', got {_show(marker)}")
        if _U16(data, pos)[0] != rel_ncols:
            raise _ncols_mismatch(kind, rel, _U16(data, pos)[0], pos)
        old, pos = reader(data, pos + 2)
        if pos != len(data):
            raise _length_error(kind, data, pos)
        return _make_delete(rel, old, "K" if marker == _KEY else "O", xid, lsn)

    def _truncate(self, data: bytes, lsn: int) -> Truncate:
        kind = K.TRUNCATE
        xid, pos = self._xid_prefix(data)
        nrels, flags = _NRELS_FLAGS(data, pos)
        pos += 5
        self._expect_len(kind, data, pos + 4 * nrels)
        relations = []
        for i in range(nrels):
            oid = _U32(data, pos + 4 * i)[0]
            entry = self._rels.get(oid)
            if entry is None:
                raise _unknown_relation(kind, oid, pos + 4 * i)
            relations.append(entry[0])
        return Truncate(tuple(relations), bool(flags & 1), bool(flags & 2), xid, lsn)

    # --- catalog messages ---------------------------------------------------------------------

    def _relation(self, data: bytes, lsn: int) -> Relation:
        kind = K.RELATION
        xid, pos = self._xid_prefix(data)
        oid = _U32(data, pos)[0]
        namespace, pos = _cstring(data, pos + 4)
        name, pos = _cstring(data, pos)
        ident, ncols = _IDENT_NCOLS(data, pos)
        identity = _IDENTITIES.get(ident)
        if identity is None:
            raise _error(kind, pos, f"unknown replica identity {_show(ident)}")
        pos += 3
        types = self._types
        columns = []
        for _ in range(ncols):
            flags = data[pos]
            col_name, pos = _cstring(data, pos + 1)
            type_oid, typmod = _TYPE_MOD(data, pos)
            pos += 8
            type_name = builtin_type_name(type_oid)
            if type_name is None:
                info = types.get(type_oid)
                type_name = "" if info is None else _qualified(info)
            columns.append(Column(col_name, type_oid, typmod, type_name, bool(flags & 1)))
        if pos != len(data):
            raise _length_error(kind, data, pos)
        # An empty namespace on the wire means pg_catalog (as PostgreSQL's own reader takes it).
        rel = Relation(oid, namespace or "pg_catalog", name, identity, tuple(columns), xid)
        self._rels[oid] = (rel, ncols, tuple_reader(ncols))
        self._relations[oid] = rel
        return rel

    def _type(self, data: bytes, lsn: int) -> TypeInfo:
        kind = K.TYPE
        xid, pos = self._xid_prefix(data)
        oid = _U32(data, pos)[0]
        namespace, pos = _cstring(data, pos + 4)
        name, pos = _cstring(data, pos)
        if pos != len(data):
            raise _length_error(kind, data, pos)
        info = TypeInfo(oid, namespace or "pg_catalog", name, xid)
        self._types[oid] = info
        return info

    # --- transaction and other messages -----------------------------------------------------

    def _origin(self, data: bytes, lsn: int) -> Origin:
        commit_lsn = _LSN(data, 1)[0]
        name, pos = _cstring(data, 9)
        if pos != len(data):
            raise _length_error(K.ORIGIN, data, pos)
        return Origin(commit_lsn, name)

    def _message(self, data: bytes, lsn: int) -> Message:
        kind = K.MESSAGE
        xid, pos = self._xid_prefix(data)
        flags, msg_lsn = _MSG_HEAD(data, pos)
        prefix, pos = _cstring(data, pos + 9)
        size = _U32(data, pos)[0]
        pos += 4
        self._expect_len(kind, data, pos + size)
        return Message(bool(flags & 1), msg_lsn, prefix, data[pos:], xid)

    def _stream_start(self, data: bytes, lsn: int) -> StreamStart:
        self._expect_len(K.STREAM_START, data, 6)
        xid, first = _STREAM_START(data, 1)
        self._in_stream = True
        return StreamStart(xid, first == 1)

    def _stream_stop(self, data: bytes, lsn: int) -> StreamStop:
        self._expect_len(K.STREAM_STOP, data, 1)
        self._in_stream = False
        return StreamStop()

    def _stream_commit(self, data: bytes, lsn: int) -> StreamCommit:
        self._in_stream = False
        self._expect_len(K.STREAM_COMMIT, data, 30)
        xid, flags, commit_lsn, end_lsn, commit_time = _STREAM_COMMIT(data, 1)
        return StreamCommit(xid, flags, commit_lsn, end_lsn, commit_time)

    def _stream_abort(self, data: bytes, lsn: int) -> StreamAbort:
        kind = K.STREAM_ABORT
        self._in_stream = False
        parallel = self.streaming_parallel
        if parallel is None:
            parallel = len(data) == 25 and self.proto_version >= 4
        if parallel:
            self._expect_len(kind, data, 25)
            xid, subxid, abort_lsn, abort_time = _STREAM_ABORT_PARALLEL(data, 1)
            return StreamAbort(xid, subxid, abort_lsn, abort_time)
        self._expect_len(kind, data, 9)
        xid, subxid = _STREAM_ABORT(data, 1)
        return StreamAbort(xid, subxid)

    def _begin_prepare(self, data: bytes, lsn: int) -> BeginPrepare:
        self._in_stream = False
        prepare_lsn, end_lsn, prepare_time, xid = _BEGIN_PREPARE(data, 1)
        gid = self._gid(K.BEGIN_PREPARE, data, 29)
        return BeginPrepare(prepare_lsn, end_lsn, prepare_time, xid, gid)

    def _prepare(self, data: bytes, lsn: int) -> Prepare:
        self._in_stream = False
        flags, prepare_lsn, end_lsn, prepare_time, xid = _PREPARE(data, 1)
        gid = self._gid(K.PREPARE, data, 30)
        return Prepare(flags, prepare_lsn, end_lsn, prepare_time, xid, gid)

    def _commit_prepared(self, data: bytes, lsn: int) -> CommitPrepared:
        self._in_stream = False
        flags, commit_lsn, end_lsn, commit_time, xid = _PREPARE(data, 1)
        gid = self._gid(K.COMMIT_PREPARED, data, 30)
        return CommitPrepared(flags, commit_lsn, end_lsn, commit_time, xid, gid)

    def _rollback_prepared(self, data: bytes, lsn: int) -> RollbackPrepared:
        self._in_stream = False
        flags, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid = _ROLLBACK_PREPARED(data, 1)
        gid = self._gid(K.ROLLBACK_PREPARED, data, 38)
        return RollbackPrepared(flags, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid, gid)

    def _stream_prepare(self, data: bytes, lsn: int) -> StreamPrepare:
        self._in_stream = False
        flags, prepare_lsn, end_lsn, prepare_time, xid = _PREPARE(data, 1)
        gid = self._gid(K.STREAM_PREPARE, data, 30)
        return StreamPrepare(flags, prepare_lsn, end_lsn, prepare_time, xid, gid)

    _HANDLERS: Final[dict[int, Callable[[PgOutputDecoder, bytes, int], Event]]] = {
        K.RELATION: _relation,
        K.TRUNCATE: _truncate,
        K.MESSAGE: _message,
        K.ORIGIN: _origin,
        K.TYPE: _type,
        K.STREAM_START: _stream_start,
        K.STREAM_STOP: _stream_stop,
        K.STREAM_COMMIT: _stream_commit,
        K.STREAM_ABORT: _stream_abort,
        K.BEGIN_PREPARE: _begin_prepare,
        K.PREPARE: _prepare,
        K.COMMIT_PREPARED: _commit_prepared,
        K.ROLLBACK_PREPARED: _rollback_prepared,
        K.STREAM_PREPARE: _stream_prepare,
    }

    # --- helpers ------------------------------------------------------------------------------

    def _xid_prefix(self, data: bytes) -> tuple[int | None, int]:
        """The xid that starts a message inside a streamed chunk, and the offset after it."""
        if self._in_stream:
            return _XID(data, 1)[0], 5
        return None, 1

    def _gid(self, kind: int, data: bytes, pos: int) -> str:
        gid, end = _cstring(data, pos)
        if end != len(data):
            raise _length_error(kind, data, end)
        return gid

    @staticmethod
    def _expect_len(kind: int, data: bytes, size: int) -> None:
        if len(data) != size:
            raise _length_error(kind, data, size)


def _unknown_relation(kind: int, oid: int, pos: int) -> DecodeError:
    return _error(
        kind,
        pos,
        f"relation OID {oid} was not described by a Relation message before "
        "(a stream must be decoded from its start, or the bytes are garbled)",
    )


def _ncols_mismatch(kind: int, rel: Relation, ncols: int, pos: int) -> DecodeError:
    return _error(
        kind,
        pos,
        f"tuple has {ncols} columns but the Relation message for {rel.namespace}.{rel.name} lists {len(rel.columns)}",
    )


def _qualified(info: TypeInfo) -> str:
    """A user type's name for Column.type_name: schema-qualified unless in pg_catalog."""
    return info.name if info.namespace == "pg_catalog" else f"{info.namespace}.{info.name}"


def _name(kind: int) -> str:
    return MESSAGE_NAMES.get(kind, f"unknown ({_show(kind)})")


def _show(byte: int) -> str:
    return repr(chr(byte)) if 32 <= byte < 127 else f"0x{byte:02x}"


def _error(kind: int, pos: int, what: str, *, unknown: bool = False) -> DecodeError:
    name = "pgoutput: message" if unknown else f"pgoutput: {_name(kind)} message"
    return DecodeError(f"{name} at offset {pos}: {what}")


def _truncated(kind: int, data: bytes, detail: str) -> DecodeError:
    return DecodeError(
        f"pgoutput: truncated {_name(kind)} message at offset {len(data)}: "
        "a field or string runs past the end of the message",
        detail=detail,
    )


def _length_error(kind: int, data: bytes, pos: int) -> DecodeError:
    """``pos`` is where the message should end: past the end means cut short, before means
    trailing bytes."""
    if pos > len(data):
        return DecodeError(
            f"pgoutput: truncated {_name(kind)} message at offset {len(data)}: "
            f"its fields need {pos} bytes, the message has {len(data)}"
        )
    return DecodeError(
        f"pgoutput: {_name(kind)} message at offset {pos}: {len(data) - pos} unexpected trailing "
        f"bytes after a complete message of {pos} bytes"
    )
