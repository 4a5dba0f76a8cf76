"""What to tell the server, and when: the client's side of the replication protocol, without I/O.

Three positions, as in the protocol's standby status update:

* ``received``: the furthest WAL position the server said it sent (XLogData or keepalive).
* ``written``: the end LSN of the last transaction handed to the output.
* ``flushed``: the end LSN of the last transaction whose output is durable. Only this one moves
  the slot's ``confirmed_flush_lsn``, so it is never ahead of what a crash would leave on disk.

While idle (no transaction open, everything written is durable) a keepalive's WAL end is
confirmed too, so that a slot whose tables see no changes does not hold WAL forever.

All three start at 0 (which the server ignores) and move only on what this process received
and made durable: never on a start position, which is only a request (``-I``, or a record left
by an earlier run) and may name WAL that does not exist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pgrecv.stream.wire import Keepalive, status_update


@dataclass(slots=True)
class Feedback:
    status_interval: float
    received: int = 0
    written: int = 0
    flushed: int = 0
    last_sent_flush: int = -1
    next_status: float = 0.0  # monotonic deadline of the next periodic status update

    def start(self, now: float) -> None:
        """A new connection starts streaming: positions carry over, the status timer restarts."""
        self.last_sent_flush = -1
        self.next_status = self._next(now)

    def on_data(self, wal_end: int) -> None:
        if wal_end > self.received:
            self.received = wal_end

    def on_written(self, end_lsn: int) -> None:
        if end_lsn > self.written:
            self.written = end_lsn

    def on_durable(self, end_lsn: int | None) -> None:
        if end_lsn is not None and end_lsn > self.flushed:
            self.flushed = end_lsn

    def on_keepalive(self, ka: Keepalive, *, idle: bool) -> bool:
        """Record a keepalive; True when the server wants an answer right away."""
        if ka.wal_end > self.received:
            self.received = ka.wal_end
        if idle and self.written <= self.flushed and ka.wal_end > self.flushed:
            self.written = self.flushed = ka.wal_end
        return ka.reply_requested

    def _next(self, now: float) -> float:
        """An interval of 0 means no timer: updates go out when the output is made durable
        (``start --synchronous``, ``-s 0``) and when the server asks."""
        return now + self.status_interval if self.status_interval > 0 else math.inf

    def due(self, now: float) -> bool:
        return now >= self.next_status

    def message(self, now: float) -> bytes:
        """The status update to send now; resets the periodic deadline."""
        self.next_status = self._next(now)
        self.last_sent_flush = self.flushed
        return status_update(self.written, self.flushed, self.flushed)
