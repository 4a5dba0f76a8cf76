"""StreamAssembler on hand-built pgoutput byte sequences (layouts from proto.c / the protocol docs)."""

from __future__ import annotations

import os
import struct
import tracemalloc
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgrecv.decode.assemble import StreamAssembler
from pgrecv.errors import DecodeError, OutputError

# --- message builders, written from the documented layouts -----------------------------------


def stream_start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack(">IB", xid, 1 if first else 0)


STOP = b"E"


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, time: int, flags: int = 0) -> bytes:
    return b"c" + struct.pack(">IBQQq", xid, flags, commit_lsn, end_lsn, time)


def stream_abort(xid: int, subxid: int, abort_lsn: int | None = None, abort_time: int = 0) -> bytes:
    msg = b"A" + struct.pack(">II", xid, subxid)
    if abort_lsn is not None:  # protocol 4, streaming=parallel
        msg += struct.pack(">Qq", abort_lsn, abort_time)
    return msg


def stream_prepare(xid: int, prepare_lsn: int, end_lsn: int, time: int, gid: str) -> bytes:
    return b"p" + struct.pack(">BQQqI", 0, prepare_lsn, end_lsn, time, xid) + gid.encode() + b"\0"


def begin(final_lsn: int, time: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, time, xid)


def commit(commit_lsn: int, end_lsn: int, time: int, flags: int = 0) -> bytes:
    return b"C" + struct.pack(">BQQq", flags, commit_lsn, end_lsn, time)


def begin_prepare(prepare_lsn: int, end_lsn: int, time: int, xid: int, gid: str) -> bytes:
    return b"b" + struct.pack(">QQqI", prepare_lsn, end_lsn, time, xid) + gid.encode() + b"\0"


def prepare(prepare_lsn: int, end_lsn: int, time: int, xid: int, gid: str) -> bytes:
    return b"P" + struct.pack(">BQQqI", 0, prepare_lsn, end_lsn, time, xid) + gid.encode() + b"\0"


def insert(relid: int, text: bytes, xid: int | None = None) -> bytes:
    """'I' [xid] relid 'N' natts=1 't' len text."""
    prefix = b"" if xid is None else struct.pack(">I", xid)
    return b"I" + prefix + struct.pack(">IcHcI", relid, b"N", 1, b"t", len(text)) + text


def relation(relid: int, name: bytes, xid: int | None = None) -> bytes:
    """'R' [xid] relid namespace name replident natts=1 (flags name type typmod)."""
    prefix = b"" if xid is None else struct.pack(">I", xid)
    return (
        b"R"
        + prefix
        + struct.pack(">I", relid)
        + b"public\0"
        + name
        + b"\0d"
        + struct.pack(">H", 1)
        + (b"\x01id\0" + struct.pack(">Ii", 23, -1))
    )


def origin(name: bytes, lsn: int = 0) -> bytes:
    return b"O" + struct.pack(">Q", lsn) + name + b"\0"


def message(prefix: bytes, content: bytes, transactional: bool, xid: int | None = None) -> bytes:
    head = b"" if xid is None else struct.pack(">I", xid)
    return (
        b"M"
        + head
        + bytes([1 if transactional else 0])
        + struct.pack(">Q", 0x10)
        + prefix
        + b"\0"
        + (struct.pack(">I", len(content)) + content)
    )


def strip(msg: bytes) -> bytes:
    """What a streamed message looks like without its xid prefix."""
    return msg[:1] + msg[5:]


def run(asm: StreamAssembler, msgs: Iterable[tuple[bytes, int]], views: bool = False) -> list[tuple[bytes, int]]:
    """Feed everything, collect the output; ``views``: pass memoryview slices, as psycopg hands out."""
    out: list[tuple[bytes, int]] = []
    for payload, lsn in msgs:
        data = memoryview(b"w" * 25 + payload)[25:] if views else payload
        out.extend((bytes(m), ml) for m, ml in asm.feed(data, lsn))
    return out


def numbered(msgs: list[bytes], start: int = 0x1000) -> list[tuple[bytes, int]]:
    return [(m, start + i) for i, m in enumerate(msgs)]


# --- pass-through ------------------------------------------------------------------------


def test_plain_messages_pass_through_untouched() -> None:
    asm = StreamAssembler()
    seq = [begin(0x500, 7, 900), relation(16384, b"t"), insert(16384, b"1"), commit(0x500, 0x530, 7)]
    for i, m in enumerate(seq):
        out = asm.feed(m, i)
        assert list(out) == [(m, i)]
        assert next(iter(out))[0] is m  # no copy
        assert asm.passes(m)
    view = memoryview(b"xx" + insert(16384, b"2"))[2:]
    assert next(iter(asm.feed(view, 9)))[0] is view
    assert asm.idle and asm.open_transactions == 0 and asm.pending_bytes == 0


# --- one streamed transaction ------------------------------------------------------------


def test_streamed_transaction_comes_out_whole_as_a_plain_one() -> None:
    asm = StreamAssembler()
    xid = 731
    chunk1 = [relation(16384, b"t", xid), insert(16384, b"a", xid), insert(16384, b"b", xid)]
    chunk2 = [insert(16384, b"c", xid)]
    seq = [
        (stream_start(xid, True), 0x100),
        *[(m, 0x101 + i) for i, m in enumerate(chunk1)],
        (STOP, 0x110),
        (stream_start(xid, False), 0x200),
        (chunk2[0], 0x201),
        (STOP, 0x210),
    ]
    for m, lsn in seq:
        assert list(asm.feed(m, lsn)) == []
        assert not asm.passes(m)
    assert asm.open_transactions == 1 and not asm.idle
    assert asm.pending_bytes > sum(len(m) - 4 for m in chunk1 + chunk2)
    out = run(asm, [(stream_commit(xid, 0x300, 0x330, 12345), 0x330)])
    assert out == [
        (begin(0x300, 12345, xid), 0x100),
        (strip(chunk1[0]), 0x101),
        (strip(chunk1[1]), 0x102),
        (strip(chunk1[2]), 0x103),
        (strip(chunk2[0]), 0x201),
        (commit(0x300, 0x330, 12345), 0x330),
    ]
    assert out[1][0] == relation(16384, b"t") and out[2][0] == insert(16384, b"a")
    assert asm.idle and asm.memory_bytes == 0 and asm.pending_bytes == 0


def test_commit_flags_and_negative_times_are_carried_over() -> None:
    asm = StreamAssembler()
    run(asm, numbered([stream_start(5, True), insert(1, b"x", 5), STOP]))
    out = run(asm, [(stream_commit(5, 0x77, 0x99, -1, flags=3), 1)])
    assert out[0][0] == begin(0x77, -1, 5)
    assert out[-1][0] == commit(0x77, 0x99, -1, flags=3)


def test_state_flags_follow_the_chunks() -> None:
    asm = StreamAssembler()
    assert not asm.in_chunk and asm.idle
    run(asm, [(stream_start(5, True), 1)])
    assert asm.in_chunk and not asm.idle
    run(asm, [(STOP, 2)])
    assert not asm.in_chunk and not asm.idle and asm.open_transactions == 1
    run(asm, [(stream_abort(5, 5), 3)])
    assert asm.idle and asm.open_transactions == 0


# --- interleaving ------------------------------------------------------------------------


def test_interleaved_streams_and_plain_transactions_come_out_in_commit_order() -> None:
    asm = StreamAssembler()
    a, b = 100, 200
    plain = [begin(0x150, 1, 150), insert(7, b"plain"), commit(0x150, 0x160, 1)]
    seq = [
        stream_start(a, True), insert(7, b"a1", a), STOP,
        stream_start(b, True), insert(7, b"b1", b), STOP,
        *plain,
        stream_start(a, False), insert(7, b"a2", a), STOP,
        stream_start(b, False), insert(7, b"b2", b), STOP,
        stream_commit(b, 0x400, 0x410, 2),
        stream_commit(a, 0x500, 0x510, 3),
    ]  # fmt: skip
    out = [m for m, _ in run(asm, numbered(seq))]
    assert out == [
        *plain,
        begin(0x400, 2, b), insert(7, b"b1"), insert(7, b"b2"), commit(0x400, 0x410, 2),
        begin(0x500, 3, a), insert(7, b"a1"), insert(7, b"a2"), commit(0x500, 0x510, 3),
    ]  # fmt: skip


# --- aborts ------------------------------------------------------------------------------


@pytest.mark.parametrize("parallel", [False, True])
def test_subtransaction_abort_drops_its_messages_relation_included(parallel: bool) -> None:
    asm = StreamAssembler()
    top, sub, sub2 = 500, 501, 502
    abort_lsn = 0x280 if parallel else None
    seq = [
        stream_start(top, True), insert(1, b"top1", top),
        relation(2, b"u", sub), insert(2, b"sub1", sub), STOP,
        stream_start(top, False), insert(2, b"sub2", sub), insert(1, b"sub2-1", sub2), STOP,
        stream_abort(top, sub, abort_lsn, 99),
        stream_start(top, False), relation(2, b"u", top), insert(2, b"top2", top), STOP,
        stream_commit(top, 0x300, 0x310, 4),
    ]  # fmt: skip
    out = [m for m, _ in run(asm, numbered(seq))]
    assert out == [
        begin(0x300, 4, top),
        insert(1, b"top1"),
        insert(1, b"sub2-1"),
        relation(2, b"u"),
        insert(2, b"top2"),
        commit(0x300, 0x310, 4),
    ]


def test_toplevel_abort_drops_the_transaction_and_unknown_aborts_are_ignored() -> None:
    asm = StreamAssembler()
    seq = [
        stream_start(10, True), insert(1, b"x", 10), insert(1, b"y", 11), STOP,
        stream_abort(10, 10),
        stream_abort(12, 12),  # never streamed here: nothing to drop
        stream_abort(12, 13, 0x99, 1),
    ]  # fmt: skip
    assert run(asm, numbered(seq)) == []
    assert asm.idle and asm.pending_bytes == 0


def test_abort_of_a_subtransaction_never_seen_changes_nothing() -> None:
    asm = StreamAssembler()
    seq = [stream_start(10, True), insert(1, b"x", 10), STOP, stream_abort(10, 77), stream_commit(10, 5, 6, 7)]
    out = [m for m, _ in run(asm, numbered(seq))]
    assert out == [begin(5, 7, 10), insert(1, b"x"), commit(5, 6, 7)]


def test_committed_transaction_left_empty_produces_nothing() -> None:
    asm = StreamAssembler()
    seq = [
        stream_start(10, True), STOP, stream_commit(10, 5, 6, 7),
        stream_start(20, True), insert(1, b"x", 21), STOP, stream_abort(20, 21), stream_commit(20, 8, 9, 7),
    ]  # fmt: skip
    assert run(asm, numbered(seq)) == []
    assert asm.idle


# --- origin, messages --------------------------------------------------------------------


def test_origin_after_first_stream_start_is_kept_in_place() -> None:
    asm = StreamAssembler()
    seq = [stream_start(9, True), origin(b"node1", 0), insert(1, b"x", 9), STOP, stream_commit(9, 5, 6, 7)]
    out = [m for m, _ in run(asm, numbered(seq))]
    assert out == [begin(5, 7, 9), origin(b"node1", 0), insert(1, b"x"), commit(5, 6, 7)]


def test_logical_messages_transactional_buffered_non_transactional_out_at_once() -> None:
    asm = StreamAssembler()
    tx = message(b"p", b"in-txn", True, 9)
    nontx = message(b"p", b"now", False, 9)
    assert run(asm, numbered([stream_start(9, True), tx])) == []
    assert [m for m, _ in run(asm, [(nontx, 1)])] == [strip(nontx)]
    out = [m for m, _ in run(asm, numbered([STOP, stream_commit(9, 5, 6, 7)]))]
    assert out == [begin(5, 7, 9), strip(tx), commit(5, 6, 7)]
    assert strip(tx) == message(b"p", b"in-txn", True)


# --- two-phase ---------------------------------------------------------------------------


def test_stream_prepare_becomes_begin_prepare_and_prepare() -> None:
    asm = StreamAssembler()
    gid = "pgrecv-gid-1"
    commit_prepared = b"K" + struct.pack(">BQQqI", 0, 0x900, 0x910, 11, 42) + gid.encode() + b"\0"
    seq = [
        stream_start(42, True), insert(1, b"x", 42), insert(1, b"sub", 43), STOP,
        stream_abort(42, 43),
        stream_prepare(42, 0x600, 0x610, 10, gid),
        commit_prepared,
    ]  # fmt: skip
    out = run(asm, numbered(seq, 0x100))
    assert out == [
        (begin_prepare(0x600, 0x610, 10, 42, gid), 0x100),
        (insert(1, b"x"), 0x101),
        (prepare(0x600, 0x610, 10, 42, gid), 0x105),
        (commit_prepared, 0x106),
    ]
    assert asm.idle


def test_empty_stream_prepare_still_frames_the_transaction() -> None:
    asm = StreamAssembler()
    out = [m for m, _ in run(asm, numbered([stream_start(42, True), STOP, stream_prepare(42, 6, 7, 8, "g")]))]
    assert out == [begin_prepare(6, 7, 8, 42, "g"), prepare(6, 7, 8, 42, "g")]


# --- restarts ----------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, 1 << 20])
def test_first_segment_again_restarts_the_buffer(limit: int) -> None:
    fds = _open_fds()
    asm = StreamAssembler(memory_limit=limit)
    seq = [
        stream_start(10, True), insert(1, b"old", 10), STOP,
        stream_start(10, True), insert(1, b"new", 10), STOP,
        stream_commit(10, 5, 6, 7),
    ]  # fmt: skip
    out = [m for m, _ in run(asm, numbered(seq))]
    assert out == [begin(5, 7, 10), insert(1, b"new"), commit(5, 6, 7)]
    assert asm.memory_bytes == 0 and asm.pending_bytes == 0
    assert _open_fds() == fds


@pytest.mark.parametrize("limit", [0, 1 << 20])
def test_plain_begin_for_a_buffered_xid_drops_the_stale_buffer(limit: int) -> None:
    asm = StreamAssembler(memory_limit=limit)
    run(asm, numbered([stream_start(10, True), insert(1, b"old", 10), STOP, stream_start(11, True), STOP]))
    plain = [begin(5, 7, 10), insert(1, b"new"), commit(5, 6, 7)]
    assert [m for m, _ in run(asm, numbered(plain))] == plain
    assert asm.open_transactions == 1  # 11 is still there
    plain_prepared = [begin_prepare(8, 9, 1, 11, "g"), insert(1, b"p"), prepare(8, 9, 1, 11, "g")]
    assert [m for m, _ in run(asm, numbered(plain_prepared))] == plain_prepared
    assert asm.idle and asm.pending_bytes == 0


def test_reset_forgets_everything() -> None:
    asm = StreamAssembler(memory_limit=0)
    run(asm, numbered([stream_start(10, True), insert(1, b"x" * 100, 10)]))
    assert asm.in_chunk and asm.spilled_bytes > 0
    asm.reset()
    assert asm.idle and not asm.in_chunk and asm.pending_bytes == 0
    assert run(asm, [(insert(1, b"plain"), 1)]) == [(insert(1, b"plain"), 1)]


# --- malformed input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seq", "needle"),
    [
        ([b""], "empty message"),
        ([STOP], "Stream Stop outside"),
        ([stream_commit(3, 1, 2, 3)], "never streamed"),
        ([stream_prepare(3, 1, 2, 3, "g")], "never streamed"),
        ([stream_start(3, False)], "first chunk never came"),
        ([stream_start(3, True), stream_start(4, True)], "unexpected message 'S'"),
        ([stream_start(3, True), begin(1, 2, 3)], "unexpected message 'B'"),
        ([stream_start(3, True), STOP, stream_start(3, False), stream_commit(3, 1, 2, 3)], "unexpected message 'c'"),
        ([stream_start(3, True), b"I\0\0"], "has no xid"),
        ([b"S\0\0\0\3"], "Stream Start of 5 bytes"),
        ([stream_start(3, True), STOP, stream_abort(3, 3)[:6]], "Stream Abort of 6 bytes"),
        ([stream_start(3, True), STOP, stream_commit(3, 1, 2, 3)[:20]], "Stream Commit of 20 bytes"),
        ([stream_start(3, True), STOP, stream_prepare(3, 1, 2, 3, "g")[:-1]], "Stream Prepare"),
        ([stream_start(3, True), b"\xff"], "unexpected message"),
    ],
)
def test_malformed_streams_raise_decode_error(seq: list[bytes], needle: str) -> None:
    asm = StreamAssembler()
    with pytest.raises(DecodeError, match=needle):
        run(asm, numbered(seq))


# --- spilling ----------------------------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("limit", [0, 50, 4096, 1 << 30])
def test_spilled_transactions_replay_identically(limit: int, tmp_path: os.PathLike[str]) -> None:
    a, b = 1000, 2000
    seq: list[bytes] = []
    expected_a: list[bytes] = []
    expected_b: list[bytes] = []
    for chunk in range(6):
        seq.append(stream_start(a, chunk == 0))
        for i in range(50):
            sub = a + 1 + (i % 3)
            m = insert(1, f"a{chunk}-{i}".encode() * (i % 7 + 1), sub)
            seq.append(m)
            if sub != a + 2:
                expected_a.append(strip(m))
        seq.append(STOP)
        seq.append(stream_start(b, chunk == 0))
        for i in range(20):
            m = insert(2, f"b{chunk}-{i}".encode(), b)
            seq.append(m)
            expected_b.append(strip(m))
        seq.append(STOP)
        seq.append(begin(1, 1, 3000 + chunk))  # plain ones keep passing through
        seq.append(commit(1, 2, 1))
    seq.append(stream_abort(a, a + 2))
    big = insert(1, os.urandom(3 << 20), a)  # larger than a read block
    seq += [stream_start(a, False), big, STOP]
    expected_a.append(strip(big))
    seq += [stream_commit(b, 0x50, 0x60, 1), stream_commit(a, 0x70, 0x80, 2)]
    fds = _open_fds()
    asm = StreamAssembler(memory_limit=limit, spill_dir=str(tmp_path))
    out = [m for m, _ in run(asm, numbered(seq), views=limit == 50)]
    plain = [m for m in seq if m[:1] in (b"B", b"C")]
    assert out == [
        *plain,
        begin(0x50, 1, b), *expected_b, commit(0x50, 0x60, 1),
        begin(0x70, 2, a), *expected_a, commit(0x70, 0x80, 2),
    ]  # fmt: skip
    assert asm.idle and asm.memory_bytes == 0
    assert os.listdir(tmp_path) == []  # spill files are anonymous
    assert _open_fds() == fds


def test_memory_stays_bounded_and_spill_is_used(tmp_path: os.PathLike[str]) -> None:
    limit = 1 << 20
    asm = StreamAssembler(memory_limit=limit, spill_dir=str(tmp_path))
    row = insert(16384, b"x" * 150, 77)
    n = 100_000  # ~16 MB buffered
    tracemalloc.start()
    try:
        asm.feed(stream_start(77, True), 1)
        for i in range(n):
            asm.feed(row, i)
            assert asm.memory_bytes <= limit + len(row) + 16
        asm.feed(STOP, 2)
        assert asm.spilled_bytes > 10 * limit
        count = 0
        size = 0
        for m, _ in asm.feed(stream_commit(77, 5, 6, 7), 3):
            count += 1
            size += len(m)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n + 2
    assert size == n * (len(row) - 4) + 21 + 26  # B is 21 bytes, C 26
    assert peak < limit + (4 << 20), peak


def test_close_releases_an_unfinished_replay(tmp_path: os.PathLike[str]) -> None:
    fds = _open_fds()
    asm = StreamAssembler(memory_limit=0, spill_dir=str(tmp_path))
    run(asm, numbered([stream_start(5, True), insert(1, b"x", 5), insert(1, b"y", 5), STOP]))
    it = iter(asm.feed(stream_commit(5, 1, 2, 3), 9))
    assert next(it)[0] == begin(1, 3, 5)
    run(asm, numbered([stream_start(6, True), insert(1, b"z", 6), STOP]))
    assert _open_fds() == fds + 2
    asm.close()
    assert _open_fds() == fds
    assert asm.idle


def test_spill_failure_is_an_output_error(tmp_path: os.PathLike[str]) -> None:
    asm = StreamAssembler(memory_limit=0, spill_dir=os.path.join(tmp_path, "missing"))
    with pytest.raises(OutputError, match="cannot spill streamed transaction 5"):
        run(asm, numbered([stream_start(5, True), insert(1, b"x", 5)]))


# --- property: random interleavings with random aborts ----------------------------------

KINDS = b"IUDRYTM"


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[bytes], list[bytes], int]:
    """A random valid stream and what it must assemble into."""
    ntx = draw(st.integers(1, 4))
    units: dict[int, list[tuple[str, object]]] = {}
    for t in range(ntx):
        top = 1000 * (t + 1)
        alive = [top, top + 1, top + 2, top + 3]
        tx_units: list[tuple[str, object]] = []
        for _ in range(draw(st.integers(1, 4))):
            msgs: list[bytes] = []
            for _ in range(draw(st.integers(0, 6))):
                sub = draw(st.sampled_from(alive))
                kind = draw(st.sampled_from(KINDS))
                body = draw(st.binary(max_size=40))
                if kind == ord("M"):
                    body = b"\x01" + body  # transactional
                msgs.append(bytes([kind]) + struct.pack(">I", sub) + body)
            tx_units.append(("chunk", msgs))
            subs = [s for s in alive if s != top]
            abort_one: bool = draw(st.booleans())
            if subs and abort_one:
                victim = draw(st.sampled_from(subs))
                alive.remove(victim)
                tx_units.append(("subabort", victim))
        tx_units.append(("end", draw(st.sampled_from(["commit", "abort", "prepare"]))))
        units[top] = tx_units

    stream: list[bytes] = []
    expected: list[bytes] = []
    kept: dict[int, list[bytes]] = {top: [] for top in units}
    aborted: dict[int, set[int]] = {top: set() for top in units}
    started: set[int] = set()
    plain_xid = 90_000
    while units:
        if draw(st.integers(0, 4)) == 0:
            plain_xid += 1
            plain = [begin(plain_xid, 1, plain_xid), insert(5, b"p"), commit(plain_xid, plain_xid + 1, 1)]
            stream += plain
            expected += plain
        top = draw(st.sampled_from(sorted(units)))
        what, arg = units[top].pop(0)
        if what == "chunk":
            assert isinstance(arg, list)
            stream.append(stream_start(top, top not in started))
            started.add(top)
            stream += arg
            kept[top] += arg
            stream.append(STOP)
        elif what == "subabort":
            assert isinstance(arg, int)
            stream.append(stream_abort(top, arg, draw(st.sampled_from([None, 0x1234]))))
            aborted[top].add(arg)
        else:
            del units[top]
            survivors = [strip(m) for m in kept[top] if struct.unpack_from(">I", m, 1)[0] not in aborted[top]]
            if arg == "commit":
                stream.append(stream_commit(top, top, top + 1, 2))
                if survivors:
                    expected += [begin(top, 2, top), *survivors, commit(top, top + 1, 2)]
            elif arg == "prepare":
                stream.append(stream_prepare(top, top, top + 1, 3, f"g{top}"))
                gid = f"g{top}"
                expected += [begin_prepare(top, top + 1, 3, top, gid), *survivors, prepare(top, top + 1, 3, top, gid)]
            else:
                stream.append(stream_abort(top, top))
    limit = draw(st.sampled_from([0, 30, 200, 1 << 20]))
    return stream, expected, limit


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(), st.booleans())
def test_random_interleavings_assemble_like_the_reference(
    case: tuple[list[bytes], list[bytes], int], views: bool
) -> None:
    stream, expected, limit = case
    with StreamAssembler(memory_limit=limit) as asm:
        out = [m for m, _ in run(asm, numbered(stream), views)]
        assert out == expected
        assert asm.idle and asm.memory_bytes == 0 and asm.pending_bytes == 0
