"""Events to Debezium PostgreSQL-connector change events, one JSON envelope per line (docs/debezium.md).

Each row change becomes ``{"before", "after", "source", "transaction", "op", "ts_ms", ...}`` as
Debezium's JsonConverter writes it, so Flink SQL (``'format' = 'debezium-json'``), RisingWave,
Paimon or a Kafka Connect sink read pgrecv's files as they read Debezium's topics. With
``schemas=True`` each line is ``{"schema": ..., "payload": ...}`` (JsonConverter's
``schemas.enable``; Flink's ``debezium-json.schema-include``).

Only committed rows are written, in commit order, exactly where JSONL writes its row records:

* a transaction whose Begin tells its commit LSN (pgoutput, and streamed transactions made whole by
  :class:`~pgrecv.decode.assemble.StreamAssembler`) is written as it arrives;
* test_decoding's transactions (Begin without a commit LSN) are held back until their COMMIT, like
  :class:`~pgrecv.output.jsonl.JsonlEncoder` holds them; :meth:`DebeziumEncoder.close` drops one left open;
* streamed chunks that were not made whole are kept until their Stream Commit, and dropped on a
  Stream Abort (only the rolled-back subtransaction's rows when ``subxid != xid``);
* a prepared transaction (two-phase) is kept until COMMIT PREPARED and dropped at ROLLBACK
  PREPARED. A COMMIT PREPARED whose rows this encoder never saw (they were prepared, and
  confirmed, before this run) is an error: they cannot be written any more.

Relation, Type, Begin, Commit and Origin messages write nothing: a Debezium envelope describes its
table itself. Truncates give one ``op: "t"`` envelope per table, logical messages ``op: "m"``
with ``message: {prefix, content (base64)}``, as Debezium's connector does.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

import orjson

from pgrecv import __version__
from pgrecv import events as ev
from pgrecv.errors import DecodeError
from pgrecv.events import PG_EPOCH_UNIX
from pgrecv.output.debezium_values import ColumnCodec, column_codec

CONNECTOR: Final = "postgresql"
VERSION: Final = f"pgrecv-{__version__}"
_PG_EPOCH_US: Final = PG_EPOCH_UNIX * 1_000_000
_OPT: Final = orjson.OPT_APPEND_NEWLINE
_dumps: Final = orjson.dumps
# what a converter may raise on a value it cannot read
_CONVERSION_ERRORS: Final = (ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError, OverflowError)

Record = dict[str, Any]


class _Table:
    """What one Relation needs per row, worked out once."""

    __slots__ = ("codecs", "key", "names", "relation", "schema", "schema_json", "table")

    def __init__(self, relation: ev.Relation, server: str, with_schema: bool) -> None:
        self.relation = relation  # keeps the object alive, so its id() is not reused
        self.schema = relation.namespace
        self.table = relation.name
        self.names = tuple(c.name for c in relation.columns)
        self.key = frozenset(relation.key_names)
        self.codecs: tuple[ColumnCodec, ...] = tuple(column_codec(c) for c in relation.columns)
        self.schema_json = _envelope_schema(self, server) if with_schema else b""

    def image(self, tup: ev.Tuple, key_only: bool = False) -> dict[str, object]:
        if len(tup) != len(self.names):
            raise DecodeError(
                f"row for {self.schema}.{self.table} has {len(tup)} values but its relation has "
                f"{len(self.names)} columns; the stream is inconsistent, restart from the slot"
            )
        out: dict[str, object] = {}
        for name, codec, v in zip(self.names, self.codecs, tup, strict=True):
            if v is None or (key_only and name not in self.key):
                out[name] = None
                continue
            try:
                if isinstance(v, str):
                    out[name] = codec.text(v)
                elif isinstance(v, bytes):
                    out[name] = codec.binary(v)
                else:  # UNCHANGED
                    out[name] = codec.unavailable
            except _CONVERSION_ERRORS as exc:
                raise DecodeError(
                    f"cannot convert column {name} of {self.schema}.{self.table} for --format debezium: "
                    f"{exc}; report this value's type as a bug",
                    detail=repr(v)[:200],
                ) from None
        return out


class DebeziumEncoder:
    """Feed events in stream order; complete envelope lines go to ``write``.

    ``database`` is ``source.db`` (the connection's ``current_database()``), ``server`` is
    ``source.name`` (Debezium's topic prefix; pgrecv passes the slot name). ``clock`` gives the
    envelope's ``ts_ms`` (when pgrecv wrote it), in seconds since the Unix epoch.
    """

    def __init__(
        self,
        write: Callable[[bytes], None],
        *,
        database: str,
        server: str,
        schemas: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._write = write
        self.database = database
        self.server = server
        self.schemas = schemas
        self._clock = clock
        self._tables: dict[int, _Table] = {}
        self._by_oid: dict[int, int] = {}  # relation OID -> id() of its latest Relation
        # the transaction being written
        self._xid: int | None = None
        self._commit_lsn: int | None = None
        self._commit_us: int | None = None  # commit time, µs since the Unix epoch
        self._total = 0
        self._per_table: dict[tuple[str, str], int] = {}
        # kept back until their outcome is known
        self._held: list[ev.Event] | None = None  # test_decoding transaction without its commit LSN
        self._streams: dict[int, list[ev.Event]] = {}  # streamed chunks by top-level xid
        self._stream_xid: int | None = None
        self._preparing: list[ev.Event] | None = None  # between Begin Prepare and Prepare
        self._preparing_xid: int | None = None
        # by gid until COMMIT/ROLLBACK PREPARED: (xid, events)
        self._prepared: dict[str, tuple[int | None, list[ev.Event]]] = {}
        self.dropped = 0

    @property
    def pending(self) -> int:
        """Events held back: an open or prepared transaction, streamed chunks not yet committed."""
        held = 0 if self._held is None else len(self._held)
        held += 0 if self._preparing is None else len(self._preparing)
        return held + sum(map(len, self._streams.values())) + sum(len(p[1]) for p in self._prepared.values())

    def close(self) -> int:
        """End of input: drop what was held back (its outcome is unknown); returns how many events."""
        n = self.pending
        self.dropped += n
        self._held = self._preparing = None
        self._streams.clear()
        self._prepared.clear()
        return n

    # --- dispatch -------------------------------------------------------------------------

    def feed(self, event: ev.Event) -> None:
        cls = event.__class__
        if isinstance(event, ev.Relation):
            self._table(event)
            return
        if cls is ev.TypeInfo or cls is ev.Origin:
            return
        if self._stream_xid is not None and cls is not ev.StreamStop:
            self._streams.setdefault(self._stream_xid, []).append(event)
            return
        if self._held is not None:
            if isinstance(event, ev.Commit):
                self._release(event)
                return
            if isinstance(event, ev.Prepare):
                begin = self._held[0]
                assert isinstance(begin, ev.Begin)
                self._prepared[event.gid] = (begin.xid, self._held[1:])
                self._held = None
                return
            if cls is ev.Begin:
                self.dropped += len(self._held)  # the held transaction never finished
                self._held = None
            elif not isinstance(event, ev.Message) or event.transactional:
                self._held.append(event)  # (a non-transactional message is written at once, below)
                return
        if (
            self._preparing is not None
            and cls in _ROW_EVENTS
            and (not isinstance(event, ev.Message) or event.transactional)
        ):
            self._preparing.append(event)
            return
        handler = _DISPATCH.get(cls)
        if handler is None:
            raise TypeError(f"not an event: {event!r}")
        handler(self, event)

    def _begin(self, e: ev.Begin) -> None:
        if not e.final_lsn:
            self._held = [e]
            return
        self._start_txn(e.xid, e.final_lsn, e.commit_time)

    def _commit(self, e: ev.Commit) -> None:
        self._end_txn()

    def _release(self, end: ev.Commit) -> None:
        held = self._held
        assert held is not None
        self._held = None
        begin = held[0]
        assert isinstance(begin, ev.Begin)
        xid = begin.xid if begin.xid is not None else end.xid
        ctime = end.commit_time if end.commit_time is not None else begin.commit_time
        self._replay(held[1:], xid, end.commit_lsn, ctime)

    def _replay(self, events: Iterable[ev.Event], xid: int | None, commit_lsn: int, commit_time: int | None) -> None:
        self._start_txn(xid, commit_lsn, commit_time)
        for e in events:
            handler = _DISPATCH[e.__class__]
            handler(self, e)
        self._end_txn()

    def _start_txn(self, xid: int | None, commit_lsn: int | None, commit_time: int | None) -> None:
        self._xid = xid
        self._commit_lsn = commit_lsn or None
        self._commit_us = None if commit_time is None else commit_time + _PG_EPOCH_US
        self._total = 0
        self._per_table = {}

    def _end_txn(self) -> None:
        self._start_txn(None, None, None)

    # streamed transactions that were not made whole before this encoder

    def _stream_start(self, e: ev.StreamStart) -> None:
        if e.first:
            self._streams.pop(e.xid, None)  # a new session sends the transaction again from its start
        self._stream_xid = e.xid

    def _stream_stop(self, e: ev.StreamStop) -> None:
        self._stream_xid = None

    def _stream_commit(self, e: ev.StreamCommit) -> None:
        self._replay(self._streams.pop(e.xid, ()), e.xid, e.commit_lsn, e.commit_time)

    def _stream_abort(self, e: ev.StreamAbort) -> None:
        chunks = self._streams.get(e.xid)
        if chunks is None:
            return
        if e.subxid == e.xid:
            self.dropped += len(chunks)
            del self._streams[e.xid]
            return
        kept = [c for c in chunks if getattr(c, "xid", None) != e.subxid]
        self.dropped += len(chunks) - len(kept)
        self._streams[e.xid] = kept

    def _stream_prepare(self, e: ev.StreamPrepare) -> None:
        self._prepared[e.gid] = (e.xid, self._streams.pop(e.xid, []))

    # two-phase

    def _begin_prepare(self, e: ev.BeginPrepare) -> None:
        self._preparing = []
        self._preparing_xid = e.xid

    def _prepare(self, e: ev.Prepare) -> None:
        self._prepared[e.gid] = (e.xid if e.xid is not None else self._preparing_xid, self._preparing or [])
        self._preparing = None

    def _commit_prepared(self, e: ev.CommitPrepared) -> None:
        prepared = self._prepared.pop(e.gid, None)
        if prepared is None:
            raise DecodeError(
                f"COMMIT PREPARED '{e.gid}' of a transaction prepared before this run: its rows were "
                "confirmed at PREPARE and cannot be written any more; --format debezium needs a slot "
                "without two-phase decoding (create it without --two-phase)"
            )
        xid, events = prepared
        self._replay(events, e.xid if e.xid is not None else xid, e.commit_lsn, e.commit_time)

    def _rollback_prepared(self, e: ev.RollbackPrepared) -> None:
        prepared = self._prepared.pop(e.gid, None)
        if prepared is not None:
            self.dropped += len(prepared[1])

    # --- envelopes ------------------------------------------------------------------------

    def _table(self, rel: ev.Relation) -> _Table:
        t = self._tables.get(id(rel))
        if t is None or t.relation is not rel:
            if rel.oid:  # a new Relation replaces the table's old one (ALTER TABLE): forget that
                old = self._by_oid.get(rel.oid)
                if old is not None and old != id(rel):
                    self._tables.pop(old, None)
                self._by_oid[rel.oid] = id(rel)
            t = self._tables[id(rel)] = _Table(rel, self.server, self.schemas)
        return t

    def _source(self, t: _Table | None, lsn: int, snapshot: str = "false") -> Record:
        commit_us = self._commit_us
        commit = self._commit_lsn
        return {
            "version": VERSION,
            "connector": CONNECTOR,
            "name": self.server,
            "ts_ms": None if commit_us is None else commit_us // 1000,
            "snapshot": snapshot,
            "db": self.database,
            "sequence": _dumps([None if commit is None else str(commit), str(lsn) if lsn else None]).decode(),
            "ts_us": commit_us,
            "ts_ns": None if commit_us is None else commit_us * 1000,
            "schema": "" if t is None else t.schema,
            "table": "" if t is None else t.table,
            "txId": self._xid,
            "lsn": lsn or None,
            "xmin": None,
        }

    def _transaction(self, t: _Table) -> Record | None:
        if self._xid is None or self._commit_lsn is None:
            return None
        self._total += 1
        key = (t.schema, t.table)
        n = self._per_table[key] = self._per_table.get(key, 0) + 1
        return {"id": f"{self._xid}:{self._commit_lsn}", "total_order": self._total, "data_collection_order": n}

    def _envelope(self, t: _Table, op: str, before: object, after: object, lsn: int) -> None:
        now_us = int(self._clock() * 1_000_000)
        rec = {
            "before": before,
            "after": after,
            "source": self._source(t, lsn),
            "transaction": self._transaction(t),
            "op": op,
            "ts_ms": now_us // 1000,
            "ts_us": now_us,
            "ts_ns": now_us * 1000,
        }
        self._emit(t.schema_json, rec)

    def _emit(self, schema_json: bytes, rec: Record) -> None:
        if self.schemas:
            self._write(b'{"schema":' + schema_json + b',"payload":' + _dumps(rec) + b"}\n")
        else:
            self._write(_dumps(rec, option=_OPT))

    def _old(self, t: _Table, old: ev.Tuple | None, kind: ev.OldKind) -> dict[str, object] | None:
        """The before image: the whole old row (REPLICA IDENTITY FULL), or the key columns with
        every other column null (a key change or delete under a key identity), as Debezium does."""
        if old is None:
            return None
        return t.image(old, key_only=kind == "K" and bool(t.key))

    def _insert(self, e: ev.Insert) -> None:
        t = self._table(e.relation)
        self._envelope(t, "c", None, t.image(e.new), e.lsn)

    def _update(self, e: ev.Update) -> None:
        t = self._table(e.relation)
        if e.old_kind == "K" and e.old is not None:
            # the key changed (the server sends a key image only then): like Debezium, a delete of
            # the old key and a create of the new row, so that consumers keyed by it stay right
            self._envelope(t, "d", self._old(t, e.old, e.old_kind), None, e.lsn)
            self._envelope(t, "c", None, t.image(e.new), e.lsn)
            return
        self._envelope(t, "u", self._old(t, e.old, e.old_kind), t.image(e.new), e.lsn)

    def _delete(self, e: ev.Delete) -> None:
        t = self._table(e.relation)
        self._envelope(t, "d", self._old(t, e.old, e.old_kind), None, e.lsn)

    def _truncate(self, e: ev.Truncate) -> None:
        for rel in e.relations:
            self._envelope(self._table(rel), "t", None, None, e.lsn)

    def _message(self, e: ev.Message) -> None:
        now_us = int(self._clock() * 1_000_000)
        transactional = e.transactional and self._xid is not None
        if not transactional:
            saved = (self._xid, self._commit_lsn, self._commit_us)
            self._xid = self._commit_lsn = self._commit_us = None
        source = self._source(None, e.lsn)
        if not transactional:
            self._xid, self._commit_lsn, self._commit_us = saved
        rec = {
            "source": source,
            "op": "m",
            "ts_ms": now_us // 1000,
            "ts_us": now_us,
            "ts_ns": now_us * 1000,
            "message": {"prefix": e.prefix, "content": base64.b64encode(e.content).decode("ascii")},
        }
        self._emit(_message_schema(self.server), rec)

    # --- snapshot rows (pgrecv snapshot) ----------------------------------------------------

    def snapshot_rows(self, relation: ev.Relation, rows: Iterable[ev.Tuple], snapshot_lsn: int) -> int:
        """One ``op: "r"`` envelope per row (a table's rows as of ``snapshot_lsn``); returns the count.

        ``source.snapshot`` is ``"true"``, ``source.lsn`` the slot's consistent point, ``txId`` null.
        """
        t = self._table(relation)
        n = 0
        for tup in rows:
            now_us = int(self._clock() * 1_000_000)
            source = self._source(t, snapshot_lsn, snapshot="true")
            source["ts_ms"], source["ts_us"], source["ts_ns"] = now_us // 1000, now_us, now_us * 1000
            rec = {
                "before": None,
                "after": t.image(tup),
                "source": source,
                "transaction": None,
                "op": "r",
                "ts_ms": now_us // 1000,
                "ts_us": now_us,
                "ts_ns": now_us * 1000,
            }
            self._emit(t.schema_json, rec)
            n += 1
        return n


_DISPATCH: Final[dict[type, Callable[[DebeziumEncoder, Any], None]]] = {
    ev.Begin: DebeziumEncoder._begin,
    ev.Commit: DebeziumEncoder._commit,
    ev.Insert: DebeziumEncoder._insert,
    ev.Update: DebeziumEncoder._update,
    ev.Delete: DebeziumEncoder._delete,
    ev.Truncate: DebeziumEncoder._truncate,
    ev.Message: DebeziumEncoder._message,
    ev.StreamStart: DebeziumEncoder._stream_start,
    ev.StreamStop: DebeziumEncoder._stream_stop,
    ev.StreamCommit: DebeziumEncoder._stream_commit,
    ev.StreamAbort: DebeziumEncoder._stream_abort,
    ev.StreamPrepare: DebeziumEncoder._stream_prepare,
    ev.BeginPrepare: DebeziumEncoder._begin_prepare,
    ev.Prepare: DebeziumEncoder._prepare,
    ev.CommitPrepared: DebeziumEncoder._commit_prepared,
    ev.RollbackPrepared: DebeziumEncoder._rollback_prepared,
}
_ROW_EVENTS: Final = frozenset({ev.Insert, ev.Update, ev.Delete, ev.Truncate, ev.Message})


# --- the schema block (JsonConverter's schemas.enable) ------------------------------------------


def _field(name: str, schema: dict[str, object], optional: bool) -> dict[str, object]:
    return {**schema, "optional": optional, "field": name}


_SOURCE_SCHEMA: Final[dict[str, object]] = {
    "type": "struct",
    "name": "io.debezium.connector.postgresql.Source",
    "optional": False,
    "field": "source",
    "fields": [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "name"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {"type": "string", "optional": True, "field": "snapshot"},
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": True, "field": "sequence"},
        {"type": "int64", "optional": True, "field": "ts_us"},
        {"type": "int64", "optional": True, "field": "ts_ns"},
        {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"},
        {"type": "int64", "optional": True, "field": "txId"},
        {"type": "int64", "optional": True, "field": "lsn"},
        {"type": "int64", "optional": True, "field": "xmin"},
    ],
}
_TRANSACTION_SCHEMA: Final[dict[str, object]] = {
    "type": "struct",
    "name": "event.block",
    "version": 1,
    "optional": True,
    "field": "transaction",
    "fields": [
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": False, "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"},
    ],
}
_TIMES: Final[list[dict[str, object]]] = [
    {"type": "int64", "optional": True, "field": "ts_ms"},
    {"type": "int64", "optional": True, "field": "ts_us"},
    {"type": "int64", "optional": True, "field": "ts_ns"},
]


def _envelope_schema(t: _Table, server: str) -> bytes:
    """The Envelope schema of a table. pgrecv does not know which columns are NOT NULL: only the
    replica identity's key columns are marked required."""
    base = f"{server}.{t.schema}.{t.table}"
    value_fields = [
        _field(name, codec.schema, optional=name not in t.key or len(t.key) == len(t.names))
        for name, codec in zip(t.names, t.codecs, strict=True)
    ]

    def value(field: str) -> dict[str, object]:
        return {"type": "struct", "fields": value_fields, "optional": True, "name": f"{base}.Value", "field": field}

    schema = {
        "type": "struct",
        "fields": [
            value("before"),
            value("after"),
            _SOURCE_SCHEMA,
            _TRANSACTION_SCHEMA,
            {"type": "string", "optional": False, "field": "op"},
            *_TIMES,
        ],
        "optional": False,
        "name": f"{base}.Envelope",
        "version": 2,
    }
    return _dumps(schema)


def _message_schema(server: str) -> bytes:
    schema = {
        "type": "struct",
        "fields": [
            _SOURCE_SCHEMA,
            {"type": "string", "optional": False, "field": "op"},
            *_TIMES,
            {
                "type": "struct",
                "fields": [
                    {"type": "string", "optional": False, "field": "prefix"},
                    {"type": "bytes", "optional": True, "field": "content"},
                ],
                "optional": False,
                "name": "io.debezium.connector.postgresql.Message",
                "field": "message",
            },
        ],
        "optional": False,
        "name": "io.debezium.connector.postgresql.MessageValue",
    }
    return _dumps(schema)
