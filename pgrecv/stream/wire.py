"""The streaming replication protocol's CopyData messages, without any I/O.

Server to client: XLogData ``w`` (start, wal end, send time, payload) and primary keepalive ``k``
(wal end, send time, reply requested). Client to server: standby status update ``r`` (write, flush,
apply positions, client time, reply now). All integers big-endian; times are microseconds since
2000-01-01 UTC.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Final

from pgrecv.errors import DecodeError
from pgrecv.events import PG_EPOCH_UNIX

XLOGDATA_KIND: Final = 0x77  # 'w': the first byte of an XLogData message
KEEPALIVE_KIND: Final = 0x6B  # 'k': the first byte of a primary keepalive
XLOGDATA_HEADER: Final = struct.Struct(">cQQq")  # 'w', start, wal_end, send_time: 25 bytes
KEEPALIVE: Final = struct.Struct(">cQq?")  # 'k', wal_end, send_time, reply_requested: 18 bytes
STATUS_UPDATE: Final = struct.Struct(">cQQQq?")  # 'r', write, flush, apply, client_time, reply: 34 bytes
HEADER_SIZE: Final = XLOGDATA_HEADER.size


@dataclass(frozen=True, slots=True)
class Keepalive:
    wal_end: int
    send_time: int
    reply_requested: bool


def pg_now() -> int:
    """Now, in microseconds since the PostgreSQL epoch."""
    return time.time_ns() // 1000 - PG_EPOCH_UNIX * 1_000_000


def parse_xlogdata_header(buf: bytes | memoryview) -> tuple[int, int, int]:
    """(start LSN, wal end, send time) of an XLogData message; the payload is ``buf[25:]``."""
    if len(buf) < HEADER_SIZE:
        raise DecodeError(f"replication protocol: truncated XLogData message of {len(buf)} bytes")
    _, start, end, sent = XLOGDATA_HEADER.unpack_from(buf)
    return start, end, sent


def parse_keepalive(buf: bytes | memoryview) -> Keepalive:
    if len(buf) < KEEPALIVE.size:
        raise DecodeError(f"replication protocol: truncated keepalive message of {len(buf)} bytes")
    _, end, sent, reply = KEEPALIVE.unpack_from(buf)
    return Keepalive(end, sent, reply)


def status_update(write: int, flush: int, apply: int, *, now: int | None = None, reply: bool = False) -> bytes:
    """A standby status update. Only ``flush`` moves the slot's confirmed_flush_lsn."""
    return STATUS_UPDATE.pack(b"r", write, flush, apply, pg_now() if now is None else now, reply)
