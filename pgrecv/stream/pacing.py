"""When the receive loop reads on at once, and when it pauses to let the server's messages gather.

The walsender sends each message with its own ``send()`` while the client's socket takes it, and
a client that waits in ``poll()`` between small reads is woken for nearly every one: both sides
then spend most of their CPU on per-message system calls and wake-ups. So, while reads bring
messages, the loop reads on without polling; and when the socket runs dry after a burst, it
pauses a millisecond before reading again, so that the next messages arrive as one large read.
A trickle (fewer than :data:`BURST` messages since the socket was last dry: single small
transactions, a synchronous standby's commits) never pauses, so its latency is unchanged.

Measured with ``bench/stream.py --workload inserts`` (PostgreSQL 15, 1M inserts, 2 cores): client
CPU 2.1-2.3 µs per row instead of 3.6-4.4, the walsender's CPU 3.2-3.3 s instead of 4.9-5.5 s,
wall 3.5-3.7 s instead of 4.4-5.3 s (pg_recvlogical: 5.8-6.3 s in the same runs).
"""

from __future__ import annotations

import time

PAUSE_SECONDS = 0.001
BURST = 64  # messages since the socket was last dry that mark a stream as flowing

READ_ON = 0  # the last read brought messages: read again, without waiting
PAUSE = 1  # dry after a burst: do the loop's duties, sleep PAUSE_SECONDS, then read
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


def pause() -> None:
    time.sleep(PAUSE_SECONDS)
