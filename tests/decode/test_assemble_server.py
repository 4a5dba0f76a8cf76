"""StreamAssembler against real servers: a slot's streamed output, assembled and decoded, must equal
the same slot's output with streaming off (peek does not consume, so both views see the same WAL)."""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pgrecv import events as ev
from pgrecv.decode.assemble import StreamAssembler
from pgrecv.decode.pgoutput import PgOutputDecoder

Captured = list[tuple[bytes, int]]


def _major(server: Any) -> int:
    return int(str(server.version).split(".")[0])


@contextlib.contextmanager
def _conn(dsn: str, autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=autocommit) as conn:
        yield conn


@pytest.fixture
def slot(db_dsn: str) -> Iterator[str]:
    """A logical slot name unique on the shared server, dropped afterwards (a database that still has
    a slot cannot be dropped)."""
    with _conn(db_dsn) as c:
        row = c.execute("SELECT current_database()").fetchone()
    assert row is not None
    name = f"asm_{row[0]}"[:63]
    yield name
    with _conn(db_dsn) as c:
        for _ in range(100):  # a walsender that was just told to stop may hold the slot for a moment
            try:
                c.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (name,)
                )
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.1)


def _setup(dsn: str, slot: str, *, two_phase: bool = False) -> None:
    with _conn(dsn) as c:
        c.execute("CREATE TABLE big (id int PRIMARY KEY, payload text)")
        c.execute("CREATE TABLE sub_only (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE small (id int PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION p FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)", (slot, two_phase))


def _lsn_int(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _capture(dsn: str, slot: str, **options: str) -> Captured:
    args = ", ".join(f"'{k}', '{v}'" for k, v in options.items())
    with _conn(dsn) as c:
        c.execute("SET logical_decoding_work_mem = '64kB'")
        rows = c.execute(
            f"SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, {args})", (slot,)
        ).fetchall()
    return [(bytes(data), _lsn_int(lsn)) for lsn, data in rows]


def _assemble(captured: Captured, memory_limit: int) -> tuple[Captured, StreamAssembler]:
    asm = StreamAssembler(memory_limit=memory_limit)
    out: Captured = []
    for data, lsn in captured:
        out.extend((bytes(m), ml) for m, ml in asm.feed(data, lsn))
    return out, asm


def _decode(captured: Captured, proto: int) -> list[ev.Event]:
    dec = PgOutputDecoder(proto)
    return [dec.decode(data, lsn) for data, lsn in captured]


def _rows_and_frames(events: list[ev.Event]) -> list[ev.Event]:
    """Everything but Relation/Type messages, whose placement legitimately differs: pgoutput sends a
    schema once per streamed transaction but once per session for plain ones (every row event still
    carries its decoded Relation, so schemas are compared through the rows)."""
    return [e for e in events if not isinstance(e, ev.Relation | ev.TypeInfo)]


def _workload(dsn: str, step: Callable[[str], None] = lambda what: None) -> None:
    """A large transaction with a rolled-back savepoint (the first rows of `sub_only`), a rolled-back
    DDL, a released savepoint, small transactions committed meanwhile, a large aborted transaction and
    logical messages. ``step`` runs after each statement of the large transaction (live capture)."""
    with _conn(dsn, autocommit=False) as a, _conn(dsn) as b:
        a.execute("INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(1, 1500) g")
        step("")
        b.execute("INSERT INTO small VALUES (1, 'committed during the big one')")
        a.execute("SAVEPOINT s1")
        # > 64kB inside the subtransaction: live, it is streamed before the rollback, Relation included
        a.execute("INSERT INTO sub_only SELECT g, repeat('r', 100) FROM generate_series(1, 1500) g")
        step("subxact streamed")
        a.execute("UPDATE big SET payload = 'in rolled back subxact' WHERE id <= 300")
        step("")
        a.execute("ROLLBACK TO SAVEPOINT s1")
        step("")
        a.execute("INSERT INTO sub_only SELECT g, 'kept' FROM generate_series(1, 200) g")
        step("")
        a.execute("SAVEPOINT s2")
        a.execute("ALTER TABLE sub_only ADD COLUMN extra int DEFAULT 7")
        step("")
        a.execute("INSERT INTO sub_only SELECT g, repeat('d', 100), g FROM generate_series(10001, 11000) g")
        step("")
        a.execute("ROLLBACK TO SAVEPOINT s2")
        step("")
        a.execute("SAVEPOINT s3")
        a.execute("UPDATE big SET payload = 'released' WHERE id % 10 = 0")
        step("")
        a.execute("RELEASE SAVEPOINT s3")
        b.execute("INSERT INTO small VALUES (2, 'again during')")
        a.execute("SELECT pg_logical_emit_message(true, 'asm', 'transactional')")
        step("")
        a.execute("SELECT pg_logical_emit_message(false, 'asm', 'not transactional')")
        step("")
        a.execute("DELETE FROM big WHERE id > 1400")
        step("")
        a.execute("INSERT INTO sub_only SELECT g, 'tail' FROM generate_series(201, 400) g")
        step("")
        a.commit()
        step("")
        b.execute("INSERT INTO small VALUES (3, 'after')")
        a.execute("INSERT INTO big SELECT g, repeat('z', 200) FROM generate_series(5001, 7000) g")
        step("")
        a.rollback()
        step("")
        b.execute("INSERT INTO small VALUES (4, 'after the aborted one')")


def _check_equal(dsn: str, slot: str, proto: int, streaming: str, base: dict[str, str]) -> Captured:
    streamed = _capture(dsn, slot, proto_version=str(proto), streaming=streaming, **base)
    plain = _capture(dsn, slot, proto_version=str(proto), **base)
    kinds = {chr(m[0]) for m, _ in streamed}
    assert {"S", "E", "A"} <= kinds, "the workload must be streamed, with a subtransaction abort"
    want = _rows_and_frames(_decode(plain, proto))
    assert sum(isinstance(e, ev.Insert) for e in want) > 1000
    for limit in (64 << 20, 0, 10_000):
        assembled, asm = _assemble(streamed, limit)
        assert asm.idle and asm.pending_bytes == 0
        got = _rows_and_frames(_decode(assembled, proto))
        assert got == want  # same rows (with their relations and LSNs), same frames, same order
        asm.close()
    return streamed


def test_streamed_output_assembles_into_the_unstreamed_output(db_dsn: str, slot: str) -> None:
    _setup(db_dsn, slot)
    _workload(db_dsn)
    _check_equal(db_dsn, slot, 2, "on", {"publication_names": "p", "messages": "true"})


def test_parallel_streaming_abort_layout(pg_server: Any, db_dsn: str, slot: str) -> None:
    if _major(pg_server) < 16:
        pytest.skip("streaming=parallel needs PostgreSQL 16+")
    _setup(db_dsn, slot)
    _workload(db_dsn)
    streamed = _check_equal(db_dsn, slot, 4, "parallel", {"publication_names": "p", "messages": "true"})
    assert {len(m) for m, _ in streamed if m[:1] == b"A"} == {25}


def test_streamed_two_phase_assembles_like_unstreamed(db_dsn: str, slot: str) -> None:
    _setup(db_dsn, slot, two_phase=True)
    with _conn(db_dsn, autocommit=False) as a, _conn(db_dsn) as b:
        for gid, finish in (("asm-commit", "COMMIT"), ("asm-rollback", "ROLLBACK")):
            base = 100_000 if finish == "ROLLBACK" else 0
            a.execute(f"INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series({base + 1}, {base + 1000}) g")
            b.execute(f"INSERT INTO small VALUES ({base + 1}, 'between')")
            a.execute("SAVEPOINT s")
            a.execute(
                f"INSERT INTO sub_only SELECT g, repeat('r', 100) FROM generate_series({base + 1}, {base + 900}) g"
            )
            a.execute("ROLLBACK TO SAVEPOINT s")
            a.execute(f"INSERT INTO sub_only VALUES ({base + 5000}, 'kept')")
            a.execute(f"PREPARE TRANSACTION '{gid}'")
            a.commit()
            b.execute(f"{finish} PREPARED '{gid}'")
    streamed = _check_equal(db_dsn, slot, 3, "on", {"publication_names": "p", "two_phase": "on"})
    # PostgreSQL 17+ knows at decoding time that the second one was rolled back and does not stream it
    assert any(m[:1] == b"p" for m, _ in streamed)
    outcome = [type(e) for e in _decode(_assemble(streamed, 0)[0], 3)]
    assert outcome.count(ev.BeginPrepare) == outcome.count(ev.Prepare) == 2
    assert outcome.count(ev.CommitPrepared) == outcome.count(ev.RollbackPrepared) == 1


def test_lone_streamed_transaction_is_byte_identical_to_unstreamed(db_dsn: str, slot: str) -> None:
    """Synthesised Begin/Commit equal the server's own, LSNs included, and so does everything else."""
    _setup(db_dsn, slot)
    with _conn(db_dsn, autocommit=False) as a:
        a.execute("INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(1, 2000) g")
        a.execute("SAVEPOINT s")
        a.execute("INSERT INTO sub_only SELECT g, 'released' FROM generate_series(1, 500) g")
        a.execute("RELEASE SAVEPOINT s")
        a.execute("UPDATE big SET payload = 'u' WHERE id % 3 = 0")
        a.execute("DELETE FROM big WHERE id % 7 = 0")
        a.execute("TRUNCATE small")
        a.commit()
    streamed = _capture(db_dsn, slot, proto_version="2", publication_names="p", streaming="on")
    plain = _capture(db_dsn, slot, proto_version="2", publication_names="p")
    assert [m[:1] for m, _ in streamed].count(b"S") > 3
    for limit in (64 << 20, 0):
        assert _assemble(streamed, limit)[0] == plain


def test_large_aborted_transaction_leaves_nothing(db_dsn: str, slot: str) -> None:
    _setup(db_dsn, slot)
    with _conn(db_dsn, autocommit=False) as a, _conn(db_dsn) as b:
        a.execute("INSERT INTO big SELECT g, repeat('a', 300) FROM generate_series(1, 3000) g")
        b.execute("INSERT INTO small VALUES (1, 'during')")
        a.execute("INSERT INTO big SELECT g, repeat('a', 300) FROM generate_series(3001, 4000) g")
        a.rollback()
        # an abort record is not flushed by itself and peek reads only flushed WAL: commit something
        b.execute("INSERT INTO small VALUES (2, 'after')")
    streamed = _capture(db_dsn, slot, proto_version="2", streaming="on", publication_names="p")
    plain = _capture(db_dsn, slot, proto_version="2", publication_names="p")
    for limit in (64 << 20, 0):
        out, asm = _assemble(streamed, limit)
        assert asm.idle
        assert _decode(out, 2) == _decode(plain, 2)
    rows = [e for e in _decode(plain, 2) if isinstance(e, ev.Insert)]
    assert [r.relation.name for r in rows] == ["small", "small"]


# --- live: the exact case of a Relation message inside a subtransaction rolled back later -----------


class _Live:
    """START_REPLICATION pumped by hand (psycopg 3.3 + libpq, see NOTES), decoding live as WAL is
    flushed: unlike peek after the fact, the server streams a subtransaction before it is rolled back."""

    def __init__(self, dsn: str, slot: str, options: dict[str, str]) -> None:
        self.conn = psycopg.connect(
            dsn,
            autocommit=True,
            prepare_threshold=None,
            replication="database",
            options="-c logical_decoding_work_mem=64kB",
        )
        opts = ", ".join(f"\"{k}\" '{v}'" for k, v in options.items())
        self.conn.execute(f"START_REPLICATION SLOT {slot} LOGICAL 0/0 ({opts})")
        self.got: Captured = []

    def pump_until(self, done: Callable[[Captured], bool], timeout: float = 30.0) -> None:
        pg = self.conn.pgconn
        deadline = time.monotonic() + timeout
        while not done(self.got):
            n, buf = pg.get_copy_data(1)
            if n > 0:
                if buf[0] == 0x77:  # XLogData
                    self.got.append((bytes(buf[25:]), int.from_bytes(buf[1:9], "big")))
                continue
            assert n == 0, "the server ended the stream"
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; received {[chr(m[0]) for m, _ in self.got][-20:]}"
            select.select([pg.socket], [], [], min(left, 0.2))
            pg.consume_input()

    def pump_quiet(self, quiet: float = 0.2, timeout: float = 10.0) -> None:
        """Receive until the server has sent nothing for ``quiet`` seconds."""
        pg = self.conn.pgconn
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < deadline:
            n, buf = pg.get_copy_data(1)
            if n > 0:
                if buf[0] == 0x77:
                    self.got.append((bytes(buf[25:]), int.from_bytes(buf[1:9], "big")))
                    last = time.monotonic()
                continue
            assert n == 0, "the server ended the stream"
            if time.monotonic() - last >= quiet:
                return
            select.select([pg.socket], [], [], quiet / 3)
            pg.consume_input()

    def close(self) -> None:
        pg = self.conn.pgconn
        pg.put_copy_end()
        pg.flush()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            n, _ = pg.get_copy_data(1)
            if n < 0:
                break
            if n == 0:
                select.select([pg.socket], [], [], 0.2)
                pg.consume_input()
        while pg.get_result() is not None:
            pass
        self.conn.close()


def _relations_in_chunks(captured: Captured) -> list[tuple[int, int, str]]:
    """(chunk's top-level xid, xid prefix, table name) of every Relation message inside a chunk."""
    found = []
    top = None
    for m, _ in captured:
        kind = m[:1]
        if kind == b"S":
            top = int.from_bytes(m[1:5], "big")
        elif kind == b"E":
            top = None
        elif kind == b"R" and top is not None:
            ns_end = m.index(0, 9)
            name = m[ns_end + 1 : m.index(0, ns_end + 1)].decode()
            found.append((top, int.from_bytes(m[1:5], "big"), name))
    return found


def _in_aborted_sub(captured: Captured) -> bool:
    return any(x != top and name == "sub_only" for top, x, name in _relations_in_chunks(captured))


@pytest.mark.parametrize(("proto", "streaming"), [(2, "on"), (4, "parallel")])
def test_relation_sent_inside_a_rolled_back_subtransaction(
    pg_server: Any, db_dsn: str, slot: str, proto: int, streaming: str
) -> None:
    if proto == 4 and _major(pg_server) < 16:
        pytest.skip("streaming=parallel needs PostgreSQL 16+")
    _setup(db_dsn, slot)
    options = {"proto_version": str(proto), "publication_names": "p", "streaming": streaming}
    live = _Live(db_dsn, slot, options)
    try:
        with _conn(db_dsn, autocommit=False) as a, _conn(db_dsn) as b:
            a.execute("INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(1, 1000) g")
            a.execute("SAVEPOINT s1")
            # sub_only is first touched here: its Relation message goes out with the subxact's xid
            a.execute("INSERT INTO sub_only SELECT g, repeat('r', 100) FROM generate_series(1, 1500) g")
            b.execute("INSERT INTO small VALUES (1, 'flushes the WAL so far')")
            live.pump_until(_in_aborted_sub)
            a.execute("ROLLBACK TO SAVEPOINT s1")
            a.execute("INSERT INTO sub_only SELECT g, 'kept' FROM generate_series(1, 300) g")
            a.execute("INSERT INTO big SELECT g, repeat('y', 200) FROM generate_series(1001, 1500) g")
            a.commit()
            b.execute("INSERT INTO small VALUES (2, 'the end')")

        def finished(got: Captured) -> bool:
            marks = [i for i, (m, _) in enumerate(got) if m[:1] == b"I" and m.endswith(b"the end")]
            return bool(marks) and any(m[:1] == b"C" for m, _ in got[marks[0] :])

        live.pump_until(finished)
    finally:
        live.close()
    streamed = live.got
    aborts = [m for m, _ in streamed if m[:1] == b"A"]
    assert aborts and {len(m) for m in aborts} == {25 if streaming == "parallel" else 9}
    # the Relation of sub_only went out inside the subtransaction, which was then rolled back ...
    sub = next(x for top, x, name in _relations_in_chunks(streamed) if name == "sub_only" and x != top)
    assert sub in {int.from_bytes(m[5:9], "big") for m in aborts}
    # ... and pgoutput sent it again for the rows kept after the rollback (in the new subtransaction
    # ROLLBACK TO starts), so dropping it with the aborted subtransaction is right
    aborted = {int.from_bytes(m[5:9], "big") for m in aborts}
    assert any(name == "sub_only" and x not in aborted for _, x, name in _relations_in_chunks(streamed))

    plain = _capture(db_dsn, slot, proto_version=str(proto), publication_names="p")
    want = _rows_and_frames(_decode(plain, proto))
    assert [e.new[1] for e in want if isinstance(e, ev.Insert) and e.relation.name == "sub_only"] == ["kept"] * 300
    for limit in (64 << 20, 0):
        assembled, asm = _assemble(streamed, limit)
        assert asm.idle
        assert _rows_and_frames(_decode(assembled, proto)) == want


@pytest.mark.parametrize(("proto", "streaming"), [(2, "on"), (4, "parallel")])
def test_live_workload_assembles_into_the_unstreamed_output(
    pg_server: Any, db_dsn: str, slot: str, proto: int, streaming: str
) -> None:
    """The main workload decoded while it runs, as `pgrecv start` sees it."""
    if proto == 4 and _major(pg_server) < 16:
        pytest.skip("streaming=parallel needs PostgreSQL 16+")
    _setup(db_dsn, slot)
    options = {"proto_version": str(proto), "publication_names": "p", "streaming": streaming, "messages": "true"}
    live = _Live(db_dsn, slot, options)
    try:
        with _conn(db_dsn) as flusher:

            def step(what: str) -> None:
                flusher.execute("SELECT txid_current()")  # a commit record: the WAL so far is flushed
                if what == "subxact streamed":
                    live.pump_until(_in_aborted_sub)
                else:
                    live.pump_quiet()

            _workload(db_dsn, step)
            flusher.execute("SELECT txid_current()")
            live.pump_quiet()
    finally:
        live.close()
    streamed = live.got
    kinds = {m[:1] for m, _ in streamed}
    assert {b"S", b"E", b"A", b"c"} <= kinds
    aborted = {int.from_bytes(m[5:9], "big") for m, _ in streamed if m[:1] == b"A"}
    in_chunks = {x for _, x, _ in _relations_in_chunks(streamed)}
    assert aborted & in_chunks, "a Relation message went out inside a subtransaction rolled back later"
    plain = _capture(db_dsn, slot, proto_version=str(proto), publication_names="p", messages="true")
    want = _rows_and_frames(_decode(plain, proto))
    for limit in (64 << 20, 0, 10_000):
        assembled, asm = _assemble(streamed, limit)
        assert asm.idle
        assert _rows_and_frames(_decode(assembled, proto)) == want
