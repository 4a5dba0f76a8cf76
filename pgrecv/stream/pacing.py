"""When the receive loop reads on at once, and when it pauses to let the server's messages gather.

The walsender sends each message with its own ``send()`` while the client's socket takes it, and
a client that waits in ``poll()`` between small reads is woken for nearly every one: both sides
then spend most of their CPU on per-message system calls and wake-ups. So, while reads bring
messages, the loop reads on without polling; and when the socket runs dry after a burst, it
waits for :data:`GATHER_BYTES` to be buffered (the socket's low-water mark, at most
:data:`PAUSE_SECONDS`) before reading again, so that the next messages arrive as one large read
and the walsender's sends meanwhile wake nobody. A trickle (fewer than :data:`BURST` messages
since the socket was last dry: single small transactions, a synchronous standby's commits) never
pauses, so its latency is unchanged.

Measured with ``bench/stream.py`` (PostgreSQL 15, TCP, 2 cores, best of 3): 1M inserts 2.67 s
against 4.44-5.3 s before (client CPU 1.75 against 3.57 µs per row, the walsender's CPU 2.3-2.6 s
against about 5 s; pg_recvlogical 5.15 s); the mixed workload 2.62 s against 3.44 s. A fixed
1 ms sleep instead of the low-water mark: 3.02 and 3.00 s in the same session.
"""

from __future__ import annotations

PAUSE_SECONDS = 0.002  # the longest pause
GATHER_BYTES = 64 << 10  # a pause ends once this much is buffered
BURST = 64  # messages since the socket was last dry that mark a stream as flowing

READ_ON = 0  # the last read brought messages: read again, without waiting
PAUSE = 1  # dry after a burst: do the loop's duties, gather (at most PAUSE_SECONDS), then read
WAIT = 2  # dry after a trickle: do the loop's duties, then wait for the socket


class Pacing:
    """The receive loop's choice each time no whole message is buffered (no I/O here)."""

    __slots__ = ("_burst", "_seen")

    def __init__(self) -> None:
        self._seen = 0  # the message count at the last read
        self._burst = 0  # messages since the socket was last found dry

    def step(self, messages: int) -> int:
        """READ_ON, PAUSE or WAIT, given the count of messages received so far."""
        got = messages - self._seen
        self._seen = messages
        if got:
            self._burst += got
            return READ_ON
        flowing = self._burst >= BURST
        self._burst = 0
        return PAUSE if flowing else WAIT
