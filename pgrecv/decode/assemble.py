"""Make pgoutput's streamed transactions whole again, before decoding.

With ``streaming on|parallel`` (protocol 2+), the server sends a large transaction while it is still
in progress, in chunks::

    S xid first=1 | R/Y/I/U/D/T/M with an xid prefix ... | E
    (plain B ... C transactions, other chunks, Stream Aborts of subtransactions)
    S xid first=0 | ... | E
    c xid (Stream Commit)   or   A xid xid (Stream Abort)   or   p (Stream Prepare, two-phase)

:class:`StreamAssembler` sits between the socket and the decoder. It looks only at the first byte of
each message and the fixed header fields it needs, never at rows. Messages outside chunks pass
through untouched. Chunk contents are buffered per top-level xid; at Stream Commit the whole
transaction comes out, in commit order, *framed as if it had never been streamed*:

* a synthesised Begin ``B`` (final_lsn = commit_lsn, commit_time, xid, all from the Stream Commit),
* the buffered messages in arrival order with the Int32 xid prefix removed, minus every message of
  a rolled-back subtransaction,
* a synthesised Commit ``C`` (flags, commit_lsn, end_lsn, commit_time from the Stream Commit).

A Stream Prepare becomes Begin Prepare ``b`` + messages + Prepare ``P`` (protocol 3 layouts), so a
later Commit Prepared / Rollback Prepared (which pass through) finds the same picture as for a
non-streamed two-phase transaction. Stream Start/Stop/Commit/Abort/Prepare themselves are consumed:
the decoder never sees a streamed chunk, and its relation cache sees the transaction's Relation and
Type messages exactly where they belong, at replay.

Synthesised messages carry as LSN: ``B``/``b`` the XLogData start of the first chunk's Stream Start
(the transaction's first change, as for a plain Begin), ``C``/``P`` the XLogData start of the Stream
Commit/Prepare. Buffered messages keep their own.

Rolled-back subtransactions: inside a chunk, the xid prefix of R, Y, I, U, D, T and M is the xid of
the (sub)transaction that made the change (pgoutput's ``change->txn->xid``), so a Stream Abort with
``subxid != xid`` drops every message carrying that subxid, *including Relation and Type messages*.
That is safe: on any Stream Abort pgoutput forgets that it sent those schemas in this transaction
(``cleanup_rel_sync_cache(top xid)`` clears the per-transaction ``streamed_txns`` mark) and sends
them again before the next row that needs them; PostgreSQL's own apply worker discards them the same
way. Keeping them would even be wrong when the subtransaction altered the table. The Origin message
that may follow the first Stream Start has no xid prefix and always belongs to the transaction.

Empty results: a committed streamed transaction left with no message (nothing published, or only
rolled-back subtransactions) produces nothing, like a non-streamed one since PostgreSQL 15. A
Stream Prepare always produces ``b`` + ``P`` because Begin Prepare is never skipped upstream either.

Reconnects: a new decoding session streams every unfinished transaction again from its first
change, with ``first=1``. A Stream Start with ``first=1`` for an xid already buffered therefore
discards the old buffer and starts over; so does a plain Begin (``B``/``b``) for a buffered xid (the
new session did not need to stream it). :meth:`StreamAssembler.reset` drops everything at once.

Errors: :class:`~pgrecv.errors.DecodeError` for what cannot be assembled: a Stream Stop outside a
chunk, a non-first Stream Start or a Stream Commit/Prepare for an xid not buffered (its beginning was
lost), a plain-transaction or control message inside a chunk, truncated control messages. A Stream
Abort for an xid or subxid never seen is not an error: PostgreSQL sends aborts for subtransactions
whose changes were never sent (observed on 15), and there is nothing to drop.

Confirming positions: while :attr:`StreamAssembler.idle` is false a streamed transaction is open, so
a keepalive's position must not be confirmed as if everything before it were in the output.

Memory: buffers are bytearrays of records (Int32 length, Int64 lsn, the message exactly as received),
with no Python object per message; the xid prefix is cut at replay, in place, so buffering is two
appends. When the total exceeds ``memory_limit`` the largest in-memory buffer is written to an
anonymous temporary file (created in ``spill_dir`` and unlinked at once, so nothing is left behind
even after ``kill -9``); a spilled transaction keeps only a small tail in memory. Replay reads the
file back in blocks. Peak memory is about ``memory_limit`` plus a few MiB whatever the transaction
size (plus, unavoidably, the largest single message).
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from collections.abc import Generator, Iterable, Iterator
from typing import Final

from pgrecv.decode import kinds as K
from pgrecv.errors import DecodeError, OutputError

Payload = bytes | memoryview
"""One pgoutput message: the XLogData payload. psycopg hands out memoryviews; both are accepted."""

Item = tuple[Payload, int]

_REC: Final = struct.Struct(">IQ")  # record header: message length (| _NO_XID), lsn; then the message
_REC_SIZE: Final = _REC.size
_NO_XID: Final = 0x8000_0000  # length flag: the message has no xid prefix (Origin)
_LEN_MASK: Final = 0x7FFF_FFFF
_NEVER: Final = 1 << 62
_XID: Final = struct.Struct(">I")
_STREAM_START: Final = struct.Struct(">IB")  # xid, first segment
_STREAM_ABORT: Final = struct.Struct(">II")  # xid, subxid (+ abort lsn, abort time: proto 4, parallel)
_STREAM_COMMIT: Final = struct.Struct(">IBQQq")  # xid, flags, commit lsn, end lsn, commit time
_BEGIN: Final = struct.Struct(">QqI")  # final lsn, commit time, xid
_COMMIT: Final = struct.Struct(">BQQq")  # flags, commit lsn, end lsn, commit time
_PREPARE: Final = struct.Struct(">BQQqI")  # flags, prepare lsn, end lsn, prepare time, xid; then gid
_BEGIN_PREPARE: Final = struct.Struct(">QQqI")  # prepare lsn, end lsn, prepare time, xid; then gid

_SPILL_TAIL: Final = 1 << 20  # a spilled transaction writes its in-memory tail out at this size
_READ_BLOCK: Final = 1 << 20  # replay reads spill files in blocks of this size

# First bytes (as ints, like payload[0]) the assembler must look at, by state.
_BUFFERED: Final = frozenset(b"RYIUDT")  # xid-prefixed inside a chunk, always buffered (M: see _in_chunk)
_CONTROL: Final = frozenset(b"SEcAp")  # stream control
_CONTROL_OPEN: Final = _CONTROL | frozenset(b"Bb")  # ... plus plain begins that may restart a buffered xid
_EVERYTHING: Final = frozenset(range(256))  # inside a chunk every message is buffered


def _err(what: str) -> DecodeError:
    return DecodeError(f"pgoutput stream: {what}; reconnect so the server sends the transaction again")


class _Txn:
    """One buffered top-level transaction."""

    __slots__ = ("aborted", "buf", "fd", "first_lsn", "flush_at", "path", "spilled", "xid")

    def __init__(self, xid: int, first_lsn: int) -> None:
        self.xid = xid
        self.first_lsn = first_lsn
        self.buf = bytearray()  # records not (yet) spilled
        self.aborted: set[int] = set()  # rolled-back subxids, filtered at replay
        self.fd = -1  # anonymous spill file, -1 until the first spill
        self.path: str | None = None  # set only if the file could not be unlinked at once
        self.spilled = 0  # bytes in the spill file
        self.flush_at = _NEVER  # tail size at which a spilled transaction writes out its tail

    def discard(self) -> None:
        self.buf = bytearray()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.path = None
        self.spilled = 0


class StreamAssembler:
    """Byte-level stage before the pgoutput decoder: see the module docstring.

    Use::

        for msg, lsn in assembler.feed(payload, xlogdata_start):
            decoder.decode(msg, lsn)

    ``feed`` returns a 1-tuple for a message that passes through (the common case) and an iterator
    for a finished transaction; consume it fully before the next ``feed``. Callers wanting the last
    nanoseconds may test :meth:`passes` first and decode directly when it is true.
    """

    def __init__(self, memory_limit: int = 64 << 20, spill_dir: str | None = None) -> None:
        if memory_limit < 0:
            raise ValueError("memory_limit must be >= 0")
        self.memory_limit = memory_limit
        self.spill_dir = spill_dir
        self._txns: dict[int, _Txn] = {}
        self._chunk: _Txn | None = None  # the transaction whose chunk is open
        self._memory = 0  # bytes in all in-memory buffers
        self._watch: frozenset[int] = _CONTROL  # first bytes that leave the fast path
        self._replaying: set[_Txn] = set()  # handed out in an iterator not yet finished

    # --- state ---------------------------------------------------------------------------

    @property
    def open_transactions(self) -> int:
        """Streamed transactions buffered and not yet committed, aborted or prepared."""
        return len(self._txns)

    @property
    def in_chunk(self) -> bool:
        """Between a Stream Start and its Stream Stop."""
        return self._chunk is not None

    @property
    def idle(self) -> bool:
        """Nothing buffered and no chunk open: a keepalive position may be confirmed."""
        return not self._txns

    @property
    def memory_bytes(self) -> int:
        return self._memory

    @property
    def spilled_bytes(self) -> int:
        return sum(t.spilled for t in self._txns.values())

    @property
    def pending_bytes(self) -> int:
        """Bytes buffered for open transactions, in memory and on disk."""
        return self._memory + self.spilled_bytes

    def passes(self, payload: Payload) -> bool:
        """True when ``feed(payload, lsn)`` would return just ``((payload, lsn),)``."""
        return bool(payload) and payload[0] not in self._watch

    # --- the stage -----------------------------------------------------------------------

    def feed(self, payload: Payload, lsn: int) -> Iterable[Item]:
        """One raw pgoutput message in, the messages to decode now out (in order)."""
        try:
            kind = payload[0]
        except IndexError:
            raise DecodeError("pgoutput stream: empty message; check the plugin is pgoutput") from None
        if kind not in self._watch:
            return ((payload, lsn),)
        chunk = self._chunk
        if chunk is not None:
            if kind in _BUFFERED:  # the bulk of a chunk: inlined
                size = len(payload)
                if size < 5:
                    raise _err(f"message {chr(kind)!r} of {size} bytes inside a chunk has no xid")
                buf = chunk.buf
                buf += _REC.pack(size, lsn)
                buf += payload
                self._memory += size + _REC_SIZE
                if self._memory > self.memory_limit or len(buf) >= chunk.flush_at:
                    self._relieve(chunk)
                return ()
            return self._in_chunk(chunk, kind, payload, lsn)
        if kind == K.STREAM_START:
            self._stream_start(payload, lsn)
            return ()
        if kind == K.STREAM_COMMIT:
            return self._stream_commit(payload, lsn)
        if kind == K.STREAM_ABORT:
            self._stream_abort(payload)
            return ()
        if kind == K.STREAM_PREPARE:
            return self._stream_prepare(payload, lsn)
        if kind == K.STREAM_STOP:
            raise _err("Stream Stop outside a streamed chunk")
        # 'B' / 'b' while transactions are buffered: a new session may send one of them unstreamed
        off = 17 if kind == K.BEGIN else 25
        if len(payload) >= off + 4:
            (xid,) = _XID.unpack_from(payload, off)
            if xid in self._txns:
                self._drop(self._txns[xid])
        return ((payload, lsn),)

    def _in_chunk(self, txn: _Txn, kind: int, payload: Payload, lsn: int) -> Iterable[Item]:
        if kind == K.MESSAGE:
            if len(payload) < 6:
                raise _err(f"message 'M' of {len(payload)} bytes inside a chunk is truncated")
            if not payload[5] & 1:  # non-transactional: belongs to no transaction, out at once
                return ((bytes(payload[:1]) + bytes(payload[5:]), lsn),)
            self._append(txn, payload, lsn, 0)
            return ()
        if kind == K.STREAM_STOP:
            self._chunk = None
            self._watch = _CONTROL_OPEN
            return ()
        if kind == K.ORIGIN:  # right after the first Stream Start: no xid prefix
            self._append(txn, payload, lsn, _NO_XID)
            return ()
        raise _err(f"unexpected message {chr(kind)!r} inside the streamed chunk of transaction {txn.xid}")

    def _append(self, txn: _Txn, payload: Payload, lsn: int, flag: int) -> None:
        txn.buf += _REC.pack(len(payload) | flag, lsn)
        txn.buf += payload
        self._memory += len(payload) + _REC_SIZE
        if self._memory > self.memory_limit or len(txn.buf) >= txn.flush_at:
            self._relieve(txn)

    def _relieve(self, txn: _Txn) -> None:
        """Over the memory limit: spill the largest buffer; or write out a spilled one's tail."""
        if len(txn.buf) >= txn.flush_at:
            self._spill(txn)
        if self._memory > self.memory_limit:
            self._spill(max(self._txns.values(), key=lambda t: len(t.buf)))

    # --- control messages ----------------------------------------------------------------

    def _stream_start(self, payload: Payload, lsn: int) -> None:
        if len(payload) < 6:
            raise _err(f"Stream Start of {len(payload)} bytes, expected 6")
        xid, first = _STREAM_START.unpack_from(payload, 1)
        txn = self._txns.get(xid)
        if first:
            if txn is not None:  # streamed again from the start (new decoding session): start over
                self._drop(txn)
            txn = self._txns[xid] = _Txn(xid, lsn)
        elif txn is None:
            raise _err(f"Stream Start (not first) for transaction {xid} whose first chunk never came")
        self._chunk = txn
        self._watch = _EVERYTHING

    def _stream_abort(self, payload: Payload) -> None:
        if len(payload) < 9:
            raise _err(f"Stream Abort of {len(payload)} bytes, expected 9 or 25")
        xid, subxid = _STREAM_ABORT.unpack_from(payload, 1)
        txn = self._txns.get(xid)
        if txn is None:
            return  # nothing buffered, nothing to drop
        if subxid == xid:
            self._drop(txn)
            return
        txn.aborted.add(subxid)
        if txn.buf:
            self._compact(txn)

    def _stream_commit(self, payload: Payload, lsn: int) -> Iterable[Item]:
        if len(payload) < 30:
            raise _err(f"Stream Commit of {len(payload)} bytes, expected 30")
        xid, flags, commit_lsn, end_lsn, commit_time = _STREAM_COMMIT.unpack_from(payload, 1)
        txn = self._take(xid, "Stream Commit")
        begin = b"B" + _BEGIN.pack(commit_lsn, commit_time, xid)
        commit = b"C" + _COMMIT.pack(flags, commit_lsn, end_lsn, commit_time)
        return self._replay(txn, begin, commit, lsn, skip_empty=True)

    def _stream_prepare(self, payload: Payload, lsn: int) -> Iterable[Item]:
        if len(payload) < 31 or payload[-1] != 0:
            raise _err(f"Stream Prepare of {len(payload)} bytes is truncated")
        _flags, prepare_lsn, end_lsn, prepare_time, xid = _PREPARE.unpack_from(payload, 1)
        txn = self._take(xid, "Stream Prepare")
        gid = bytes(payload[30:])  # NUL-terminated
        begin = b"b" + _BEGIN_PREPARE.pack(prepare_lsn, end_lsn, prepare_time, xid) + gid
        prepare = b"P" + bytes(payload[1:])  # Prepare has exactly the Stream Prepare layout
        return self._replay(txn, begin, prepare, lsn, skip_empty=False)

    def _take(self, xid: int, what: str) -> _Txn:
        txn = self._txns.pop(xid, None)
        if txn is None:
            raise _err(f"{what} for transaction {xid} that was never streamed")
        self._memory -= len(txn.buf)
        if not self._txns:
            self._watch = _CONTROL
        return txn

    def _drop(self, txn: _Txn) -> None:
        del self._txns[txn.xid]
        self._memory -= len(txn.buf)
        txn.discard()
        if not self._txns:
            self._watch = _CONTROL

    # --- memory and spill ----------------------------------------------------------------

    def _compact(self, txn: _Txn) -> None:
        """Drop the in-memory records of aborted subtransactions now (the spilled ones at replay)."""
        old = txn.buf
        aborted = txn.aborted
        new = bytearray()
        unpack = _REC.unpack_from
        xid_at = _XID.unpack_from
        off, end = 0, len(old)
        with memoryview(old) as view:
            while off < end:
                word, _ = unpack(old, off)
                stop = off + _REC_SIZE + (word & _LEN_MASK)
                if word & _NO_XID or xid_at(old, off + _REC_SIZE + 1)[0] not in aborted:
                    new += view[off:stop]
                off = stop
        txn.buf = new
        self._memory -= end - len(new)

    def _spill(self, txn: _Txn) -> None:
        if not txn.buf:
            return
        try:
            if txn.fd < 0:
                fd, path = tempfile.mkstemp(prefix=f"pgrecv-xid{txn.xid}-", suffix=".spill", dir=self.spill_dir)
                txn.fd = fd
                try:
                    os.unlink(path)
                except OSError:
                    txn.path = path
            with memoryview(txn.buf) as view:
                done = 0
                while done < len(view):
                    done += os.write(txn.fd, view[done:])
        except OSError as exc:
            where = self.spill_dir or tempfile.gettempdir()
            raise OutputError(
                f"cannot spill streamed transaction {txn.xid} to {where}: {exc.strerror or exc}; "
                "free space there or raise the memory limit",
            ) from None
        txn.spilled += len(txn.buf)
        self._memory -= len(txn.buf)
        txn.buf = bytearray()
        txn.flush_at = _SPILL_TAIL

    # --- replay --------------------------------------------------------------------------

    def _replay(self, txn: _Txn, begin: bytes, end: bytes, end_lsn: int, *, skip_empty: bool) -> Iterator[Item]:
        self._replaying.add(txn)
        batches = self._batches(txn)
        try:
            items: list[Item] = []
            for items in batches:
                if items:
                    break
            if not items and skip_empty:
                return
            yield begin, txn.first_lsn
            yield from items
            for items in batches:
                yield from items
            yield end, end_lsn
        finally:
            batches.close()
            txn.discard()
            self._replaying.discard(txn)

    def _batches(self, txn: _Txn) -> Generator[list[Item], None, None]:
        """The transaction's messages in order, in lists of about a read block's worth: the spill
        file first, read back in blocks into one reused buffer, then the in-memory tail."""
        aborted = txn.aborted
        if txn.fd >= 0:
            fd = txn.fd
            os.lseek(fd, 0, os.SEEK_SET)
            data = bytearray(_READ_BLOCK)
            size = 0  # valid bytes in data
            while True:
                with memoryview(data) as view:
                    got = os.readv(fd, [view[size:]])
                    size += got
                    items, end = _batch(data, view, 0, size, aborted, size)
                yield items
                rest = size - end
                if got == 0:
                    if rest:
                        raise OutputError(f"spill file of transaction {txn.xid} is truncated; was it modified?")
                    break
                need = _REC_SIZE + (_REC.unpack_from(data, end)[0] & _LEN_MASK) if rest >= _REC_SIZE else 0
                if need > len(data):  # one record larger than the buffer: grow it
                    bigger = bytearray(need)
                    bigger[:rest] = data[end:size]
                    data = bigger
                else:
                    data[:rest] = data[end:size]
                size = rest
        buf = txn.buf
        off, size = 0, len(buf)
        while off < size:
            with memoryview(buf) as view:
                items, off = _batch(buf, view, off, size, aborted, _READ_BLOCK)
            yield items

    # --- lifecycle -----------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every buffered transaction (after a reconnect the server streams them again)."""
        for txn in list(self._txns.values()):
            txn.discard()
        self._txns.clear()
        self._chunk = None
        self._memory = 0
        self._watch = _CONTROL

    def close(self) -> None:
        """Drop everything and release spill files, including those of unfinished replays."""
        self.reset()
        for txn in list(self._replaying):
            txn.discard()
        self._replaying.clear()

    def __enter__(self) -> StreamAssembler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _batch(
    buf: bytearray, view: memoryview, off: int, size: int, aborted: set[int], budget: int
) -> tuple[list[Item], int]:
    """The complete records in ``buf[off:size]``, about ``budget`` bytes of them, as messages without
    their xid prefix; and the offset where parsing stopped. The prefix is cut in place (the type byte
    moves 4 bytes forward), so each message costs one copy."""
    unpack = _REC.unpack_from
    xid_at = _XID.unpack_from
    items: list[Item] = []
    append = items.append
    limit = min(size, off + budget)
    while off < limit and size - off >= _REC_SIZE:
        word, lsn = unpack(buf, off)
        start = off + _REC_SIZE
        stop = start + (word & _LEN_MASK)
        if stop > size:
            break
        if word & _NO_XID:
            append((view[start:stop].tobytes(), lsn))
        elif not aborted or xid_at(buf, start + 1)[0] not in aborted:
            buf[start + 4] = buf[start]
            append((view[start + 4 : stop].tobytes(), lsn))
        off = stop
    return items, off
