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
  to 2.1-2.3 s.

  The receive buffer decides whether the socket fills during a pause. It starts at twice
  :data:`RECEIVE_BUFFER` (512 KiB). To a server on this host (loopback, or the host's own
  address) it stays there: it is fixed when the stream starts (autotuning off). Left to
  autotuning it grew to 2-6 MiB in some runs, the socket then seldom filled, and the walsender
  took 0.2-0.4 s more CPU (mixed workload, PG 15: 2.0-2.29 s against 1.98-2.13 s fixed; PG 18
  1.87-2.19 s against 1.80-1.86 s). Fixed anywhere from 256 KiB to 1 MiB it did alike; at 2 MiB
  the socket never filled (3.1-3.3 s). A link to another host may need a larger window than that
  (its bandwidth times its round trip), so there autotuning stays, from a first buffer grown by
  setting the low-water mark to :data:`RECEIVE_BUFFER` and back: with the kernel's
  128 KiB a paused client throttled itself, a buffer per pause, until autotuning grew it (1-3 s
  lost in about one run in eight); with a 1 MiB mark the socket never filled on the inserts
  workload (4.7-6.2 s against 2.4-2.7 s).
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
# A TCP stream's receive buffer starts at twice this: to this host SO_RCVBUF, fixed (Linux doubles
# it; capped by rmem_max); elsewhere the low-water mark set to it and back, and autotuning goes on.
RECEIVE_BUFFER = 256 << 10
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


def same_host(local: str, peer: str) -> bool:
    """Whether a TCP connection from address ``local`` to ``peer`` stays on this host: a loopback
    peer, or our own address."""
    peer = _plain(peer)
    return peer == _plain(local) or peer.startswith("127.") or peer == "::1"


def _plain(address: str) -> str:
    """An address without its IPv6 zone, and an IPv4 address mapped into IPv6 as IPv4."""
    address = address.split("%", 1)[0].lower()
    return address.removeprefix("::ffff:")
