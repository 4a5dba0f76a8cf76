"""When the receive loop reads on at once, and when it pauses to let the server's messages gather.

The walsender sends each message with its own ``send()`` while the client's socket takes it, and
a client that waits in ``poll()`` between small reads is woken for nearly every one: both sides
then spend most of their CPU on per-message system calls and wake-ups. So, while reads bring
messages, the loop reads on without polling; and when the socket runs dry after a burst, it
pauses before reading again. A trickle (fewer than :data:`BURST` messages since the socket was
last dry: single small transactions, a synchronous standby's commits) never pauses, so its
latency is unchanged.

How it pauses depends on the socket (:meth:`~pgrecv.stream.connection.ReplicationConnection.pause`):

- Over TCP it sleeps :data:`PAUSE_SECONDS`, without a waiter on the socket. The walsender's
  messages pile up meanwhile, its socket fills and its sends become cheap appends to a queue
  (or it waits); the next reads take them in bulk. Over loopback TCP, sending is most of a
  walsender's cost: on the mixed workload of ``bench/stream.py`` (PostgreSQL 15, 2 cores,
  interleaved runs) its CPU fell from 2.4-2.9 s to 1.8-1.9 s and pgrecv's run from 2.7-3.2 s
  to 2.1-2.3 s. When the stream starts, the socket's low-water mark is set to
  :data:`RECEIVE_BUFFER` and back, which makes Linux grow the receive buffer to twice that (its
  autotuning goes on from there): with the kernel's small first buffer a paused client
  throttled itself, a buffer per pause, until autotuning grew it (1-3 s lost in about one run
  in eight); with a 1 MiB mark the socket never filled on the inserts workload and the
  walsender went back to sending each message alone (4.7-6.2 s against 2.4-2.7 s).
- Over a Unix-domain socket a send costs the walsender little, a pause only delays the client
  (2.62 s against 2.23 s), so it waits for the socket as before: :data:`GATHER_BYTES` (the
  low-water mark, which Linux's ``poll()`` ignores there: the wait ends at the first byte), at
  most :data:`GATHER_SECONDS`.
- Where latency counts (``--synchronous``, ``-F 0``, ``-s 0``: a commit may be waiting for this
  receiver) the pause is that short wait too, over TCP as well.

The measurements are in bench/NOTES.md.
"""

from __future__ import annotations

PAUSE_SECONDS = 0.020  # the pause over TCP
RECEIVE_BUFFER = 256 << 10  # a TCP stream's receive buffer starts at twice this
GATHER_SECONDS = 0.002  # the longest short pause (Unix-domain sockets; where latency counts)
GATHER_BYTES = 64 << 10  # a short pause ends once this much is buffered
BURST = 64  # messages since the socket was last dry that mark a stream as flowing

READ_ON = 0  # the last read brought messages: read again, without waiting
PAUSE = 1  # dry after a burst: do the loop's duties, pause, then read
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
