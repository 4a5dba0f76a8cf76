"""The pipeline stage: plugin messages in stream order to the records the output gets, and its units.

It sits between the decoder and the encoder and is the one implementation of, for ``start``
(through :class:`~pgrecv.stream.streamer.Streamer`), ``peek`` and ``snapshot`` (table globs only):

* resume skip: a transaction whose Begin says it commits at or before ``skip_until`` is in the
  output already (delivery is at-least-once) and is dropped whole;
* transaction tracking (:attr:`Pipeline.in_txn`) and unit boundaries: after the last record of a
  commit, a PREPARE, a COMMIT/ROLLBACK PREPARED or a non-transactional message it calls
  ``boundary(commit_lsn, end_lsn, counted)`` (``counted`` is False for a transaction that held
  only heartbeats and was left out);
* filters: ``--table``/``--exclude-table`` globs (:func:`table_filter`) and ``--op``
  (:func:`parse_ops`); a Truncate keeps only its kept tables;
* heartbeats (``start --heartbeat`` without ``--keep-heartbeats``): a transaction's Begin is held
  back until the transaction shows it is not only a heartbeat.

Contract: a handler (:meth:`Pipeline.handler` for decoded output, :meth:`Pipeline.raw_handler`
for the plugin's bytes without decoding) is called once per plugin message with the message and
its LSN; what passes goes to ``emit(event, message)``. :attr:`Pipeline.fast` is an optional
fused row encoder (:class:`pgrecv.output.fastpath.FastRows`) tried before decoding, when nothing is
filtered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgrecv import events as ev
from pgrecv.decode.kinds import (
    BEGIN,
    BEGIN_PREPARE,
    COMMIT,
    COMMIT_PREPARED,
    MESSAGE,
    PREPARE,
    ROLLBACK_PREPARED,
)
from pgrecv.errors import UsageError
from pgrecv.filters import table_filter
from pgrecv.stream.heartbeat import is_heartbeat

if TYPE_CHECKING:
    from pgrecv.output.fastpath import FastRows

OPS = ("insert", "update", "delete", "truncate", "message")

Emit = Callable[[ev.Event, Any], None]  # (event, the plugin's message)
Boundary = Callable[[int, int, bool], None]  # (commit LSN, end LSN, counted)
Handler = Callable[[Any, int], None]  # (the plugin's message, its LSN)


def parse_ops(value: str | None) -> frozenset[str] | None:
    """--op as a set; None (no filter) only when --op is not given. An empty list would drop
    every row while the slot advances past them, so '' and ',' are refused."""
    if value is None:
        return None
    ops = frozenset(o.strip() for o in value.split(",") if o.strip())
    if not ops:
        raise UsageError(f"--op {value!r} names no operation: choose from {', '.join(OPS)}, or leave --op out")
    unknown = sorted(ops - set(OPS))
    if unknown:
        raise UsageError(f"unknown --op {', '.join(unknown)}: choose from {', '.join(OPS)}")
    return ops


@dataclass
class Counts:
    """What the pipeline let through."""

    rows: int = 0
    heartbeats: int = 0  # heartbeat transactions received and left out of the output
    last_commit_time: int | None = None  # of the last transaction let through, PostgreSQL microseconds


def _no_boundary(commit_lsn: int, end_lsn: int, counted: bool) -> None:
    pass


class Pipeline:
    def __init__(
        self,
        emit: Emit,
        *,
        boundary: Boundary = _no_boundary,
        tables: Sequence[str] = (),
        exclude_tables: Sequence[str] = (),
        ops: frozenset[str] | None = None,
        skip_until: int = 0,
        drop_heartbeats: bool = False,
        counts: Counts | None = None,
    ) -> None:
        self.emit_now = emit
        self.boundary = boundary
        self.keep_table = table_filter(tables, exclude_tables)
        self.ops = ops
        self.skip_until = skip_until  # transactions committing at or before this are dropped
        self.drop_heartbeats = drop_heartbeats
        self.counts = Counts() if counts is None else counts
        self.in_txn = False
        self.skipping = False  # inside a transaction dropped by the resume skip
        self.fast: FastRows | None = None
        # a Begin held back until the transaction shows it is not a heartbeat (drop_heartbeats)
        self.held_begin: tuple[ev.Event, bytes] | None = None
        self._held_fast: FastRows | None = None
        self._heartbeat_txn = False

    @property
    def filters(self) -> bool:
        """Whether tables or operations are filtered (the fused row path cannot filter)."""
        return self.keep_table is not None or self.ops is not None

    def reset(self) -> None:
        """The stream was cut: what comes next starts at a transaction boundary. A transaction
        cut by the loss will come again in full; its held Begin is forgotten."""
        self.in_txn = False
        self.release_held(emit=False)

    def release_held(self, *, emit: bool) -> None:
        """End the hold on a transaction's Begin: emit it (the transaction has content) or
        forget it (a heartbeat, or a transaction cut by a lost connection)."""
        held = self.held_begin
        if held is None:
            return
        self.held_begin = None
        self.fast = self._held_fast
        self._held_fast = None
        if emit:
            self.emit_now(*held)

    def _emitter(self) -> Emit:
        emit_now = self.emit_now
        if not self.drop_heartbeats:
            return emit_now

        def emit(event: ev.Event, msg: Any) -> None:
            if self.held_begin is not None:  # the transaction has content: its Begin first
                self.release_held(emit=True)
            emit_now(event, msg)

        return emit

    # --- decoded messages ------------------------------------------------------------------------

    def handler(self, decode: Callable[[Any, int], ev.Event | None]) -> Handler:
        """The per-message function for a decoded stream."""
        keep = self.keep_table
        ops = self.ops
        counts = self.counts
        skip_until = self.skip_until
        drop_heartbeats = self.drop_heartbeats
        boundary = self.boundary
        emit = self._emitter()

        def make_row(op: str) -> Callable[[ev.Insert | ev.Update | ev.Delete, Any, int], None]:
            wanted = ops is None or op in ops

            def row(event: ev.Insert | ev.Update | ev.Delete, msg: Any, lsn: int) -> None:
                if self.skipping or not wanted:
                    return
                if keep is not None:
                    rel = event.relation
                    if not keep(rel.namespace, rel.name):
                        return
                counts.rows += 1
                emit(event, msg)

            return row

        def begin(event: ev.Begin, msg: Any, lsn: int) -> None:
            self.in_txn = True
            self.skipping = 0 < event.final_lsn <= skip_until
            if self.skipping:
                return
            if drop_heartbeats:  # held until the transaction shows it is not only a heartbeat
                self.release_held(emit=False)
                self.held_begin, self._held_fast, self.fast = (event, bytes(msg)), self.fast, None
                self._heartbeat_txn = False
            else:
                emit(event, msg)

        def commit(event: ev.Commit, msg: Any, lsn: int) -> None:
            self.in_txn = False
            if self.skipping:
                self.skipping = False
                return
            if self._heartbeat_txn and self.held_begin is not None:
                # heartbeats only: confirmed like any transaction, not written
                self.release_held(emit=False)
                self._heartbeat_txn = False
                boundary(event.commit_lsn, event.end_lsn or lsn, False)
                return
            emit(event, msg)
            counts.last_commit_time = event.commit_time
            boundary(event.commit_lsn, event.end_lsn or lsn, True)

        def truncate(event: ev.Truncate, msg: Any, lsn: int) -> None:
            if self.skipping or (ops is not None and "truncate" not in ops):
                return
            if keep is not None:
                kept = tuple(r for r in event.relations if keep(r.namespace, r.name))
                if not kept:
                    return
                if len(kept) != len(event.relations):
                    event = ev.Truncate(kept, event.cascade, event.restart_identity, event.xid, event.lsn)
            emit(event, msg)

        def message(event: ev.Message, msg: Any, lsn: int) -> None:
            if drop_heartbeats and is_heartbeat(event.prefix, event.transactional):
                if not self.skipping:
                    counts.heartbeats += 1
                    self._heartbeat_txn = True
                return
            if not (self.skipping or (ops is not None and "message" not in ops)):
                emit(event, msg)
            if not event.transactional and not self.in_txn:
                boundary(lsn, lsn, True)

        def relation(event: ev.Relation, msg: Any, lsn: int) -> None:
            if keep is None or keep(event.namespace, event.name):
                emit(event, msg)

        def begin_prepare(event: ev.BeginPrepare, msg: Any, lsn: int) -> None:
            self.in_txn = True
            emit(event, msg)

        def prepare(event: ev.Prepare, msg: Any, lsn: int) -> None:
            self.in_txn = False
            emit(event, msg)
            boundary(event.prepare_lsn, event.end_lsn, True)

        def commit_prepared(event: ev.CommitPrepared, msg: Any, lsn: int) -> None:
            emit(event, msg)
            boundary(event.commit_lsn, event.end_lsn, True)

        def rollback_prepared(event: ev.RollbackPrepared, msg: Any, lsn: int) -> None:
            emit(event, msg)
            boundary(event.prepare_end_lsn, event.rollback_end_lsn, True)

        def other(event: ev.Event, msg: Any, lsn: int) -> None:  # Origin, TypeInfo, unassembled stream records
            emit(event, msg)

        on: dict[type[Any], Callable[[Any, Any, int], None]] = {
            ev.Insert: make_row("insert"),
            ev.Update: make_row("update"),
            ev.Delete: make_row("delete"),
            ev.Begin: begin,
            ev.Commit: commit,
            ev.Truncate: truncate,
            ev.Message: message,
            ev.Relation: relation,
            ev.BeginPrepare: begin_prepare,
            ev.Prepare: prepare,
            ev.CommitPrepared: commit_prepared,
            ev.RollbackPrepared: rollback_prepared,
        }
        dispatch = on.get
        fallback: Callable[[Any, Any, int], None] = other

        def handle(msg: Any, lsn: int) -> None:
            fast = self.fast
            if fast is not None and not self.skipping and fast.row(msg, lsn):
                counts.rows += 1
                return
            event = decode(msg, lsn)
            if event is not None:
                dispatch(type(event), fallback)(event, msg, lsn)

        return handle

    # --- the plugin's bytes, undecoded ------------------------------------------------------------

    def raw_handler(self, write: Callable[[Any], object], plugin: str) -> Handler:
        """The per-message function when nothing needs decoding (raw output, no filter): every
        message is written, and boundaries are found in the bytes (pgoutput) or the text
        (test_decoding). No resume skip: the server already starts after the output's end."""
        boundary = self.boundary

        if plugin == "pgoutput":

            def handle(msg: Any, lsn: int) -> None:
                write(msg)
                write(b"\n")
                kind = msg[0]
                if kind in (BEGIN, BEGIN_PREPARE):
                    self.in_txn = True
                elif kind in (COMMIT, PREPARE):  # the end LSN is where the message is
                    self.in_txn = False
                    boundary(int.from_bytes(msg[2:10], "big"), lsn, True)
                elif kind in (COMMIT_PREPARED, ROLLBACK_PREPARED):  # top level, outside a transaction
                    boundary(int.from_bytes(msg[2:10], "big"), lsn, True)
                elif kind == MESSAGE and not self.in_txn and not (msg[1] & 1):  # non-transactional
                    boundary(lsn, lsn, True)

            return handle

        def handle_text(msg: Any, lsn: int) -> None:
            write(msg)
            write(b"\n")
            head = bytes(msg[:20])
            if head.startswith(b"BEGIN"):
                self.in_txn = True
            elif head.startswith((b"COMMIT", b"PREPARE TRANSACTION", b"ROLLBACK PREPARED")):
                self.in_txn = False
                boundary(lsn, lsn, True)
            elif not self.in_txn and head.startswith(b"message: transactional: 0"):
                boundary(lsn, lsn, True)

        return handle_text
