"""The receive loop's pacing: read on while reads bring messages, pause once after a burst, never
for a trickle (pure); the loop with pacing against a real server: a backlog arrives whole, a
single small transaction never pauses; and the pause itself, over TCP and a Unix-domain socket.
(Whether a real backlog pauses depends on which side is faster at each moment; the loop's
reaction to a burst is in tests/stream/test_streamer.py.)"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pgrecv.lsn import LSN
from pgrecv.pg.conn import ConnOptions
from pgrecv.pg.server import TempServer
from pgrecv.stream.connection import ReplicationConnection
from pgrecv.stream.pacing import BURST, PAUSE, READ_ON, WAIT, Pacing, same_host
from pgrecv.stream.streamer import StartConfig, Streamer
from tests.util import sql


def test_reads_on_while_reads_bring_messages() -> None:
    p = Pacing()
    assert p.step(10) == READ_ON
    assert p.step(30) == READ_ON


def test_pauses_once_when_the_socket_runs_dry_after_a_burst() -> None:
    p = Pacing()
    assert p.step(BURST - 1) == READ_ON
    assert p.step(BURST) == READ_ON  # BURST messages since the socket was last dry
    assert p.step(BURST) == PAUSE
    assert p.step(BURST) == WAIT  # still nothing after the pause: an idle stream waits


def test_a_trickle_never_pauses() -> None:
    p = Pacing()
    seen = 0
    for _ in range(100):
        seen += 3  # a small transaction, then nothing
        assert p.step(seen) == READ_ON
        assert p.step(seen) == WAIT


def test_the_burst_counts_from_the_last_dry_socket() -> None:
    p = Pacing()
    assert p.step(BURST - 1) == READ_ON
    assert p.step(BURST - 1) == WAIT
    assert p.step(BURST) == READ_ON  # one message: not a burst, whatever came before
    assert p.step(BURST) == WAIT


def _stream(dsn: str, slot: str, endpos: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """``pgrecv start``'s streamer in this process, to ``endpos``; returns how often it paused
    (the real connection's ``pause``, counted)."""
    from pgrecv.output.jsonl import JsonlEncoder
    from pgrecv.output.sinks import FileSink

    pauses = []
    real = ReplicationConnection.pause

    def pause(self: ReplicationConnection, *, latency: bool) -> None:
        pauses.append(latency)
        real(self, latency=latency)

    monkeypatch.setattr(ReplicationConnection, "pause", pause)
    cfg = StartConfig(
        slot=slot,
        fmt="jsonl",
        options=[("proto_version", "1"), ("publication_names", "pacing_pub")],
        plugin="pgoutput",
        endpos=int(LSN.parse(endpos)),
        no_loop=True,
    )
    sink = FileSink(str(path))
    Streamer(ConnOptions(dbname=dsn), cfg, sink, JsonlEncoder, lambda *a, **k: None).run()
    return len(pauses)


def test_a_backlog_arrives_whole(db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = 20_000
    sql(db_dsn, "CREATE TABLE pacing (id int PRIMARY KEY, v text)")
    sql(db_dsn, "CREATE PUBLICATION pacing_pub FOR TABLE pacing")
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('pacing_backlog', 'pgoutput')")
    sql(db_dsn, "INSERT INTO pacing SELECT g, repeat('x', 50) FROM generate_series(1, %s) g", (rows,))
    endpos = sql(db_dsn, "SELECT pg_current_wal_insert_lsn()::text")[0][0]
    out = tmp_path / "out.jsonl"
    _stream(db_dsn, "pacing_backlog", endpos, out, monkeypatch)
    recs = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["new"]["id"] for r in recs if r["op"] == "insert"] == list(range(1, rows + 1))
    assert recs[-1]["op"] == "commit"


def test_single_small_transactions_never_pause(db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sql(db_dsn, "CREATE TABLE pacing (id int PRIMARY KEY, v text)")
    sql(db_dsn, "CREATE PUBLICATION pacing_pub FOR TABLE pacing")
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('pacing_trickle', 'pgoutput')")
    sql(db_dsn, "INSERT INTO pacing VALUES (1, 'a')")
    endpos = sql(db_dsn, "SELECT pg_current_wal_insert_lsn()::text")[0][0]
    out = tmp_path / "out.jsonl"
    assert _stream(db_dsn, "pacing_trickle", endpos, out, monkeypatch) == 0
    assert [orjson.loads(line)["op"] for line in out.read_bytes().splitlines()] == [
        "begin",
        "relation",
        "insert",
        "commit",
    ]


def _pausing(dsn: str, slot: str) -> ReplicationConnection:
    sql(dsn, "CREATE TABLE pacing (id int PRIMARY KEY, v text)")
    sql(dsn, "CREATE PUBLICATION pacing_pub FOR TABLE pacing")
    sql(dsn, f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    rc = ReplicationConnection(ConnOptions(dbname=dsn))
    rc.start(slot, 0, [("proto_version", "1"), ("publication_names", "pacing_pub")])
    return rc


def _drain(rc: ReplicationConnection) -> list[bytes]:
    kinds = []
    while (item := rc.read())[0] > 0:
        kinds.append(bytes(item[1][:1]))
    return kinds


def _receive_buffer(rc: ReplicationConnection) -> tuple[int, int]:
    import socket

    assert rc._socket is not None and rc._socket.family == socket.AF_INET
    return (
        rc._socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        rc._socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT),
    )


def test_to_this_host_the_receive_buffer_is_fixed(tcp_dsn: str) -> None:
    from pgrecv.stream.pacing import RECEIVE_BUFFER

    assert "host=127.0.0.1" in tcp_dsn
    rmem_max = int(Path("/proc/sys/net/core/rmem_max").read_text())
    fixed = 2 * min(RECEIVE_BUFFER, rmem_max)  # what Linux makes of SO_RCVBUF
    rc = _pausing(tcp_dsn, "pacing_fixed")
    try:
        assert _receive_buffer(rc) == (fixed, 1)
        # 8 MB through it, read as fast as it comes: autotuning would have grown the buffer
        sql(tcp_dsn, "INSERT INTO pacing SELECT g, repeat('x', 400) FROM generate_series(1, 20000) g")
        got = 0
        while got < 20000:
            rc.wait(1.0)
            got += _drain(rc).count(b"w")
        assert _receive_buffer(rc) == (fixed, 1)
    finally:
        rc.close()


def test_to_another_host_a_stream_starts_with_room_to_pause(tcp_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgrecv.stream.pacing import RECEIVE_BUFFER

    monkeypatch.setattr("pgrecv.stream.connection.same_host", lambda local, peer: False)
    rc = _pausing(tcp_dsn, "pacing_room")
    try:
        buffer, mark = _receive_buffer(rc)
        assert buffer >= 2 * RECEIVE_BUFFER and mark == 1  # grown, and autotuning goes on from there
    finally:
        rc.close()


@pytest.mark.parametrize(
    ("local", "peer", "same"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "127.0.0.53", True),
        ("::1", "::1", True),
        ("::ffff:127.0.0.1", "::ffff:127.0.0.1", True),
        ("10.1.2.3", "10.1.2.3", True),  # the host's own address
        ("fe80::1%eth0", "FE80::1%eth0", True),
        ("10.1.2.3", "10.1.2.4", False),
        ("::ffff:10.1.2.3", "::ffff:10.9.9.9", False),
        ("2001:db8::1", "2001:db8::2", False),
        ("10.1.2.3", "128.0.0.1", False),
    ],
)
def test_same_host(local: str, peer: str, same: bool) -> None:
    assert same_host(local, peer) is same


def test_over_tcp_a_pause_sleeps_then_reads_what_gathered(tcp_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr("pgrecv.stream.connection.PAUSE_SECONDS", 0.3)
    monkeypatch.setattr("pgrecv.stream.connection.GATHER_SECONDS", 5.0)
    rc = _pausing(tcp_dsn, "pacing_sleep")
    try:
        sql(tcp_dsn, "INSERT INTO pacing SELECT g, repeat('x', 200) FROM generate_series(1, 2000) g")
        time.sleep(0.5)  # far more than GATHER_BYTES buffered by now
        started = time.monotonic()
        rc.pause(latency=False)
        assert time.monotonic() - started >= 0.3  # a sleep, however much is buffered
        assert b"w" in _drain(rc)  # and then what was buffered is read
        sql(tcp_dsn, "INSERT INTO pacing SELECT g, repeat('x', 200) FROM generate_series(2001, 4000) g")
        time.sleep(0.5)
        started = time.monotonic()
        rc.pause(latency=True)  # where latency counts: the short wait, over at once with the bytes there
        assert time.monotonic() - started < 0.3
        assert b"w" in _drain(rc)
    finally:
        rc.close()


def test_the_short_pause_waits_for_its_bytes_then_every_wait_wakes_for_one_byte(
    tcp_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import time

    monkeypatch.setattr("pgrecv.stream.connection.GATHER_SECONDS", 0.3)
    rc = _pausing(tcp_dsn, "pacing_gather")
    try:
        sql(tcp_dsn, "INSERT INTO pacing VALUES (1, 'a')")  # a few hundred bytes: below the 64 KiB mark
        time.sleep(0.5)  # sent by now
        started = time.monotonic()
        rc.pause(latency=True)
        assert time.monotonic() - started >= 0.25  # fewer bytes than the mark: the whole pause
        assert rc._socket is not None
        assert rc._socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        assert b"w" in _drain(rc)  # what was buffered was read
        monkeypatch.setattr("pgrecv.stream.connection.GATHER_SECONDS", 5.0)
        sql(tcp_dsn, "INSERT INTO pacing SELECT g, repeat('x', 200) FROM generate_series(2, 2000) g")
        started = time.monotonic()
        rc.pause(latency=True)
        assert time.monotonic() - started < 4  # GATHER_BYTES arrived long before the timeout
    finally:
        rc.close()


def test_over_a_unix_socket_a_pause_is_the_short_wait(
    pg_server: TempServer, db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import time

    from psycopg.conninfo import make_conninfo

    monkeypatch.setattr("pgrecv.stream.connection.PAUSE_SECONDS", 5.0)
    monkeypatch.setattr("pgrecv.stream.connection.GATHER_SECONDS", 5.0)
    dsn = make_conninfo(db_dsn, host=str(pg_server.socket_dir))
    rc = _pausing(dsn, "pacing_unix")
    try:
        assert rc._socket is not None and rc._socket.family == socket.AF_UNIX
        sql(dsn, "INSERT INTO pacing VALUES (1, 'a')")  # far below the mark, which poll() ignores here
        time.sleep(0.5)
        started = time.monotonic()
        rc.pause(latency=False)
        assert time.monotonic() - started < 2  # no sleep: the first byte ends the wait
        assert b"w" in _drain(rc)
    finally:
        rc.close()
