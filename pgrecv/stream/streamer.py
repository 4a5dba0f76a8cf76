"""`pgrecv start`: stream a slot into a sink, confirming to the server only what is durable.

The stages, in the order data flows: the connection (:class:`~pgrecv.stream.connection.ReplicationConnection`:
the copy stream in, keepalive answers and status updates out, with the positions of a
:class:`~pgrecv.stream.feedback.Feedback`), an optional :class:`~pgrecv.decode.assemble.StreamAssembler`
(streamed transactions made whole), a decoder, the :class:`~pgrecv.stream.pipeline.Pipeline` (resume
skip, transactions, boundaries, filters), a formatter (encoder) and a :class:`~pgrecv.output.sinks.Sink`.
This module is the loop that connects them: the reconnect loop, deadlines, signals, start and
end positions, and when the sink is made durable and the feedback sent.

Duplicates: the server resends every transaction whose commit it has not been told is flushed.
On each (re)connect streaming starts at the end of the last transaction already in the output
(from the sink's state, or from this run), and the server skips what lies before that position;
transactions whose Begin says they commit at or before it are dropped here as well.

Positions that cannot be trusted: a start position (``-I``) or a resume position (the output's
record) ahead of the server's WAL would make the server skip everything up to it, and any later
confirmation would make that loss permanent. They are refused before streaming starts
(:class:`~pgrecv.errors.PositionError`), and in no case is a start or resume position itself
confirmed: only ends of transactions received and made durable in this run, and keepalive
positions received in this run (see :mod:`pgrecv.stream.feedback`).

Stopping: the stop flag set by SIGINT/SIGTERM is looked at every few hundred messages, and every
few thousand rows while a reassembled streamed transaction is replayed, so a stop takes effect
mid-transaction; the unit being written is cut back and the server's unsent rest is not waited
for beyond ``--fsync-interval``.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, cast

from pgrecv import events as ev
from pgrecv.decode.plugins import Decoder, PgOutputSettings, make_decoder, plan_options
from pgrecv.errors import ConnectionFailed, OutputError, PositionError, SlotError, StreamLost
from pgrecv.lsn import lsn_str
from pgrecv.native import copyfast
from pgrecv.output.fastpath import FastRows
from pgrecv.output.jsonl import JsonlEncoder
from pgrecv.output.sinks import Owner, Resume, Sink
from pgrecv.output.status_line import StatusLine
from pgrecv.pg.conn import ConnOptions, connect
from pgrecv.pg.slots import get_slot, logical_slot
from pgrecv.stream.connection import ReplicationConnection, StreamConnection, StreamEnded
from pgrecv.stream.feedback import Feedback
from pgrecv.stream.heartbeat import Heartbeat
from pgrecv.stream.pacing import PAUSE, READ_ON, Pacing
from pgrecv.stream.pipeline import Counts, Pipeline
from pgrecv.stream.wire import HEADER_SIZE, KEEPALIVE_KIND, XLOGDATA_KIND, parse_xlogdata_header

ROW_KINDS = frozenset(b"IUD")  # pgoutput Insert, Update, Delete

BACKOFF_MAX = 30.0
REPLAY_BATCH = 4096  # rows of a reassembled transaction handled between two looks at the stop flag


class Formatter(Protocol):
    def feed(self, event: ev.Event) -> None: ...


@dataclass
class StartConfig:
    slot: str
    fmt: str  # jsonl | pretty | raw
    options: Sequence[tuple[str, str]]  # final plugin options
    plugin: str
    startpos: int | None = None
    endpos: int | None = None
    until_caught_up: bool = False
    status_interval: float = 10.0
    fsync_interval: float = 10.0
    no_loop: bool = False
    tables: Sequence[str] = ()
    exclude_tables: Sequence[str] = ()
    ops: frozenset[str] | None = None
    synchronous: bool = False  # durable and reported at every transaction boundary (group-committed)
    metrics_file: str | None = None  # Prometheus text file rewritten every status interval
    warnings: Sequence[str] = ()  # where the output can differ from the source (pgrecv.pg.divergence)
    heartbeat: float | None = None  # emit a heartbeat message after this long without changes
    keep_heartbeats: bool = False  # write heartbeat transactions to the output like any other
    assemble: bool = False  # pgoutput streaming is on: make streamed transactions whole
    temporary: bool = False  # make the slot on the streaming connection, TEMPORARY: no reconnecting
    two_phase_slot: bool = False  # with temporary: the slot decodes prepared transactions
    memory_limit: int = 64 << 20

    @property
    def durable_at_every_boundary(self) -> bool:
        """-F 0 and --synchronous: the output is made durable at every transaction boundary (the
        streamer's sync points; the CLI picks the -f state record's mode by it)."""
        return self.synchronous or self.fsync_interval <= 0


@dataclass
class RunStats(Counts):  # rows, heartbeats and last_commit_time: counted by the pipeline
    messages: int = 0
    transactions: int = 0
    reconnects: int = 0
    stop_reason: str = ""
    started: float = field(default_factory=time.monotonic)


class _Stop(Exception):
    """Leave the message loop: the reason is in ``RunStats.stop_reason``."""


class Streamer:
    """The loop that connects the stages of `pgrecv start` (see the module docstring); ``connect``
    makes the connection stage (a fake one in tests/stream/test_streamer.py)."""

    def __init__(
        self,
        opts: ConnOptions,
        config: StartConfig,
        sink: Sink,
        make_formatter: Callable[[Callable[[bytes], None]], Formatter] | None,
        log: Callable[..., None],
        status: StatusLine | None = None,
        *,
        connect: Callable[[ConnOptions, int, Feedback], StreamConnection] = ReplicationConnection,
    ) -> None:
        self.opts = opts
        self._connect = connect
        self.cfg = config
        self.sink = sink
        self.make_formatter = make_formatter
        self.log = log
        self.status = status
        self._messages_at_tick = 0
        self.feedback = Feedback(config.status_interval)
        self.stats = RunStats()
        self._raw_write = sink.write if config.fmt == "raw" else None
        self.pipeline = Pipeline(
            self._emit,
            boundary=self._boundary,
            tables=config.tables,
            exclude_tables=config.exclude_tables,
            ops=config.ops,
            drop_heartbeats=config.heartbeat is not None and not config.keep_heartbeats,
            counts=self.stats,
        )
        # heartbeat transactions are recognised by decoding them, also for raw output
        self.decode_needed = config.fmt != "raw" or self.pipeline.filters or self.pipeline.drop_heartbeats
        self.stop_requested = False
        self.reopen_requested = False
        self.target: int | None = None  # --until-caught-up: the server's WAL position at start
        self.resume_start = 0  # where the output's durable record says to start
        self.resume = Resume()
        self.stop_at: float | None = None  # monotonic time of the stop signal
        self._file_seen = 0  # sink.file_started when the formatter was made
        self._feed: Callable[[ev.Event], None] | None = None
        self._decoder: Decoder | None = None
        # the fused row-to-JSONL path (pgrecv.output.fastpath) when nothing is filtered
        self._fast_ok = config.plugin == "pgoutput" and config.fmt == "jsonl" and not self.pipeline.filters
        self._heartbeat: Heartbeat | None = None
        if config.heartbeat is not None:
            self._heartbeat = Heartbeat(opts, config.heartbeat, config.slot, log)
        self._activity = (0, 0)  # (rows, transactions) at the last look
        self._quiet_since = time.monotonic()
        self._started_once = False  # a stream ran in this process: later losses are reconnected
        # the temporary slot was made: a loss from then on ended it, even before the stream ran
        self._made_temporary = False
        self._next_fsync = 0.0
        # -F 0 and --synchronous: durable at every transaction boundary, once the socket has
        # nothing more buffered, so commits that arrive together share one fsync (group commit);
        # -s 0 and --synchronous: reported as soon as it is durable. No timer runs at 0.
        self._durable_at_drain = config.durable_at_every_boundary
        self._report_at_durable = config.synchronous or config.status_interval <= 0
        self._synced_transactions = 0  # stats.transactions at the last sync point (-vvv reports groups)
        self._metrics_path = Path(config.metrics_file) if config.metrics_file else None
        self._next_metrics = 0.0
        self._metrics_failure: str | None = None  # the failure last warned about (None: the last write worked)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # --- signals -----------------------------------------------------------------------------

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True
        if self.stop_at is None:
            self.stop_at = time.monotonic()

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        self.reopen_requested = True

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        old_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            signal.set_wakeup_fd(old_fd)

    # --- the reconnect loop ------------------------------------------------------------------

    def run(self) -> RunStats:
        with self._signals():
            try:
                resume = self.sink.look()  # begun (created) only once the checks have passed
                if self.sink.warning:
                    self.log(f"warning: {self.sink.warning}", 0)
                self.resume = resume
                self.resume_start = resume.start_lsn
                self.pipeline.skip_until = resume.last_commit_lsn or 0
                if self.resume_start:
                    self.log(f"output already holds transactions up to {lsn_str(self.resume_start)}: resuming there")
                self._loop()
            finally:
                with contextlib.suppress(Exception):
                    self.sink.close()
                os.close(self._wake_r)
                os.close(self._wake_w)
                if self._heartbeat is not None:
                    self._heartbeat.close()
        return self.stats

    def _loop(self) -> None:
        attempt = 0
        while not self.stop_requested:
            rc: StreamConnection | None = None
            try:
                rc = self._connect(self.opts, self._wake_r, self.feedback)
                self._stream(rc)
                return
            except _Stop:
                assert rc is not None
                self._finish(rc)
                return
            except ConnectionFailed as exc:
                if not self._started_once and not self._made_temporary:
                    raise  # never got going: a configuration problem, not a broken stream
                if self._started_once:
                    self._after_loss(rc)
                if self.cfg.temporary:
                    raise StreamLost(
                        f"{exc.message}; the temporary slot ended with its connection, so pgrecv does not "
                        "reconnect (a new one would miss the changes made meanwhile): use a permanent slot "
                        "(pgrecv create) to resume"
                    ) from None
                if self.cfg.no_loop:
                    raise StreamLost(f"{exc.message}; not reconnecting (--no-loop)") from None
                attempt += 1
                self.stats.reconnects += 1
                delay = min(BACKOFF_MAX, 2 ** min(attempt - 1, 5))
                self.log(f"{exc.message}; reconnecting in {delay:.0f} s (attempt {attempt})", 0)
                self._sleep(delay)
            finally:
                if rc is not None:
                    with contextlib.suppress(Exception):
                        rc.close()

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop_requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))

    def _after_loss(self, rc: StreamConnection | None) -> None:
        """Keep what is complete; a transaction cut by the loss will come again in full."""
        self.sink.discard_partial()
        self.feedback.on_durable(self.sink.durable())
        self.pipeline.reset()

    # --- one connection ----------------------------------------------------------------------

    def _stream(self, rc: StreamConnection) -> None:
        cfg = self.cfg
        if not self._started_once:  # before anything touches a slot: is the output this stream's?
            system_identifier, database = rc.system()
            self.sink.check_owner(Owner(cfg.slot, database, system_identifier))
        if cfg.temporary and not self._started_once:
            if self.resume_start:
                raise PositionError(
                    f"the output already holds transactions up to {lsn_str(self.resume_start)}, and a temporary "
                    "slot starts at the server's current position: the changes in between would be missing; "
                    "write to a new output, or resume with a permanent slot"
                )
            at = rc.create_temporary_slot(
                cfg.slot, cfg.plugin, two_phase=cfg.two_phase_slot, on_wait=lambda m: self.log(m, 0)
            )
            self._made_temporary = True
            self.log(f'created temporary slot "{cfg.slot}" ({cfg.plugin}) at {lsn_str(at)}')
        if not self._started_once:
            self._check_positions(rc)
        if cfg.until_caught_up and self.target is None:
            self.target = rc.identify_system()
            self.log(f"streaming until caught up with {lsn_str(self.target)}")
        start = max(cfg.startpos or 0, self.resume_start, self.feedback.written)
        rc.start(cfg.slot, start, cfg.options)
        if not self._started_once:
            # the output is made only now that every check passed and the server took the slot
            # and its options: a refused start leaves nothing behind
            self.sink.begin()
            self.sink.record_owner()
            # said once the stream runs, not before an error of its own
            for line in cfg.warnings:
                self.log(f"warning: {line}", 0)
        self._started_once = True
        now = time.monotonic()
        self.feedback.start(now)
        self._next_fsync = self._next_fsync_after(now)
        self.log(f"streaming from slot {cfg.slot} at {lsn_str(start)}")
        decoder = make_decoder(cfg.plugin, cfg.options) if self.decode_needed else None
        self._decoder = decoder
        self._new_formatter()
        assembler = self._assembler()
        if decoder is None:
            handle = self.pipeline.raw_handler(self.sink.write, cfg.plugin)
        else:
            handle = self.pipeline.handler(decoder.decode)
        try:
            self._pump(rc, handle, assembler)
        finally:
            if assembler is not None:
                assembler.close()

    def _check_positions(self, rc: StreamConnection) -> None:
        """Refuse a start or resume position the server cannot have produced, before the slot is
        touched: streaming from it would skip every change up to it."""
        server = rc.wal_position()
        startpos = self.cfg.startpos
        if startpos is not None and startpos > server:
            raise PositionError(
                f"-I/--startpos {lsn_str(startpos)} is ahead of the server's WAL ({lsn_str(server)}), "
                f"so every change up to it would be skipped; nothing was confirmed: {self._slot_hint(rc)}"
            )
        resume = self.resume
        if resume.furthest > server:
            raise PositionError(
                f"{resume.source or 'the output'} says the output holds changes up to {lsn_str(resume.furthest)}, "
                f"ahead of the server's WAL ({lsn_str(server)}): it was edited or belongs to another server; "
                "nothing was confirmed: move it out of the way (or write to a new output) and run again"
            )
        if resume.empty_source:
            # past what the slot confirmed, only what the output holds may move the start: an
            # empty file holds nothing, and streaming after its name would skip real changes
            confirmed = rc.slot_confirmed(self.cfg.slot)
            if confirmed is None or resume.furthest > confirmed:
                at = f"the slot has confirmed {lsn_str(confirmed)}" if confirmed is not None else "no slot position"
                raise PositionError(
                    f"{resume.source} is empty but its name says the output holds changes up to "
                    f"{lsn_str(resume.furthest)} ({at}): pgrecv never writes an empty file; "
                    "nothing was confirmed: move it out of the way and run again"
                )

    def _slot_hint(self, rc: StreamConnection) -> str:
        confirmed = rc.slot_confirmed(self.cfg.slot)
        where = f" (the slot is at {lsn_str(confirmed)})" if confirmed is not None else ""
        return f"give a position the server has reached{where}, or leave -I out"

    def _new_formatter(self) -> None:
        """A fresh formatter per connection and per output file: a new file repeats the relation
        records its rows need, and nothing of an interrupted transaction carries over."""
        self._file_seen = self.sink.file_started
        formatter = self.make_formatter(self.sink.write) if self.make_formatter else None
        self._feed = formatter.feed if formatter is not None else None
        self.pipeline.fast = None
        if self._fast_ok and isinstance(formatter, JsonlEncoder) and self._decoder is not None:
            from pgrecv.decode.pgoutput import PgOutputDecoder

            if isinstance(self._decoder, PgOutputDecoder):
                self.pipeline.fast = FastRows(formatter, self._decoder, self.sink.write)

    def _emit(self, event: ev.Event, msg: Any) -> None:
        """What the pipeline lets through: to the formatter, or the plugin's bytes (raw)."""
        feed = self._feed
        if feed is not None:
            feed(event)
        elif self._raw_write is not None:
            self._raw_write(msg)
            self._raw_write(b"\n")

    def _assembler(self) -> Any:
        if not self.cfg.assemble:
            return None
        from pgrecv.decode.assemble import StreamAssembler

        return StreamAssembler(memory_limit=self.cfg.memory_limit)

    def _pump(self, rc: StreamConnection, handle: Callable[[Any, int], None], assembler: Any) -> None:
        read = rc.read
        parse = parse_xlogdata_header
        endpos = self.cfg.endpos
        feedback = self.feedback
        stats = self.stats
        feed = assembler.feed if assembler is not None else None
        countdown = 256
        pacing = Pacing()
        # The C loop over runs of row changes (copyfast.pump): used while the fused path writes
        # this transaction's rows (its plans are filled). It writes the rows it can and hands
        # back the first message it does not take, handled below as if read() had returned it.
        # A message other than a row change may change what the next rows write (a Begin the
        # heads, a Relation the plan, a Stream Start the layout), so the plans are emptied once it
        # is handled, and only FastRows.row fills them again. That one rule also keeps the pump
        # out of what the fused path declines: a streamed chunk, a resume skip, a held Begin.
        pipeline = self.pipeline
        bulk = copyfast.pump if copyfast is not None and rc.native is not None else None
        address, below = rc.native or 0, (1 << 64) - 1 if endpos is None else endpos
        lines = bytearray()
        stale: dict[int, Any] | None = None
        n: int
        buf: Any  # bytes or psycopg's memoryview
        while True:
            if stale is not None:
                stale.clear()
                stale = None
            fast = pipeline.fast
            if bulk is not None and fast is not None and fast.plans:
                n, buf, rows, wal_end = bulk(address, fast.plans, below, countdown, lines)
                if rows:
                    stats.messages += rows
                    stats.rows += rows
                    feedback.on_data(wal_end)
                    cast("Callable[[bytearray], None]", self.sink.write)(lines)  # takes any buffer
                    lines.clear()
                    countdown -= rows
                if n == -2:  # not taken (libpq failed, or the encoder is busy): read() says what happened
                    n, buf = read()
                elif n > 0 and (n <= HEADER_SIZE or buf[0] != XLOGDATA_KIND or buf[HEADER_SIZE] not in ROW_KINDS):
                    stale = fast.plans
                elif n == -3:  # as many rows as the countdown had left
                    countdown = 256
                    self._duties(rc)
                    continue
            else:
                n, buf = read()
            if n > 0:
                stats.messages += 1
                kind = buf[0]
                if kind == XLOGDATA_KIND:
                    start, wal_end, _ = parse(buf)
                    if endpos is not None and start > endpos:
                        self.stats.stop_reason = f"reached end position {lsn_str(endpos)}"
                        raise _Stop
                    feedback.on_data(wal_end)
                    if feed is None:
                        handle(buf[HEADER_SIZE:], start)
                    else:
                        items = feed(buf[HEADER_SIZE:], start)
                        if items.__class__ is tuple:
                            for msg, lsn in items:
                                handle(msg, lsn)
                        else:  # a whole streamed transaction, possibly millions of rows
                            self._replay(rc, items, handle)
                    if endpos is not None and start == endpos:
                        self.stats.stop_reason = f"reached end position {lsn_str(endpos)}"
                        raise _Stop
                elif kind == KEEPALIVE_KIND:
                    self._keepalive(rc, buf, assembler)
                countdown -= 1
                if countdown:
                    continue
                countdown = 256
                self._duties(rc)
                continue
            if n == 0:
                if self._durable_at_drain and feedback.written > feedback.flushed:
                    self._sync_point(rc)
                step = pacing.step(stats.messages)
                if step == READ_ON:
                    rc.wait(0)  # read what the socket holds, without polling
                    continue
                # the socket ran dry
                self._periodic(rc)
                if step == PAUSE:  # a burst: let the next messages gather (see stream/pacing.py)
                    rc.pause(latency=self._durable_at_drain or self._report_at_durable)
                    continue
                # at most 1 s (rotation by age, the terminal's status line); the timers shorten
                # the wait only when they have work: a boundary not yet durable, a position not
                # yet reported. So an idle pgrecv sleeps whatever -F and -s say (1 ms used to
                # mean a thousand wake-ups a second), and the wait is never 0 (a spin).
                now = time.monotonic()
                deadline = now + 1.0
                if feedback.written > feedback.flushed:
                    deadline = min(deadline, self._next_fsync)
                if feedback.flushed != feedback.last_sent_flush:
                    deadline = min(deadline, feedback.next_status)
                rc.wait(max(0.001, deadline - now))
                continue
            raise StreamEnded(rc.end_of_copy())

    def _duties(self, rc: StreamConnection) -> None:
        """Every 256 messages: a stream that never drains (other sessions' changes keep coming)
        must not hold back the commits waiting for this receiver, nor the timers."""
        if self._durable_at_drain and self.feedback.written > self.feedback.flushed:
            self._sync_point(rc)
        self._periodic(rc)

    def _next_fsync_after(self, now: float) -> float:
        return now + self.cfg.fsync_interval if self.cfg.fsync_interval > 0 else math.inf

    def _sync_point(self, rc: StreamConnection) -> None:
        """Everything received so far made durable and, with --synchronous, reported at once: a
        synchronous_standby_names commit waits for exactly this."""
        self.feedback.on_durable(self.sink.durable())
        if self._report_at_durable and self.feedback.flushed != self.feedback.last_sent_flush:
            rc.report()
        group = self.stats.transactions - self._synced_transactions
        self._synced_transactions = self.stats.transactions
        self.log(f"sync point: {group} transaction(s) durable up to {lsn_str(self.feedback.flushed)}", 3)

    def _replay(self, rc: StreamConnection, items: Any, handle: Callable[[Any, int], None]) -> None:
        """Hand a reassembled transaction on in batches, with the periodic duties (stop flag,
        fsync, status updates) between batches, as between messages in :meth:`_pump`."""
        it = iter(items)
        while batch := list(itertools.islice(it, REPLAY_BATCH)):
            for msg, lsn in batch:
                handle(msg, lsn)
            self._periodic(rc)

    def _keepalive(self, rc: StreamConnection, buf: Any, assembler: Any) -> None:
        idle = not self.pipeline.in_txn and (assembler is None or assembler.idle)
        ka, reply = rc.keepalive(buf, idle=idle)
        if self.cfg.endpos is not None and ka.wal_end >= self.cfg.endpos:
            self.stats.stop_reason = f"reached end position {lsn_str(self.cfg.endpos)}"
            raise _Stop
        if self.target is not None and idle and ka.wal_end >= self.target:
            self.stats.stop_reason = f"caught up with {lsn_str(self.target)}"
            raise _Stop
        # While idle, a keepalive's position is confirmed (nothing is pending): answer it at once
        # with --synchronous or -s 0, since commits that send us no transaction (other databases,
        # unpublished tables, empty transactions) wait for exactly that position.
        if reply or (self._report_at_durable and self.feedback.flushed != self.feedback.last_sent_flush):
            rc.report()

    def _periodic(self, rc: StreamConnection) -> None:
        now = time.monotonic()
        if self.stop_requested:
            self.stats.stop_reason = "stopped by signal"
            raise _Stop
        if self.reopen_requested:
            self.reopen_requested = False
            self.feedback.on_durable(self.sink.durable())
            self.sink.reopen()
            self.log("reopened the output file (SIGHUP)")
        if now >= self._next_fsync:
            self._next_fsync = self._next_fsync_after(now)
            before = self.feedback.flushed
            self.feedback.on_durable(self.sink.durable())
            if self.feedback.flushed != before:
                self.log(f"output durable up to {lsn_str(self.feedback.flushed)}", 2)
                if self._report_at_durable:  # -s 0: reported as soon as durable, not on a timer
                    rc.report(now)
        status = self.status
        if status is None:
            self.sink.tick(now)
        else:
            self._tick_with_status(status, now)
        if self.sink.file_started != self._file_seen and not self.pipeline.in_txn:
            self._new_formatter()
        if self._metrics_path is not None and now >= self._next_metrics:
            self._write_metrics(now)
        if self._heartbeat is not None:
            self._maybe_heartbeat(now)
        if self.feedback.due(now):
            rc.report(now)
            self.log(
                f"confirmed write {lsn_str(self.feedback.written)} flush {lsn_str(self.feedback.flushed)}",
            )

    def _maybe_heartbeat(self, now: float) -> None:
        """Quiet means no row and no transaction since the last look (a heartbeat's own
        transaction counts, so there is one per interval at most)."""
        activity = (self.stats.rows, self.stats.transactions)
        if activity != self._activity:
            self._activity = activity
            self._quiet_since = now
            return
        if not self.pipeline.in_txn:
            assert self._heartbeat is not None
            self._heartbeat.maybe_send(now, self._quiet_since)

    def _write_metrics(self, now: float) -> None:
        from pgrecv.stream import metrics as stream_metrics

        assert self._metrics_path is not None
        interval = self.cfg.status_interval if self.cfg.status_interval > 0 else 10.0
        self._next_metrics = now + interval
        fb = self.feedback
        data = stream_metrics.render(self.cfg.slot, self.stats, fb.received, fb.flushed, self.sink.bytes_written)
        try:
            stream_metrics.write(self._metrics_path, data)
        except OutputError as exc:
            # Metrics describe the stream; stopping it for them would leave the slot holding WAL.
            # One line per distinct failure, not one per status interval.
            if exc.message != self._metrics_failure:
                self._metrics_failure = exc.message
                self.log(f"warning: {exc.message}; streaming goes on without metrics until a write works", 0)
            return
        if self._metrics_failure is not None:
            self._metrics_failure = None
            self.log(f"the metrics file {self._metrics_path} is written again", 0)

    def _tick_with_status(self, status: StatusLine, now: float) -> None:
        """Flush the tables to the terminal without tearing the status line, then redraw it."""
        fresh = self.stats.messages != self._messages_at_tick
        self._messages_at_tick = self.stats.messages
        if fresh:
            status.clear()
        self.sink.tick(now)
        if fresh or status.due(now):
            fb = self.feedback
            text = status.text(
                received=fb.received,
                flushed=fb.flushed,
                rows=self.stats.rows,
                transactions=self.stats.transactions,
                now=now,
            )
            status.show(text, now)

    def _finish(self, rc: StreamConnection) -> None:
        """A clean stop: the output made durable, then the final status update with its position."""
        if self.pipeline.in_txn:
            self.sink.discard_partial()
        self.feedback.on_durable(self.sink.durable())
        now = time.monotonic()
        # within --fsync-interval of the signal (at least a moment, for the server to answer)
        budget = self.cfg.fsync_interval - (now - self.stop_at) if self.stop_at is not None else 10.0
        rc.finish(self.feedback.message(now), timeout=min(10.0, max(0.5, budget)))
        if self._metrics_path is not None:
            self._write_metrics(now)
        if self.status is not None:
            self.status.clear()
        self.log(
            f"{self.stats.stop_reason or 'stopped'}: confirmed {lsn_str(self.feedback.flushed)} "
            f"after {self.stats.transactions} transactions"
        )

    # --- per message ------------------------------------------------------------------------

    def _boundary(self, commit_lsn: int, end_lsn: int, count: bool) -> None:
        """The pipeline's end of a unit: the sink's boundary, the written position, and the
        stop at --until-caught-up's target."""
        self.sink.boundary(commit_lsn, end_lsn)
        self.feedback.on_written(end_lsn)
        if self.sink.file_started != self._file_seen:
            self._new_formatter()
        if count:
            self.stats.transactions += 1
        if self.target is not None and end_lsn >= self.target:
            self.stats.stop_reason = f"caught up with {lsn_str(self.target)}"
            raise _Stop


class SinkText(io.TextIOBase):
    """A text stream over a sink, for rich's Console (pretty output)."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write

    def write(self, s: str) -> int:
        self._write(s.encode())
        return len(s)

    def writable(self) -> bool:
        return True


def plan_start(
    opts: ConnOptions,
    slot: str,
    *,
    fmt: str,
    plugin: str | None,
    publication: str | None,
    settings: PgOutputSettings,
    user_options: Sequence[tuple[str, str]],
    temporary: bool = False,
) -> tuple[str, list[tuple[str, str]], list[str]]:
    """The slot's plugin, the options to stream it with (checked before anything is written) and
    the warnings where the output can differ from the source. ``temporary``: the slot is made
    later, on the streaming connection; no slot of that name may exist now."""
    from pgrecv.pg import divergence

    with connect(opts) as conn:
        if temporary:
            if get_slot(conn, slot) is not None:
                raise SlotError(f'replication slot "{slot}" already exists: give the temporary slot another name')
            info: dict[str, Any] = {"slot_name": slot, "plugin": plugin or "pgoutput"}
        else:
            info = logical_slot(conn, slot)
        slot_plugin = str(info["plugin"])
        if plugin is not None and plugin != slot_plugin:
            raise SlotError(
                f'replication slot "{slot}" uses plugin {slot_plugin}, not {plugin}: drop -P or use another slot'
            )
        if fmt == "raw" and settings.streaming is None:
            settings = replace(settings, streaming="off")  # raw output stays what the plugin wrote
        options = plan_options(conn, info, publication, settings, user_options, sql_interface=False)
        pub = None
        if slot_plugin == "pgoutput" and "publication_names" not in {n for n, _ in user_options}:
            pub = divergence.only_publication(conn, publication)
        return slot_plugin, options, divergence.warnings(conn, pub, None if temporary else info, temporary=temporary)
