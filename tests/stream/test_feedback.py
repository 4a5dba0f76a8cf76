"""The wire state: pure, so tested without a server (the streaming tests cover the real thing)."""

from __future__ import annotations

import struct

import pytest

from pgrecv.errors import DecodeError
from pgrecv.stream.feedback import Feedback
from pgrecv.stream.wire import Keepalive, parse_keepalive, parse_xlogdata_header, pg_now, status_update


def test_status_update_layout() -> None:
    msg = status_update(0x1_0000_0010, 0x20, 0x30, now=123, reply=True)
    assert len(msg) == 34
    assert struct.unpack(">cQQQq?", msg) == (b"r", 0x1_0000_0010, 0x20, 0x30, 123, True)


def test_pg_now_is_postgres_epoch() -> None:
    import time

    assert abs(pg_now() / 1e6 + 946_684_800 - time.time()) < 5


def test_parse_messages() -> None:
    w = struct.pack(">cQQq", b"w", 10, 20, 30) + b"payload"
    assert parse_xlogdata_header(w) == (10, 20, 30)
    assert w[25:] == b"payload"
    k = struct.pack(">cQq?", b"k", 99, 5, True)
    assert parse_keepalive(k) == Keepalive(99, 5, True)
    with pytest.raises(DecodeError, match="truncated"):
        parse_xlogdata_header(w[:20])
    with pytest.raises(DecodeError, match="truncated"):
        parse_keepalive(k[:10])


def test_flush_only_moves_with_durable_output() -> None:
    fb = Feedback(status_interval=10)
    fb.start(now=0)
    fb.on_written(200)
    assert fb.flushed == 0
    msg = struct.unpack(">cQQQq?", fb.message(now=1))
    assert msg[1:4] == (200, 0, 0)  # 0 is InvalidXLogRecPtr: the server ignores it
    fb.on_durable(200)
    assert struct.unpack(">cQQQq?", fb.message(now=2))[2] == 200
    fb.on_durable(150)  # never backwards
    assert fb.flushed == 200


def test_keepalive_confirmed_only_when_idle_and_durable() -> None:
    fb = Feedback(status_interval=10)
    fb.start(now=0)
    fb.on_written(200)
    assert fb.on_keepalive(Keepalive(500, 0, False), idle=True) is False
    assert fb.flushed == 0  # written output is not durable yet
    fb.on_durable(200)
    fb.on_keepalive(Keepalive(500, 0, True), idle=False)
    assert fb.flushed == 200  # a transaction is open
    assert fb.on_keepalive(Keepalive(600, 0, True), idle=True) is True
    assert fb.flushed == fb.written == 600
    assert fb.received == 600


def test_periodic_deadline() -> None:
    fb = Feedback(status_interval=10)
    fb.start(now=100)
    assert not fb.due(105)
    assert fb.due(110)
    fb.message(now=110)
    assert not fb.due(119) and fb.due(120)


def test_restart_keeps_positions() -> None:
    fb = Feedback(status_interval=10)
    fb.start(now=0)
    fb.on_written(300)
    fb.on_durable(300)
    fb.start(now=5)  # a reconnect never moves positions backwards
    assert (fb.written, fb.flushed) == (300, 300)


def test_nothing_is_confirmed_that_this_run_did_not_receive() -> None:
    """Issue 11 item 2: a start position is a request, not something received."""
    fb = Feedback(status_interval=10)
    fb.start(now=0)
    assert struct.unpack(">cQQQq?", fb.message(now=1))[1:4] == (0, 0, 0)
    fb.on_keepalive(Keepalive(0x156B5D8, 0, False), idle=True)  # a real position from the server
    assert struct.unpack(">cQQQq?", fb.message(now=2))[2] == 0x156B5D8
