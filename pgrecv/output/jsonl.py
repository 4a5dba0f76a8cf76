"""Events to JSON Lines, format v1 (docs/event-format.md, pgrecv/schema/event-v1.schema.json).

One self-contained JSON object per line. Row records carry their transaction's xid, commit LSN and
commit time, so a consumer can de-duplicate and order rows without tracking Begin/Commit itself.

The hot path is :meth:`JsonlEncoder.feed` for row changes: per relation the column names and value
converters are compiled once (:class:`_Compiled`), each row is one loop building a dict, and each
record is one ``orjson.dumps`` call.

test_decoding does not say at BEGIN where its transaction commits (``Begin.final_lsn == 0``): such
a transaction is held back and written when its COMMIT (or PREPARE) arrives. At the end of input a
transaction still held back is incomplete; :meth:`JsonlEncoder.close` drops it rather than pass it
off as complete.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO, Final

import orjson

from pgrecv import events as ev
from pgrecv.errors import DecodeError
from pgrecv.events import UNCHANGED, pg_time_iso
from pgrecv.lsn import LSN, lsn_str
from pgrecv.output.format import FORMAT_VERSION, image_splice, row_record, snapshot_record
from pgrecv.output.values import JSON_NULL, binary_converter, text_converter

_dumps: Final = orjson.dumps
_OPT: Final = orjson.OPT_APPEND_NEWLINE

REPLICA_IDENTITY: Final[dict[str, str]] = {
    "d": "default",
    "n": "nothing",
    "f": "full",
    "i": "index",
    "?": "unknown",
}
OLD_KIND: Final[dict[str | None, str | None]] = {"K": "key", "O": "full", None: None}

Record = dict[str, Any]

_JSON_OIDS: Final = frozenset({114, 3802})
_JSON_NAMES: Final = frozenset({"json", "jsonb"})
# What a converter may raise on a value it cannot read (a malformed literal, wrong length bytes).
_CONVERSION_ERRORS: Final = (
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    UnicodeDecodeError,
    OverflowError,
    struct.error,
)
_NOTHING: Final[tuple[str, ...]] = ()
# lsn_str inlined: printf-style formatting is faster than an f-string with format specs (bench/NOTES.md).
_LSN_FMT: Final = "%X/%X"


def _lsn_or_none(value: int | None) -> str | None:
    return None if not value else lsn_str(value)


def _time_or_none(value: int | None) -> str | None:
    return None if value is None else pg_time_iso(value)


class _Compiled:
    """What one Relation needs per row, worked out once: names, converters and ``fast``.

    ``fast(tuple)`` is generated source specialised to the relation (one dict display, converters
    bound by name): it returns the image dict, or None when the row needs :meth:`image`, the
    general loop (an unchanged TOAST value, a JSON ``null`` document, a column-count mismatch).
    """

    __slots__ = ("bconvs", "convs", "fast", "key", "names", "relation", "schema", "table")

    def __init__(self, relation: ev.Relation) -> None:
        self.relation = relation  # keeps the object alive, so its id() is not reused
        self.schema = relation.namespace
        self.table = relation.name
        self.names = tuple(c.name for c in relation.columns)
        self.key = list(relation.key_names)
        self.convs = tuple(text_converter(c.type_oid, c.type_name) for c in relation.columns)
        self.bconvs = tuple(binary_converter(c.type_oid) for c in relation.columns)
        self.fast: Callable[[ev.Tuple], dict[str, object] | None] = self._generate(relation)

    def _generate(self, relation: ev.Relation) -> Callable[[ev.Tuple], dict[str, object] | None]:
        n = len(self.names)
        ns: dict[str, Any] = {"UNCH": UNCHANGED, "JSON_NULL": JSON_NULL}
        items = []
        json_cols = []
        for i, (name, conv) in enumerate(zip(self.names, self.convs, strict=True)):
            ns[f"b{i}"] = self.bconvs[i]
            other = f"(None if v{i} is None else b{i}(v{i}))"
            if conv is None:
                items.append(f"{name!r}: (v{i} if v{i}.__class__ is not bytes else {other})")
            else:
                ns[f"c{i}"] = conv
                items.append(f"{name!r}: (c{i}(v{i}) if v{i}.__class__ is str else {other})")
            col = relation.columns[i]
            if col.type_oid in _JSON_OIDS or col.type_name in _JSON_NAMES:
                json_cols.append(name)
        if n == 0:
            src = "def fast(t):\n    return None if t else {}\n"
        else:
            unpack = ", ".join(f"v{i}" for i in range(n))
            src = (
                "def fast(t):\n"
                f"    if len(t) != {n} or UNCH in t:\n        return None\n"
                f"    {unpack}, = t\n"
                f"    d = {{{', '.join(items)}}}\n"
            )
            for name in json_cols:
                src += f"    if d[{name!r}] is JSON_NULL:\n        return None\n"
            src += "    return d\n"
        exec(compile(src, f"<pgrecv row image {self.schema}.{self.table}>", "exec"), ns)
        fast: Callable[[ev.Tuple], dict[str, object] | None] = ns["fast"]
        return fast

    def image(self, tup: ev.Tuple) -> tuple[dict[str, object], list[str], list[str]]:
        """(values by column name, unchanged TOAST columns, columns holding JSON ``null``)."""
        out: dict[str, object] = {}
        toast: list[str] = []
        jnull: list[str] = []
        if len(tup) != len(self.names):
            raise DecodeError(
                f"row for {self.schema}.{self.table} has {len(tup)} values but its relation has "
                f"{len(self.names)} columns; the stream is inconsistent, restart from the slot"
            )
        try:
            for i, (name, conv, v) in enumerate(zip(self.names, self.convs, tup, strict=True)):
                value: object
                if v is None:
                    out[name] = None
                    continue
                if isinstance(v, str):
                    value = v if conv is None else conv(v)
                elif isinstance(v, bytes):
                    value = self.bconvs[i](v)
                else:  # UNCHANGED
                    toast.append(name)
                    continue
                if value is JSON_NULL:
                    value = None
                    jnull.append(name)
                out[name] = value
        except _CONVERSION_ERRORS as exc:
            raise self.value_error(tup, exc) from None
        return out, toast, jnull

    def value_error(self, tup: ev.Tuple, exc: Exception) -> DecodeError:
        """The error for a value no converter accepts, naming its column."""
        for col, conv, bconv, v in zip(self.relation.columns, self.convs, self.bconvs, tup, strict=False):
            try:
                if isinstance(v, str) and conv is not None:
                    conv(v)
                elif isinstance(v, bytes):
                    bconv(v)
            except Exception:
                return DecodeError(
                    f"cannot convert column {col.name} ({col.type_name or col.type_oid}) of "
                    f"{self.schema}.{self.table}: {exc}; report this value's type as a bug",
                    detail=repr(v)[:200],
                )
        return DecodeError(f"cannot convert a row of {self.schema}.{self.table}: {exc}")


class JsonlEncoder:
    """Feed events in stream order; complete JSON lines go to ``write``.

    ``pending`` is the number of events held back (an open test_decoding transaction whose commit
    LSN is not known yet); ``dropped`` counts events of incomplete transactions discarded so far.
    """

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self._compiled: dict[int, _Compiled] = {}
        self._by_oid: dict[int, int] = {}  # relation OID -> id() of its latest Relation
        # current transaction context, copied into every row record
        self._xid: int | None = None
        self._commit_lsn: str | None = None
        self._commit_time: str | None = None
        self._gid: str | None = None
        self.context: tuple[int | None, str | None, str | None, str | None] = (None, None, None, None)
        self._prepare_lsn: str | None = None
        # held-back test_decoding transaction
        self._held: list[ev.Event] | None = None
        self.dropped = 0
        self._dispatch: dict[type, Callable[[Any], None]] = {
            ev.Begin: self._begin,
            ev.Commit: self._commit,
            ev.Origin: self._origin,
            ev.Relation: self._relation,
            ev.TypeInfo: self._type,
            ev.Insert: self._insert,
            ev.Update: self._update,
            ev.Delete: self._delete,
            ev.Truncate: self._truncate,
            ev.Message: self._message,
            ev.StreamStart: self._stream_start,
            ev.StreamStop: self._stream_stop,
            ev.StreamCommit: self._stream_commit,
            ev.StreamAbort: self._stream_abort,
            ev.BeginPrepare: self._begin_prepare,
            ev.Prepare: self._prepare,
            ev.CommitPrepared: self._commit_prepared,
            ev.RollbackPrepared: self._rollback_prepared,
            ev.StreamPrepare: self._stream_prepare,
        }

    @property
    def pending(self) -> int:
        return 0 if self._held is None else len(self._held)

    def feed(self, event: ev.Event) -> None:
        held = self._held
        if held is not None and event.__class__ not in _PASS_THROUGH:
            if event.__class__ is ev.Commit or event.__class__ is ev.Prepare:
                self._release(event)
                return
            if event.__class__ is ev.Begin:
                self._drop()  # the held transaction never finished: a new one starts
            elif event.__class__ is not ev.Message or event.transactional:
                held.append(event)
                return
        try:
            handler = self._dispatch[event.__class__]
        except KeyError:
            raise TypeError(f"not an event: {event!r}") from None
        handler(event)

    def close(self) -> int:
        """End of input: drop a transaction still held back; returns how many events it had."""
        n = self.pending
        self._drop()
        return n

    # --- transaction context ------------------------------------------------------------

    def _drop(self) -> None:
        if self._held is not None:
            self.dropped += len(self._held)
            self._held = None
            self._set_context(None, None, None)

    def _set_context(
        self,
        xid: int | None,
        commit_lsn: str | None,
        commit_time: str | None,
        gid: str | None = None,
        prepare_lsn: str | None = None,
    ) -> None:
        self._xid = xid
        self._commit_lsn = commit_lsn
        self._commit_time = commit_time
        self._gid = gid
        self._prepare_lsn = prepare_lsn
        # one new tuple per change of context: a fast path compares it by identity
        self.context = (xid, commit_lsn, commit_time, gid)

    def _emit(self, rec: Record) -> None:
        self._write(_dumps(rec, option=_OPT))

    def _begin(self, e: ev.Begin) -> None:
        if not e.final_lsn:
            self._held = [e]
            return
        lsn = lsn_str(e.final_lsn)
        t = _time_or_none(e.commit_time)
        self._set_context(e.xid, lsn, t)
        self._emit({"v": FORMAT_VERSION, "op": "begin", "xid": e.xid, "commit_lsn": lsn, "commit_time": t})

    def _release(self, end: ev.Commit | ev.Prepare) -> None:
        """Write a held-back transaction now that its end tells its commit (or prepare) LSN."""
        held = self._held
        assert held is not None
        self._held = None
        begin = held[0]
        assert isinstance(begin, ev.Begin)
        xid = begin.xid if begin.xid is not None else end.xid
        if isinstance(end, ev.Commit):
            ctime = end.commit_time if end.commit_time is not None else begin.commit_time
            lsn = _lsn_or_none(end.commit_lsn)
            t = _time_or_none(ctime)
            self._set_context(xid, lsn, t)
            self._emit({"v": FORMAT_VERSION, "op": "begin", "xid": xid, "commit_lsn": lsn, "commit_time": t})
        else:
            self._set_context(xid, None, None, end.gid, _lsn_or_none(end.prepare_lsn))
            self._emit(_prepare_record("begin_prepare", end, xid))
        for e in held[1:]:
            self._dispatch[e.__class__](e)
        self._dispatch[end.__class__](end)

    def _commit(self, e: ev.Commit) -> None:
        xid = e.xid if e.xid is not None else self._xid
        self._emit(
            {
                "v": FORMAT_VERSION,
                "op": "commit",
                "xid": xid,
                "commit_lsn": lsn_str(e.commit_lsn),
                "end_lsn": _lsn_or_none(e.end_lsn),
                "commit_time": self._commit_time if e.commit_time is None else pg_time_iso(e.commit_time),
            }
        )
        self._set_context(None, None, None)

    def _origin(self, e: ev.Origin) -> None:
        self._emit({"v": FORMAT_VERSION, "op": "origin", "name": e.name, "commit_lsn": _lsn_or_none(e.commit_lsn)})

    # --- schema ---------------------------------------------------------------------------

    def _relation(self, e: ev.Relation) -> None:
        if e.oid:
            old = self._by_oid.get(e.oid)
            if old is not None and old != id(e):
                self._compiled.pop(old, None)
            self._by_oid[e.oid] = id(e)
        self._compile(e)
        self._emit(
            {
                "v": FORMAT_VERSION,
                "op": "relation",
                "oid": e.oid,
                "schema": e.namespace,
                "table": e.name,
                "replica_identity": REPLICA_IDENTITY.get(e.replica_identity, "unknown"),
                "columns": [
                    {
                        "name": c.name,
                        "type": c.type_name or None,
                        "type_oid": c.type_oid,
                        "typmod": c.type_modifier,
                        "key": c.key,
                    }
                    for c in e.columns
                ],
                "key": list(e.key_names),
            }
        )

    def _type(self, e: ev.TypeInfo) -> None:
        self._emit({"v": FORMAT_VERSION, "op": "type", "oid": e.oid, "schema": e.namespace, "name": e.name})

    def announced(self, rel: ev.Relation) -> bool:
        """Whether ``rel``'s relation record is written already: a fast path may then write its
        rows itself (:mod:`pgrecv.output.fastpath`)."""
        c = self._compiled.get(id(rel))
        return c is not None and c.relation is rel

    def _compile(self, rel: ev.Relation) -> _Compiled:
        c = self._compiled.get(id(rel))
        if c is None or c.relation is not rel:
            c = self._compiled[id(rel)] = _Compiled(rel)
        return c

    # --- snapshot rows (pgrecv snapshot) ----------------------------------------------------

    def snapshot_rows(self, relation: ev.Relation, rows: Iterable[ev.Tuple], snapshot_lsn: int) -> int:
        """Write one ``snapshot`` record per row (a table's existing rows as of ``snapshot_lsn``),
        preceded by the relation record the first time ``relation`` is seen; returns the count.

        Values go through the same compiled converters as insert records, so a snapshot row and
        an insert of the same row carry identical values. The fields before ``new`` are the same
        for every row: they are encoded once and the row's image is spliced in.
        """
        c = self._lookup(relation)
        record = snapshot_record(c.schema, c.table, lsn_str(snapshot_lsn), c.key)
        prefix, suffix = image_splice(record)
        prefix, suffix = prefix[:-1], suffix[1:]  # around a whole image, braces included
        fast = c.fast
        write = self._write
        n = 0
        for tup in rows:
            try:
                new = fast(tup)
                if new is None:  # a JSON null document (or an odd row): the general loop
                    rec = dict(record)
                    rec["new"], rec["unchanged_toast"], jnull = c.image(tup)
                    if jnull:
                        rec["json_nulls"] = jnull
                    write(_dumps(rec, option=_OPT))
                else:
                    write(prefix + _dumps(new) + suffix)
            except _CONVERSION_ERRORS as exc:
                raise c.value_error(tup, exc) from None
            n += 1
        return n

    # --- rows -------------------------------------------------------------------------------

    def _lookup(self, rel: ev.Relation) -> _Compiled:
        """The compiled relation; a Relation never seen as an event (test_decoding's synthesised
        ones) is written as a relation record first, so that the output replays on its own."""
        c = self._compiled.get(id(rel))
        if c is not None and c.relation is rel:
            return c
        self._relation(rel)
        return self._compiled[id(rel)]

    def _row(self, op: str, e: ev.Insert | ev.Update | ev.Delete) -> tuple[Record, _Compiled]:
        """The fields every row record shares, in the format's order."""
        rel = e.relation
        c = self._compiled.get(id(rel))
        if c is None or c.relation is not rel:
            c = self._lookup(rel)
        lsn = e.lsn
        rec = row_record(
            op,
            c.schema,
            c.table,
            self._xid if e.xid is None else e.xid,
            self._commit_lsn,
            _LSN_FMT % (lsn >> 32, lsn & 0xFFFFFFFF) if lsn else None,
            self._commit_time,
            c.key,
        )
        return rec, c

    def _finish_row(self, rec: Record) -> None:
        if self._gid is not None:
            rec["gid"] = self._gid
            rec["prepare_lsn"] = self._prepare_lsn
        self._write(_dumps(rec, option=_OPT))

    @staticmethod
    def _new_image(rec: Record, c: _Compiled, tup: ev.Tuple, from_old: tuple[str, ...] = _NOTHING) -> None:
        """``new``, ``unchanged_toast``, ``toast_from_old`` (an update's columns whose unchanged
        TOAST value the decoder took from its old image; only when there is one), ``json_nulls``."""
        try:
            new = c.fast(tup)
        except _CONVERSION_ERRORS as exc:
            raise c.value_error(tup, exc) from None
        if new is None:  # unchanged TOAST, JSON null or an odd row: the general loop
            rec["new"], rec["unchanged_toast"], jnull = c.image(tup)
            if from_old:
                rec["toast_from_old"] = from_old
            if jnull:
                rec["json_nulls"] = jnull
        else:
            rec["new"] = new
            rec["unchanged_toast"] = _NOTHING
            if from_old:
                rec["toast_from_old"] = from_old

    def _insert(self, e: ev.Insert) -> None:
        rec, c = self._row("insert", e)
        self._new_image(rec, c, e.new)
        self._finish_row(rec)

    def _update(self, e: ev.Update) -> None:
        rec, c = self._row("update", e)
        self._new_image(rec, c, e.new, e.toast_from_old)
        rec["old"] = None
        rec["old_kind"] = None
        if e.old is not None:
            _old_image(rec, c, e.old, e.old_kind)
        self._finish_row(rec)

    def _delete(self, e: ev.Delete) -> None:
        rec, c = self._row("delete", e)
        rec["old"] = None
        rec["old_kind"] = None
        if e.old is not None:
            _old_image(rec, c, e.old, e.old_kind)
        self._finish_row(rec)

    def _truncate(self, e: ev.Truncate) -> None:
        rec: Record = {
            "v": FORMAT_VERSION,
            "op": "truncate",
            "tables": [{"schema": r.namespace, "table": r.name} for r in e.relations],
            "cascade": e.cascade,
            "restart_identity": e.restart_identity,
            "xid": self._xid if e.xid is None else e.xid,
            "commit_lsn": self._commit_lsn,
            "lsn": _lsn_or_none(e.lsn),
            "commit_time": self._commit_time,
        }
        if self._gid is not None:
            rec["gid"] = self._gid
            rec["prepare_lsn"] = self._prepare_lsn
        self._emit(rec)

    def _message(self, e: ev.Message) -> None:
        try:
            content: str = e.content.decode()
            encoding = "utf8"
        except UnicodeDecodeError:
            content = _b64(e.content)
            encoding = "base64"
        rec: Record = {
            "v": FORMAT_VERSION,
            "op": "message",
            "transactional": e.transactional,
            "prefix": e.prefix,
            "content": content,
            "content_encoding": encoding,
            "lsn": _lsn_or_none(e.lsn),
        }
        if e.transactional:
            rec["xid"] = self._xid if e.xid is None else e.xid
            rec["commit_lsn"] = self._commit_lsn
            rec["commit_time"] = self._commit_time
            if self._gid is not None:
                rec["gid"] = self._gid
                rec["prepare_lsn"] = self._prepare_lsn
        else:
            rec["xid"] = e.xid
        self._emit(rec)

    # --- streamed transactions --------------------------------------------------------------

    def _stream_start(self, e: ev.StreamStart) -> None:
        self._set_context(e.xid, None, None)
        self._emit({"v": FORMAT_VERSION, "op": "stream_start", "xid": e.xid, "first": e.first})

    def _stream_stop(self, e: ev.StreamStop) -> None:
        xid = self._xid
        self._set_context(None, None, None)
        self._emit({"v": FORMAT_VERSION, "op": "stream_stop", "xid": xid})

    def _stream_commit(self, e: ev.StreamCommit) -> None:
        self._emit(
            {
                "v": FORMAT_VERSION,
                "op": "stream_commit",
                "xid": e.xid,
                "commit_lsn": lsn_str(e.commit_lsn),
                "end_lsn": _lsn_or_none(e.end_lsn),
                "commit_time": _time_or_none(e.commit_time),
            }
        )

    def _stream_abort(self, e: ev.StreamAbort) -> None:
        self._emit(
            {
                "v": FORMAT_VERSION,
                "op": "stream_abort",
                "xid": e.xid,
                "subxid": e.subxid,
                "abort_lsn": _lsn_or_none(e.abort_lsn),
                "abort_time": _time_or_none(e.abort_time),
            }
        )

    # --- two-phase commit -------------------------------------------------------------------

    def _begin_prepare(self, e: ev.BeginPrepare) -> None:
        self._set_context(e.xid, None, None, e.gid, _lsn_or_none(e.prepare_lsn))
        self._emit(_prepare_record("begin_prepare", e, e.xid))

    def _prepare(self, e: ev.Prepare) -> None:
        xid = e.xid if e.xid is not None else self._xid
        self._set_context(None, None, None)
        self._emit(_prepare_record("prepare", e, xid))

    def _stream_prepare(self, e: ev.StreamPrepare) -> None:
        self._emit(_prepare_record("stream_prepare", e, e.xid))

    def _commit_prepared(self, e: ev.CommitPrepared) -> None:
        self._emit(
            {
                "v": FORMAT_VERSION,
                "op": "commit_prepared",
                "xid": e.xid,
                "gid": e.gid,
                "commit_lsn": lsn_str(e.commit_lsn),
                "end_lsn": _lsn_or_none(e.end_lsn),
                "commit_time": _time_or_none(e.commit_time),
            }
        )

    def _rollback_prepared(self, e: ev.RollbackPrepared) -> None:
        self._emit(
            {
                "v": FORMAT_VERSION,
                "op": "rollback_prepared",
                "xid": e.xid,
                "gid": e.gid,
                "prepare_end_lsn": _lsn_or_none(e.prepare_end_lsn),
                "rollback_end_lsn": _lsn_or_none(e.rollback_end_lsn),
                "prepare_time": _time_or_none(e.prepare_time),
                "rollback_time": _time_or_none(e.rollback_time),
            }
        )


def _old_image(rec: Record, c: _Compiled, tup: ev.Tuple, kind: ev.OldKind) -> None:
    """Fill ``old`` and its companions. A key image ("K") keeps only the key columns: the server
    sends the others as NULL placeholders, which are not the row's values."""
    try:
        old = c.fast(tup)
    except _CONVERSION_ERRORS as exc:
        raise c.value_error(tup, exc) from None
    toast: list[str] | tuple[str, ...] = _NOTHING
    jnull: list[str] | tuple[str, ...] = _NOTHING
    if old is None:
        old, toast, jnull = c.image(tup)
    if kind == "K" and c.key:
        keys = c.key
        old = {k: old[k] for k in keys if k in old}
        jnull = [n for n in jnull if n in old]
        toast = [n for n in toast if n in keys]
    rec["old"] = old
    rec["old_kind"] = OLD_KIND.get(kind)
    if toast:
        rec["old_unchanged_toast"] = toast
    if jnull:
        rec["old_json_nulls"] = jnull


def _prepare_record(op: str, e: ev.BeginPrepare | ev.Prepare | ev.StreamPrepare, xid: int | None) -> Record:
    return {
        "v": FORMAT_VERSION,
        "op": op,
        "xid": xid,
        "gid": e.gid,
        "prepare_lsn": _lsn_or_none(e.prepare_lsn),
        "end_lsn": _lsn_or_none(e.end_lsn),
        "prepare_time": _time_or_none(e.prepare_time),
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# Events that never belong to a held-back transaction: written at once even while one is open.
_PASS_THROUGH: Final[frozenset[type]] = frozenset(
    {
        ev.Relation,
        ev.TypeInfo,
        ev.StreamStart,
        ev.StreamStop,
        ev.StreamCommit,
        ev.StreamAbort,
        ev.CommitPrepared,
        ev.RollbackPrepared,
        ev.StreamPrepare,
    }
)


# --- reading whole units back (FileSink's restart after a lagging state record) ---------------

# op -> the fields holding the (commit LSN, end LSN) that the streamer gives Sink.boundary for it
_UNIT_ENDS: Final[dict[str, tuple[str, str]]] = {
    "commit": ("commit_lsn", "end_lsn"),
    "prepare": ("prepare_lsn", "end_lsn"),
    "commit_prepared": ("commit_lsn", "end_lsn"),
    "rollback_prepared": ("prepare_end_lsn", "rollback_end_lsn"),
}


def unit_end(line: bytes) -> tuple[int, int] | None:
    """(commit LSN, end LSN) of a record that ends a unit (as :func:`last_unit_end` takes it;
    a non-transactional message counts), or None for any other line."""
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(rec, dict) or rec.get("v") != FORMAT_VERSION:
        return None
    op = rec.get("op")
    fields = _UNIT_ENDS.get(op) if isinstance(op, str) else None
    if fields is None and op == "message" and rec.get("transactional") is False:
        fields = ("lsn", "lsn")
    if fields is None:
        return None
    try:
        commit = int(LSN.parse(rec[fields[0]]))
        end = rec.get(fields[1])
        return commit, commit if end is None else int(LSN.parse(end))
    except (KeyError, TypeError, ValueError):
        return None


def last_unit_end(lines: BinaryIO) -> tuple[int, int, int] | None:
    """(bytes read up to the end of the last whole unit, its commit LSN, its end LSN), or None.

    The lines are this encoder's, as :meth:`Sink.boundary` saw them: a unit ends with a commit,
    prepare, commit/rollback prepared record, or is one non-transactional message outside a
    transaction. Reading stops at the first line that is cut short or not a JSON object (what a
    crash leaves of a write the disk did not finish). A missing end LSN (test_decoding) is taken
    as the commit LSN: resuming there repeats at most that transaction, which the resume skips.
    """
    read = 0
    found: tuple[int, int, int] | None = None
    in_txn = False
    for line in lines:
        if not line.endswith(b"\n"):
            break
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            break
        if not isinstance(rec, dict):
            break
        read += len(line)
        op = rec.get("op")
        if op in ("begin", "begin_prepare"):
            in_txn = True
            continue
        fields = _UNIT_ENDS.get(op) if isinstance(op, str) else None
        if fields is not None:
            in_txn = False
        elif op == "message" and rec.get("transactional") is False and not in_txn:
            fields = ("lsn", "lsn")
        else:
            continue
        try:
            commit = int(LSN.parse(rec[fields[0]]))
            end = rec.get(fields[1])
            found = (read, commit, commit if end is None else int(LSN.parse(end)))
        except (KeyError, TypeError, ValueError):
            break
    return found
