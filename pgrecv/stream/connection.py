"""The socket side of streaming: START_REPLICATION through psycopg's libpq wrapper, never blocking.

psycopg 3 has no replication API: after START_REPLICATION the connection is in COPY_BOTH and is
pumped with ``pgconn.get_copy_data(1)`` (non-blocking), ``consume_input()`` and ``put_copy_data``.
Blocking in C would leave signals unhandled and status updates unsent, so every wait is a
``selectors`` wait on the socket with a deadline, plus a wake-up pipe for signals.
"""

from __future__ import annotations

import functools
import os
import selectors
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import psycopg
from psycopg import pq, sql

from pgrecv import failpoints
from pgrecv.errors import ConnectionFailed
from pgrecv.lsn import LSN, lsn_str
from pgrecv.native import pgconn_address
from pgrecv.pg.conn import ConnOptions, connect, server_message, translate
from pgrecv.stream.feedback import Feedback
from pgrecv.stream.pacing import (
    GATHER_BYTES,
    GATHER_SECONDS,
    PAUSE_SECONDS,
    RECEIVE_BUFFER,
    same_host,
)
from pgrecv.stream.wire import Keepalive, parse_keepalive


class StreamEnded(ConnectionFailed):
    """The server ended the stream or the connection broke: the runner may reconnect."""


class StreamConnection(Protocol):
    """The connection stage as the streamer sees it (:class:`ReplicationConnection`, or a fake in
    the unit tests): the copy stream's messages in, status updates out."""

    feedback: Feedback
    read: Callable[[], tuple[int, Any]]
    # the PGconn's address for ``copyfast.pump`` (pgrecv.native.pgconn_address) once streaming, or None
    native: int | None

    def identify_system(self) -> LSN: ...
    def system(self) -> tuple[str, str]: ...
    def wal_position(self) -> LSN: ...
    def slot_confirmed(self, slot: str) -> LSN | None: ...
    def start(self, slot: str, start: int, options: Sequence[tuple[str, str]]) -> None: ...
    def create_temporary_slot(
        self, slot: str, plugin: str, *, two_phase: bool, on_wait: Callable[[str], None] | None = None
    ) -> LSN: ...
    def wait(self, timeout: float) -> None: ...
    def pause(self, *, latency: bool) -> None: ...
    def keepalive(self, buf: Any, *, idle: bool) -> tuple[Keepalive, bool]: ...
    def report(self, now: float | None = None) -> None: ...
    def end_of_copy(self) -> str: ...
    def finish(self, final_status: bytes | None, timeout: float = 10.0) -> None: ...
    def close(self) -> None: ...


class ReplicationConnection:
    """A replication connection streaming one slot: reads the copy stream, answers keepalives
    and sends status updates with the positions of its :class:`~pgrecv.stream.feedback.Feedback`."""

    def __init__(self, opts: ConnOptions, wakeup_fd: int | None = None, feedback: Feedback | None = None) -> None:
        self.conn: psycopg.Connection[Any] = connect(opts, replication=True)
        self.pgconn: pq.abc.PGconn = self.conn.pgconn
        self.feedback = Feedback(10.0) if feedback is None else feedback
        # the next CopyData message without blocking: (its size, it); size 0: none buffered, -1: the end
        self.read: Callable[[], tuple[int, Any]] = functools.partial(self.pgconn.get_copy_data, 1)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.pgconn.socket, selectors.EVENT_READ)
        if wakeup_fd is not None:
            self._selector.register(wakeup_fd, selectors.EVENT_READ)
        self._wakeup_fd = wakeup_fd
        self._socket: socket.socket | None = None  # for stream/pacing.py's socket options: a duplicate of libpq's
        self.streaming = False
        self.native: int | None = None

    def identify_system(self) -> LSN:
        """The server's current WAL flush position (what 'caught up' means when streaming starts)."""
        row = self.conn.execute("IDENTIFY_SYSTEM").fetchone()
        assert row is not None
        return LSN.parse(str(row[2]))

    def system(self) -> tuple[str, str]:
        """(the server's system identifier, the connection's database), as IDENTIFY_SYSTEM says:
        whose stream an output holds (:class:`pgrecv.output.sinks.Owner`). A standby promoted from
        a physical copy keeps its primary's identifier."""
        row = self.conn.execute("IDENTIFY_SYSTEM").fetchone()
        assert row is not None
        return str(row[0]), str(row[3])

    def wal_position(self) -> LSN:
        """The furthest WAL position that exists on the server: IDENTIFY_SYSTEM's (the flush
        position; on a standby, the replayed one) or, on a primary, the insert position, which
        is further when commits are asynchronous (``synchronous_commit=off`` commits lie past
        the flushed WAL until the WAL writer catches up)."""
        furthest = self.identify_system()
        try:
            row = self.conn.execute(
                "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_insert_lsn()::text END"
            ).fetchone()
        except psycopg.Error:
            return furthest  # IDENTIFY_SYSTEM alone: stricter, never wrong for what was streamed
        if row is not None and row[0] is not None:
            furthest = max(furthest, LSN.parse(str(row[0])))
        return furthest

    def slot_confirmed(self, slot: str) -> LSN | None:
        """The slot's confirmed_flush_lsn (None if unknown): for messages only."""
        try:
            row = self.conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
        except psycopg.Error:
            return None
        return LSN.parse(str(row[0])) if row is not None and row[0] is not None else None

    def create_temporary_slot(
        self, slot: str, plugin: str, *, two_phase: bool, on_wait: Callable[[str], None] | None = None
    ) -> LSN:
        """A slot that lives as long as this session: made here, so that the stream started on
        this connection is its only reader, and the server drops it when the session ends.
        Returns its consistent point. ``on_wait``: as for :func:`pgrecv.pg.slots.create_slot`."""
        from pgrecv.pg.conn import server_major
        from pgrecv.pg.slots import create_slot_command, told_if_slow

        try:
            command = create_slot_command(
                slot, plugin, server_major(self.conn), two_phase=two_phase, failover=False, temporary=True
            )
            with told_if_slow(self.conn, on_wait):
                row = self.conn.execute(command).fetchone()
        except psycopg.Error as exc:
            raise translate(exc, slot=slot) from None
        assert row is not None
        return LSN.parse(str(row[1]))

    def start(self, slot: str, start: int, options: Sequence[tuple[str, str]]) -> None:
        opts = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(name), sql.Literal(value)) for name, value in options
        )
        command = sql.SQL("START_REPLICATION SLOT {} LOGICAL {}{}").format(
            sql.Identifier(slot),
            sql.SQL(lsn_str(start)),
            sql.SQL(" ({})").format(opts) if options else sql.SQL(""),
        )
        try:
            self.conn.execute(command)
        except psycopg.Error as exc:
            raise translate(exc, slot=slot) from None
        self.streaming = True
        self.native = pgconn_address(self.pgconn)
        sock = self._sock()
        if sock.family != socket.AF_UNIX:  # see stream/pacing.py: the receive buffer a pause needs
            try:
                if same_host(sock.getsockname()[0], sock.getpeername()[0]):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
                else:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RECEIVE_BUFFER)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            except OSError:
                pass

    def _sock(self) -> socket.socket:
        if self._socket is None:
            self._socket = socket.socket(fileno=os.dup(self.pgconn.socket))
        return self._socket

    def wait(self, timeout: float) -> None:
        """Wait until the socket is readable (or a signal woke us, or the timeout passed), then read."""
        if timeout > 0:
            for key, _ in self._selector.select(timeout):
                if key.fd == self._wakeup_fd:
                    _drain(self._wakeup_fd)
        try:
            self.pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise StreamEnded(f"connection lost: {server_message(exc)}") from None

    def pause(self, *, latency: bool) -> None:
        """The pause of :mod:`pgrecv.stream.pacing` after a burst, then read. Over TCP, unless
        ``latency`` counts, a sleep; otherwise a short wait for GATHER_BYTES: the socket's
        low-water mark is raised for this wait only, so that the kernel does not wake us for each
        message the walsender sends meanwhile, and every other wait wakes for a single byte.
        (Linux's poll() honours the mark on TCP sockets only: over a Unix-domain socket this wait
        ends at the first byte.)"""
        sock = self._sock()
        if not latency and sock.family != socket.AF_UNIX:
            time.sleep(PAUSE_SECONDS)
            self.wait(0)
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, GATHER_BYTES)
        except OSError:  # no low-water mark here: a plain pause instead
            time.sleep(GATHER_SECONDS)
            self.wait(0)
            return
        try:
            self.wait(GATHER_SECONDS)
        finally:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)

    def keepalive(self, buf: Any, *, idle: bool) -> tuple[Keepalive, bool]:
        """A primary keepalive, recorded in the feedback (see :meth:`Feedback.on_keepalive`): it,
        and whether the server asked for an answer right away."""
        ka = parse_keepalive(buf)
        return ka, self.feedback.on_keepalive(ka, idle=idle)

    def report(self, now: float | None = None) -> None:
        """Send a standby status update with the feedback's positions."""
        self.send(self.feedback.message(time.monotonic() if now is None else now))

    def send(self, data: bytes) -> None:
        try:
            self.pgconn.put_copy_data(data)
            while self.pgconn.flush() == 1:  # rarely: the kernel buffer is full
                sel = selectors.DefaultSelector()
                sel.register(self.pgconn.socket, selectors.EVENT_WRITE)
                sel.select(1.0)
        except psycopg.OperationalError as exc:
            raise StreamEnded(f"connection lost: {server_message(exc)}") from None

    def end_of_copy(self) -> str:
        """The stream ended (get_copy_data returned -1): why, in one line."""
        reason = "the server ended the stream"
        try:
            while (res := self.pgconn.get_result()) is not None:
                if res.status == pq.ExecStatus.COPY_IN:  # server sent CopyDone: answer it
                    self.pgconn.put_copy_end()
                    self.pgconn.flush()
                elif res.status == pq.ExecStatus.FATAL_ERROR:
                    msg = res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
                    reason = f"the server ended the stream: {msg.decode(errors='replace') if msg else 'error'}"
        except psycopg.OperationalError as exc:
            reason = f"connection lost: {server_message(exc)}"
        self.streaming = False
        return reason

    def finish(self, final_status: bytes | None, timeout: float = 10.0) -> None:
        """A clean stop: the last status update, CopyDone, and the rest of the server's data dropped
        (it is beyond what was written and confirmed, so the next run gets it again).

        A walsender in the middle of a large transaction answers CopyDone only after sending the
        rest of it, which can take seconds to minutes; after ``timeout`` the connection is just
        closed. Nothing is lost either way: the final status update went out first, and if the
        server did not act on it the next run skips what the output already holds.
        """
        if not self.streaming:
            return
        deadline = time.monotonic() + timeout
        try:
            if final_status is not None:
                self.send(final_status)
            self.pgconn.put_copy_end()
            self.pgconn.flush()
            if (delay := failpoints.stop_drain_delay()) > 0:
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            get = self.pgconn.get_copy_data
            countdown = 1024
            while True:
                n, _ = get(1)
                if n == -1:
                    break
                if n > 0:
                    countdown -= 1
                    if countdown:
                        continue
                    countdown = 1024
                left = deadline - time.monotonic()
                if left <= 0:
                    self._abandon()
                    return
                if n == 0:
                    self.wait(min(left, 0.1))
            # The server's CopyDone can come before the rest of its transaction (a walsender
            # answers CopyDone at once, then finishes sending the transaction it is in): a
            # blocking get_result() would read all of that, so the results are collected without
            # blocking, against the same deadline.
            while True:
                if self.pgconn.is_busy():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._abandon()
                        return
                    self.wait(min(left, 0.1))
                    continue
                if self.pgconn.get_result() is None:
                    break
        except (psycopg.OperationalError, StreamEnded):
            pass
        self.streaming = False

    def _abandon(self) -> None:
        """Past the stop's deadline: close the connection; the walsender sees it go and stops."""
        self.streaming = False
        self.conn.close()

    def close(self) -> None:
        self._selector.close()
        if self._socket is not None:
            self._socket.close()
        self.conn.close()


def _drain(fd: int) -> None:
    import os

    try:
        while os.read(fd, 512):
            pass
    except (BlockingIOError, InterruptedError):
        pass
