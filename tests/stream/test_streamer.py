"""The streamer's loop without a server: a fake connection stage and an in-memory sink.

The fake hands over CopyData messages (XLogData framing from :mod:`pgrecv.stream.wire` around pgoutput
messages built from the documented layout, tests/decode/test_pgoutput.py) and records what the
streamer sends back; the real decoder, pipeline, encoder and feedback run. What the server does
is covered by tests/stream/test_start.py and friends.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.errors import StreamLost
from pgrecv.lsn import LSN
from pgrecv.output.jsonl import JsonlEncoder
from pgrecv.output.sinks import Resume, Sink
from pgrecv.pg.conn import ConnOptions
from pgrecv.stream.connection import StreamEnded
from pgrecv.stream.feedback import Feedback
from pgrecv.stream.pipeline import Pipeline, parse_ops
from pgrecv.stream.streamer import StartConfig, Streamer
from pgrecv.stream.wire import KEEPALIVE, STATUS_UPDATE, XLOGDATA_HEADER, Keepalive

sys.path.insert(0, str(Path(__file__).parent.parent / "decode"))
from test_pgoutput import (
    COLS,
    OID,
    REL_MSG,
    begin,
    commit,
    delete,
    insert,
    message,
    relation,
    truncate,
    update,
)

OTHER_OID = OID + 1
DRAINED = None  # in a fake connection's script: the socket has nothing more for now
Item = bytes | Exception | None
OTHER_REL = relation(OTHER_OID, "audit", "log", "d", COLS)


def row(i: int) -> tuple[str, str, None, None]:
    return (str(i), f"name {i}", None, None)


def txn(xid: int, commit_lsn: int, *body: bytes) -> list[tuple[int, bytes]]:
    """A transaction's messages with their WAL positions: Begin and the body at commit_lsn - 16
    and on; the Commit ends at commit_lsn + 8 and comes at that position (as the server sends it)."""
    msgs = [(commit_lsn - 16, begin(commit_lsn, 0, xid))]
    msgs += [(commit_lsn - 15 + i, m) for i, m in enumerate(body)]
    msgs.append((commit_lsn + 8, commit(commit_lsn, commit_lsn + 8, 0)))
    return msgs


def xlogdata(lsn: int, payload: bytes, wal_end: int | None = None) -> bytes:
    return XLOGDATA_HEADER.pack(b"w", lsn, lsn if wal_end is None else wal_end, 0) + payload


def keepalive(wal_end: int, reply: bool = False) -> bytes:
    return KEEPALIVE.pack(b"k", wal_end, 0, reply)


class FakeConnection:
    """The connection stage: a script of CopyData messages, exceptions to raise and ``DRAINED``
    (nothing buffered for a moment), then nothing buffered; ``on_idle`` runs whenever the
    streamer would wait on the socket."""

    def __init__(self, feedback: Feedback, script: Iterable[Item], on_idle: Callable[[], None]) -> None:
        self.feedback = feedback
        self.script: deque[Item] = deque(script)
        self.on_idle = on_idle
        self.started_at: int | None = None
        self.reports: list[tuple[int, int]] = []  # (write, flush) of each status update
        self.final: tuple[int, int] | None = None
        self.closed = False
        self.native = None  # no libpq behind it: the Python loop reads every message
        self.pauses: list[bool] = []  # the receive loop's pauses (stream/pacing.py): latency counted?

    def read(self) -> tuple[int, Any]:
        if not self.script:
            return 0, b""
        item = self.script.popleft()
        if item is DRAINED:
            return 0, b""
        if isinstance(item, Exception):
            raise item
        return len(item), memoryview(item)  # psycopg hands out memoryviews

    def identify_system(self) -> LSN:
        return LSN(1 << 40)

    def system(self) -> tuple[str, str]:
        return "7000000000000000001", "db"

    def wal_position(self) -> LSN:
        return LSN(1 << 40)

    def slot_confirmed(self, slot: str) -> LSN | None:
        return None

    def start(self, slot: str, start: int, options: Sequence[tuple[str, str]]) -> None:
        self.started_at = start

    def wait(self, timeout: float) -> None:
        self.on_idle()

    def pause(self, *, latency: bool) -> None:
        self.pauses.append(latency)
        self.on_idle()

    def keepalive(self, buf: Any, *, idle: bool) -> tuple[Keepalive, bool]:
        _, end, sent, reply = KEEPALIVE.unpack_from(buf)
        ka = Keepalive(end, sent, reply)
        return ka, self.feedback.on_keepalive(ka, idle=idle)

    def report(self, now: float | None = None) -> None:
        _, write, flush, *_ = STATUS_UPDATE.unpack(self.feedback.message(time.monotonic() if now is None else now))
        self.reports.append((write, flush))

    def end_of_copy(self) -> str:
        return "the server ended the stream"

    def finish(self, final_status: bytes | None, timeout: float = 10.0) -> None:
        assert final_status is not None
        _, write, flush, *_ = STATUS_UPDATE.unpack(final_status)
        self.final = (write, flush)

    def close(self) -> None:
        self.closed = True


class MemorySink(Sink):
    """Records in a bytearray; a unit is durable as soon as its boundary is written."""

    def __init__(self, resume: Resume | None = None) -> None:
        super().__init__()
        self.resume = resume or Resume()
        self.buf = bytearray()
        self.write = self.buf.extend
        self.boundaries: list[tuple[int, int]] = []
        self._complete = 0  # len(buf) at the last boundary
        self._end: int | None = None
        self.discards = 0
        self.closed = False

    def open(self) -> Resume:
        return self.resume

    def boundary(self, commit_lsn: int, end_lsn: int) -> None:
        self.boundaries.append((commit_lsn, end_lsn))
        self._complete = len(self.buf)
        self._end = end_lsn

    def durable(self) -> int | None:
        return self._end

    def discard_partial(self) -> None:
        self.discards += 1
        del self.buf[self._complete :]

    def close(self) -> None:
        self.closed = True

    def records(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in bytes(self.buf).splitlines()]

    def ops(self) -> list[str]:
        return [r["op"] for r in self.records()]


def run(
    scripts: Sequence[Sequence[Item]],
    sink: MemorySink | None = None,
    **config: Any,
) -> tuple[Streamer, MemorySink, list[FakeConnection]]:
    """Stream the scripts, one connection each; stop (as on SIGTERM) once the last is drained."""
    sink = sink or MemorySink()
    cfg = StartConfig(
        slot="s",
        fmt=config.pop("fmt", "jsonl"),
        options=[("proto_version", "1"), ("publication_names", "p")],
        plugin="pgoutput",
        status_interval=config.pop("status_interval", 0.0),
        fsync_interval=config.pop("fsync_interval", 0.0),
        **config,
    )
    connections: list[FakeConnection] = []
    pending = deque(scripts)
    streamer: Streamer

    def idle() -> None:
        if not pending and not connections[-1].script:
            streamer.stop_requested = True
            streamer.stop_at = time.monotonic()

    def connect(opts: ConnOptions, wakeup_fd: int, feedback: Feedback) -> FakeConnection:
        conn = FakeConnection(feedback, pending.popleft(), idle)
        connections.append(conn)
        return conn

    formatter = None if cfg.fmt == "raw" else JsonlEncoder
    streamer = Streamer(ConnOptions(), cfg, sink, formatter, lambda *a: None, connect=connect)
    streamer._sleep = lambda seconds: None  # type: ignore[method-assign] # no back-off between fakes
    streamer.run()
    return streamer, sink, connections


def frames(msgs: Iterable[tuple[int, bytes]]) -> list[bytes]:
    return [xlogdata(lsn, m) for lsn, m in msgs]


# --- boundaries and feedback -------------------------------------------------------------------


def test_transactions_are_written_with_their_boundaries_and_confirmed_at_a_clean_stop() -> None:
    script = frames(
        [
            (1000, REL_MSG),
            *txn(10, 1100, insert(OID, row(1)), insert(OID, row(2))),
            *txn(11, 1200, update(OID, row(3))),
            (1300, message(False, 1300, "note", b"hi")),  # non-transactional: a unit of its own
        ]
    )
    streamer, sink, (conn,) = run([script])
    assert sink.ops() == ["relation", "begin", "insert", "insert", "commit", "begin", "update", "commit", "message"]
    assert sink.boundaries == [(1100, 1108), (1200, 1208), (1300, 1300)]
    assert conn.started_at == 0
    assert conn.final == (1300, 1300)  # written and flushed: the end of the last durable unit
    assert streamer.stats.transactions == 3 and streamer.stats.rows == 3
    assert streamer.stats.stop_reason == "stopped by signal"
    assert conn.closed and sink.closed


def test_feedback_never_confirms_an_open_transaction_and_the_partial_one_is_dropped_at_stop() -> None:
    cut = txn(21, 2200, insert(OID, row(2)))[:-1]  # no Commit before the stop
    script = frames([(1000, REL_MSG), *txn(20, 2100, insert(OID, row(1))), *cut])
    _, sink, (conn,) = run([script])
    assert conn.final == (2108, 2108)
    assert sink.discards == 1
    assert sink.ops() == ["relation", "begin", "insert", "commit"]


def test_xlogdata_wal_end_is_received_and_an_idle_keepalive_is_confirmed() -> None:
    script = [xlogdata(lsn, m, wal_end=5000) for lsn, m in [(1000, REL_MSG), *txn(30, 3100, insert(OID, row(1)))]]
    streamer, _, (conn,) = run([[*script, DRAINED, keepalive(6000, reply=True)]])
    assert streamer.feedback.received == 6000
    # -s 0: each durable position is reported at once; the keepalive asked for an answer, and
    # while idle with everything durable its position is confirmed
    assert (3108, 3108) in conn.reports
    assert conn.reports[-1] == (6000, 6000)
    assert conn.final == (6000, 6000)


def test_received_is_the_wal_end_of_xlogdata() -> None:
    script = [xlogdata(lsn, m, wal_end=5000) for lsn, m in [(1000, REL_MSG), *txn(35, 3100, insert(OID, row(1)))]]
    streamer, _, (conn,) = run([script])
    assert streamer.feedback.received == 5000
    assert conn.final == (3108, 3108)  # received is not confirmed: only what is durable


def test_a_keepalive_inside_a_transaction_confirms_nothing_new() -> None:
    body = txn(31, 3200, insert(OID, row(1)))
    script = [*frames([(1000, REL_MSG), *body[:-1]]), keepalive(9000, reply=True), *frames(body[-1:])]
    _, _, (conn,) = run([script])
    assert conn.reports[0] == (0, 0)  # the answer while the transaction was open
    assert conn.final == (3208, 3208)


def test_status_updates_wait_for_their_interval() -> None:
    script = frames([(1000, REL_MSG), *txn(32, 3300, insert(OID, row(1)))])
    _, _, (conn,) = run([script], status_interval=3600.0)
    assert conn.reports == []  # not due within the run: only the final one went out
    assert conn.final == (3308, 3308)


def test_end_position_stops_the_stream() -> None:
    script = frames([(1000, REL_MSG), *txn(33, 3400, insert(OID, row(1))), *txn(34, 3500, insert(OID, row(2)))])
    streamer, sink, (conn,) = run([script], endpos=3408)
    assert streamer.stats.stop_reason == "reached end position 0/D50"
    assert sink.boundaries == [(3400, 3408)]
    assert conn.final == (3408, 3408)


# --- resume -------------------------------------------------------------------------------------


def test_resume_starts_after_the_output_and_skips_transactions_it_holds() -> None:
    held = Resume(last_commit_lsn=1100, last_end_lsn=1108, source="memory")
    script = frames(
        [
            (1000, REL_MSG),
            *txn(40, 1100, insert(OID, row(1))),  # resent by the server: already in the output
            *txn(41, 1200, insert(OID, row(2))),
        ]
    )
    streamer, sink, (conn,) = run([script], sink=MemorySink(held))
    assert conn.started_at == 1108
    records = sink.records()
    assert [r["op"] for r in records] == ["relation", "begin", "insert", "commit"]
    assert records[2]["new"]["id"] == 2
    assert sink.boundaries == [(1200, 1208)]
    assert streamer.stats.rows == 1 and streamer.stats.transactions == 1
    assert conn.final == (1208, 1208)  # never the resume position itself


def test_a_lost_connection_drops_the_cut_transaction_and_reconnects_after_the_written_one() -> None:
    first = frames([(1000, REL_MSG), *txn(50, 1100, insert(OID, row(1))), *txn(51, 1200, insert(OID, row(2)))[:-1]])
    second = frames([(1000, REL_MSG), *txn(51, 1200, insert(OID, row(2)))])
    streamer, sink, (c1, c2) = run([[*first, StreamEnded("connection lost")], second])
    assert c1.closed and c2.started_at == 1108
    assert sink.discards == 1
    assert [r.get("new", {}).get("id") for r in sink.records() if r["op"] == "insert"] == [1, 2]
    assert sink.boundaries == [(1100, 1108), (1200, 1208)]
    assert streamer.stats.reconnects == 1
    assert c2.final == (1208, 1208)


def test_no_loop_turns_a_lost_connection_into_an_error() -> None:
    script = frames([(1000, REL_MSG), *txn(52, 1100, insert(OID, row(1)))])
    with pytest.raises(StreamLost, match="--no-loop"):
        run([[*script, StreamEnded("connection lost")]], no_loop=True)


# --- filters ------------------------------------------------------------------------------------


def mixed() -> list[bytes]:
    body = (
        insert(OID, row(1)),
        insert(OTHER_OID, row(2)),
        update(OID, row(3)),
        delete(OID, row(4)),
        truncate([OID, OTHER_OID], 0),
        message(True, 1090, "m", b"x"),
    )
    return frames([(1000, REL_MSG), (1001, OTHER_REL), *txn(60, 1100, *body)])


def test_table_filter_keeps_rows_relations_and_truncated_tables_of_matching_tables() -> None:
    _, sink, _ = run([mixed()], tables=("public.*",))
    records = sink.records()
    ops = [r["op"] for r in records]
    assert ops == ["relation", "begin", "insert", "update", "delete", "truncate", "message", "commit"]
    assert {r["table"] for r in records if "table" in r} == {"items"}
    assert [(t["schema"], t["table"]) for t in records[5]["tables"]] == [("public", "items")]
    assert sink.boundaries == [(1100, 1108)]


def test_exclude_table_and_op_filters() -> None:
    _, sink, _ = run([mixed()], exclude_tables=("items",), ops=parse_ops("insert,truncate"))
    records = sink.records()
    assert [r["op"] for r in records] == ["relation", "begin", "insert", "truncate", "commit"]
    assert records[2]["table"] == "log"
    assert sink.boundaries == [(1100, 1108)]  # a filtered transaction is still a boundary


def test_raw_output_finds_boundaries_in_the_bytes() -> None:
    script = frames([(1000, REL_MSG), *txn(70, 1100, insert(OID, row(1))), (1200, message(False, 1200, "n", b""))])
    streamer, sink, (conn,) = run([script], fmt="raw")
    assert bytes(sink.buf).split(b"\n")[1][:1] == b"B"
    assert sink.boundaries == [(1100, 1108), (1200, 1200)]
    assert conn.final == (1200, 1200)
    assert streamer.decode_needed is False


# --- the pipeline on its own (what peek uses) ----------------------------------------------------


def test_pipeline_alone_filters_and_reports_units() -> None:
    from pgrecv.decode.pgoutput import PgOutputDecoder

    got: list[str] = []
    units: list[tuple[int, int, bool]] = []
    pipe = Pipeline(
        lambda event, msg: got.append(type(event).__name__),
        boundary=lambda c, e, counted: units.append((c, e, counted)),
        ops=frozenset({"delete"}),
    )
    handle = pipe.handler(PgOutputDecoder(1).decode)
    for frame in mixed():
        handle(frame[XLOGDATA_HEADER.size :], 0)
    assert got == ["Relation", "Relation", "Begin", "Delete", "Commit"]
    assert units == [(1100, 1108, True)]
    assert pipe.counts.rows == 1 and not pipe.in_txn


# --- pacing (stream/pacing.py) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "latency"),
    [
        ({"status_interval": 10.0, "fsync_interval": 10.0}, False),  # pgrecv start's defaults
        ({"status_interval": 10.0, "fsync_interval": 0.0}, True),  # -F 0
        ({"status_interval": 0.0, "fsync_interval": 10.0}, True),  # -s 0
        ({"status_interval": 10.0, "fsync_interval": 10.0, "synchronous": True}, True),
    ],
)
def test_a_burst_then_a_dry_socket_pauses_once_and_loses_nothing(config: dict[str, Any], latency: bool) -> None:
    burst = frames([(1000, REL_MSG), *txn(10, 1100, *[insert(OID, row(i)) for i in range(100)])])
    after = frames(txn(11, 1300, insert(OID, row(100))))
    # the burst's last read brings messages (read on), the next finds the socket dry (pause);
    # where a commit may wait for this receiver, the pause is the short one
    _, sink, (conn,) = run([[*burst, DRAINED, DRAINED, *after]], **config)
    assert conn.pauses == [latency]
    assert [r["new"]["id"] for r in sink.records() if r["op"] == "insert"] == list(range(101))
    assert sink.boundaries == [(1100, 1108), (1300, 1308)]


def test_a_trickle_of_small_transactions_never_pauses() -> None:
    script: list[Item] = [*frames([(1000, REL_MSG)])]
    for i in range(50):
        script += [*frames(txn(10 + i, 2000 + 100 * i, insert(OID, row(i)))), DRAINED, DRAINED]
    _, sink, (conn,) = run([script])
    assert conn.pauses == []
    assert len(sink.boundaries) == 50
