"""Property and fuzz tests: whatever the bytes, PgOutputDecoder returns an event or raises
DecodeError, never another exception; and what the builders write, it reads back."""

from __future__ import annotations

import os
import struct
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pgoutput import (  # the hand-written builders (same directory)
    COLS,
    OID,
    REL_MSG,
    ROW,
    begin,
    begin_prepare,
    commit,
    commit_prepared,
    delete,
    insert,
    message,
    origin,
    prepare,
    relation,
    rollback_prepared,
    stream_abort,
    stream_commit,
    stream_start,
    stream_stop,
    truncate,
    tuple_data,
    type_msg,
    update,
)

from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.errors import DecodeError
from pgrecv.events import UNCHANGED, Event, Insert, Update, Value

EVENT_TYPES = typing.get_args(Event)
# PGRECV_FUZZ_EXAMPLES=20000 for a deep run; the default keeps the suite fast.
FUZZ = settings(max_examples=int(os.environ.get("PGRECV_FUZZ_EXAMPLES", "300")), deadline=None)

# Every message type, as it appears outside (False) or inside (True) a streamed chunk.
VALID: list[tuple[bytes, bool]] = [
    (begin(0x100, 5, 700), False),
    (commit(0x100, 0x120, 5), False),
    (origin(0x99, "origin"), False),
    (REL_MSG, False),
    (type_msg(70001, "s", "mood"), False),
    (insert(OID, ROW), False),
    (update(OID, ROW), False),
    (update(OID, ROW, ROW, "K"), False),
    (update(OID, ROW, ("1", UNCHANGED, None, b"x"), "O"), False),
    (delete(OID, ROW, "K"), False),
    (delete(OID, ROW, "O"), False),
    (truncate([OID, OID], 3), False),
    (message(True, 0x55, "prefix", b"\x00\x01content"), False),
    (message(False, 0x55, "", b""), False),
    (stream_start(700, True), False),
    (stream_stop(), True),
    (stream_commit(700, 0x200, 0x230, 9), False),
    (stream_abort(700, 701), False),
    (stream_abort(700, 700, 0x300, 10), False),
    (begin_prepare(0x400, 0x430, 11, 702, "gid"), False),
    (prepare(0x400, 0x430, 11, 702, "gid"), False),
    (commit_prepared(0x500, 0x530, 12, 702, "gid"), False),
    (rollback_prepared(0x430, 0x560, 11, 13, 702, "gid"), False),
    (prepare(0x400, 0x430, 11, 703, "gid2", b"p"), False),
    (relation(OID, "public", "items", "d", COLS, xid=700), True),
    (type_msg(70001, "s", "mood", xid=700), True),
    (insert(OID, ROW, xid=700), True),
    (update(OID, ROW, ROW, "O", xid=700), True),
    (delete(OID, ROW, "K", xid=700), True),
    (truncate([OID], 1, xid=700), True),
    (message(True, 0x66, "p", b"c", xid=700), True),
]


def fresh(in_stream: bool, proto: int = 4) -> PgOutputDecoder:
    dec = PgOutputDecoder(proto)
    dec.decode(REL_MSG)
    if in_stream:
        dec.decode(stream_start(700, False))
    return dec


def event_or_decode_error(dec: PgOutputDecoder, data: bytes) -> Event | None:
    """The contract under test: an event of the model, or DecodeError with a pgoutput message."""
    try:
        ev = dec.decode(data, 1)
    except DecodeError as exc:
        assert str(exc).startswith("pgoutput: ")
        return None
    assert isinstance(ev, EVENT_TYPES)
    return typing.cast(Event, ev)


def test_valid_corpus_decodes() -> None:
    for msg, in_stream in VALID:
        assert event_or_decode_error(fresh(in_stream), msg) is not None, msg


def test_every_truncation_is_a_decode_error() -> None:
    """Each message of every type, cut at every length: an error naming the type and the cut."""
    for msg, in_stream in VALID:
        for cut in range(len(msg)):
            short = msg[:cut]
            expected = rf"pgoutput: truncated \w[\w ]* message at offset {cut}: " if cut else "empty message"
            if msg[:1] == b"A" and len(msg) == 25 and cut >= 9:
                # the protocol 4 parallel layout cut short is read as the short layout (9 bytes)
                if cut == 9:
                    assert isinstance(fresh(in_stream).decode(short), EVENT_TYPES)
                    continue
                expected = "Stream Abort message at offset 9: .* unexpected trailing bytes"
            with pytest.raises(DecodeError, match=expected):
                fresh(in_stream).decode(short)


@FUZZ
@given(st.binary(max_size=80), st.booleans(), st.sampled_from([1, 2, 3, 4]))
def test_random_bytes(data: bytes, in_stream: bool, proto: int) -> None:
    event_or_decode_error(fresh(in_stream, proto), data)


@FUZZ
@given(st.sampled_from(b"BCORYIUDTMSEcAbPKrp"), st.binary(max_size=80), st.booleans())
def test_random_bodies_of_known_types(kind: int, body: bytes, in_stream: bool) -> None:
    event_or_decode_error(fresh(in_stream), bytes([kind]) + body)


@FUZZ
@given(
    st.sampled_from(VALID),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_byte_mutations(valid: tuple[bytes, bool], changes: list[tuple[int, int]]) -> None:
    msg, in_stream = valid
    data = bytearray(msg)
    for at, byte in changes:
        data[at % len(data)] = byte
    event_or_decode_error(fresh(in_stream), bytes(data))


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_insertions_and_deletions(valid: tuple[bytes, bool], draw: st.DataObject) -> None:
    msg, in_stream = valid
    at = draw.draw(st.integers(0, len(msg)))
    cut = draw.draw(st.integers(0, 4))
    extra = draw.draw(st.binary(max_size=6))
    event_or_decode_error(fresh(in_stream), msg[:at] + extra + msg[at + cut :])


@FUZZ
@given(st.sampled_from(VALID), st.sampled_from(VALID))
def test_decoder_survives_errors(first: tuple[bytes, bool], second: tuple[bytes, bool]) -> None:
    """A DecodeError leaves the caches consistent: a later valid message still decodes."""
    dec = fresh(False)
    event_or_decode_error(dec, first[0][:-1])
    dec.reset()
    msg, in_stream = second
    if in_stream:
        dec.decode(stream_start(700, False))
    assert event_or_decode_error(dec, msg) is not None


# --- round trips ------------------------------------------------------------------------------

values = st.one_of(
    st.none(),
    st.just(UNCHANGED),
    st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=40),
    st.binary(max_size=40),
)


@FUZZ
@given(st.lists(values, max_size=80), st.booleans(), st.integers(0, 0xFFFF_FFFF), st.integers(0, (1 << 64) - 1))
def test_insert_round_trip(row: list[Value], in_stream: bool, xid: int, lsn: int) -> None:
    dec = PgOutputDecoder(2)
    ncols = len(row)
    dec.decode(relation(77, "s", "t", "d", [(0, f"c{i}", 25, -1) for i in range(ncols)]))
    if in_stream:
        dec.decode(stream_start(xid, True))
    ev = dec.decode(insert(77, tuple(row), xid if in_stream else None), lsn)
    assert isinstance(ev, Insert)
    assert ev.new == tuple(row) and ev.xid == (xid if in_stream else None) and ev.lsn == lsn
    assert all(a is b for a, b in zip(ev.new, row, strict=True) if a is UNCHANGED or a is None)


@FUZZ
@given(st.lists(st.tuples(values, values), min_size=1, max_size=30), st.sampled_from(["K", "O", None]))
def test_update_round_trip(pairs: list[tuple[Value, Value]], old_kind: str | None) -> None:
    dec = PgOutputDecoder(1)
    dec.decode(relation(78, "s", "t", "f", [(1, f"c{i}", 25, -1) for i in range(len(pairs))]))
    old = tuple(p[0] for p in pairs)
    new = tuple(p[1] for p in pairs)
    msg = update(78, new) if old_kind is None else update(78, new, old, old_kind)
    ev = dec.decode(msg)
    assert isinstance(ev, Update)
    assert ev.old_kind == old_kind and ev.old == (None if old_kind is None else old)
    # every column is a key column: with an old image (key or full), an unchanged TOAST value of the
    # new image is the old image's value for it, unless that one is unchanged TOAST too (issue 60)
    if old_kind is None:
        assert ev.new == new and ev.toast_from_old == ()
    else:
        filled = [i for i, (o, n) in enumerate(pairs) if n is UNCHANGED and o is not UNCHANGED]
        assert ev.new == tuple(o if i in filled else n for i, (o, n) in enumerate(pairs))
        assert ev.toast_from_old == tuple(f"c{i}" for i in filled)


@FUZZ
@given(st.integers(0, 0xFFFF_FFFF), st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, (1 << 64) - 1))
def test_fixed_fields_round_trip(xid: int, time: int, lsn: int) -> None:
    dec = PgOutputDecoder(4)
    ev = dec.decode(begin(lsn, time, xid))
    assert (ev.final_lsn, ev.commit_time, ev.xid) == (lsn, time, xid)  # type: ignore[union-attr]
    ev = dec.decode(stream_abort(xid, xid, lsn, time))
    assert (ev.xid, ev.subxid, ev.abort_lsn, ev.abort_time) == (xid, xid, lsn, time)  # type: ignore[union-attr]


def test_tuple_data_builder_layout() -> None:
    """Guard the builder itself against the documented TupleData layout."""
    assert tuple_data(("ab", None, UNCHANGED, b"\x01")) == (
        struct.pack(">H", 4) + b"t" + struct.pack(">I", 2) + b"ab" + b"n" + b"u" + b"b" + struct.pack(">I", 1) + b"\x01"
    )
