"""The live status line of `pgrecv start --format pretty` on a terminal.

One line on stderr, redrawn in place: what was received, what is durable (and so confirmed),
how far the output lags behind the server, and the row rate. It is cleared before the tables on
stdout are flushed, so the two never mix on the screen.
"""

from __future__ import annotations

from typing import TextIO

from pgrecv.lsn import lsn_str
from pgrecv.pg.slot_health import human_bytes

CLEAR = "\r\x1b[2K"


class StatusLine:
    def __init__(self, stream: TextIO, interval: float = 0.5) -> None:
        self.stream = stream
        self.interval = interval
        self.shown = False
        self._next = 0.0
        self._last_rows = 0
        self._last_time: float | None = None
        self.rate = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next

    def clear(self) -> None:
        if self.shown:
            self.stream.write(CLEAR)
            self.stream.flush()
            self.shown = False

    def text(self, *, received: int, flushed: int, rows: int, transactions: int, now: float) -> str:
        if self._last_time is None:
            self._last_time = now
        elapsed = now - self._last_time
        if elapsed >= self.interval:
            self.rate = (rows - self._last_rows) / elapsed
            self._last_rows, self._last_time = rows, now
        lag = max(0, received - flushed)
        return (
            f"received {lsn_str(received)} · durable {lsn_str(flushed)} · lag {human_bytes(lag)} · "
            f"{transactions:,} txns · {rows:,} rows · {self.rate:,.0f} rows/s"
        )

    def show(self, line: str, now: float) -> None:
        self.stream.write(CLEAR + line)
        self.stream.flush()
        self.shown = True
        self._next = now + self.interval
