"""PgOutputDecoder on hand-built messages.

The builders below write each message from the documented layout ("Logical Replication Message
Formats", PostgreSQL's proto.c), independently of the decoder. The fuzz tests reuse them.
"""

from __future__ import annotations

import dataclasses
import struct

import pytest

from pgrecv.decode.pgoutput import PgOutputDecoder, tuple_reader
from pgrecv.errors import DecodeError, UsageError
from pgrecv.events import (
    UNCHANGED,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TypeInfo,
    Update,
    Value,
)
from pgrecv.pg import types as pgtypes

# --- message builders (network byte order) ---------------------------------------------------


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def xid_prefix(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack(">I", xid)


def begin(final_lsn: int, commit_time: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, commit_time, xid)


def commit(commit_lsn: int, end_lsn: int, commit_time: int, flags: int = 0) -> bytes:
    return b"C" + struct.pack(">BQQq", flags, commit_lsn, end_lsn, commit_time)


def origin(lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", lsn) + cstr(name)


ColSpec = tuple[int, str, int, int]  # flags, name, type OID, typmod


def relation(oid: int, namespace: str, name: str, ident: str, cols: list[ColSpec], xid: int | None = None) -> bytes:
    out = b"R" + xid_prefix(xid) + struct.pack(">I", oid) + cstr(namespace) + cstr(name)
    out += ident.encode() + struct.pack(">H", len(cols))
    for flags, col, type_oid, typmod in cols:
        out += bytes([flags]) + cstr(col) + struct.pack(">Ii", type_oid, typmod)
    return out


def type_msg(oid: int, namespace: str, name: str, xid: int | None = None) -> bytes:
    return b"Y" + xid_prefix(xid) + struct.pack(">I", oid) + cstr(namespace) + cstr(name)


def tuple_data(values: tuple[Value, ...] | list[Value]) -> bytes:
    out = struct.pack(">H", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        elif isinstance(v, str):
            raw = v.encode()
            out += b"t" + struct.pack(">I", len(raw)) + raw
        else:
            assert isinstance(v, bytes)
            out += b"b" + struct.pack(">I", len(v)) + v
    return out


def insert(oid: int, values: tuple[Value, ...], xid: int | None = None) -> bytes:
    return b"I" + xid_prefix(xid) + struct.pack(">I", oid) + b"N" + tuple_data(values)


def update(
    oid: int,
    new: tuple[Value, ...],
    old: tuple[Value, ...] | None = None,
    old_kind: str = "K",
    xid: int | None = None,
) -> bytes:
    out = b"U" + xid_prefix(xid) + struct.pack(">I", oid)
    if old is not None:
        out += old_kind.encode() + tuple_data(old)
    return out + b"N" + tuple_data(new)


def delete(oid: int, old: tuple[Value, ...], old_kind: str = "K", xid: int | None = None) -> bytes:
    return b"D" + xid_prefix(xid) + struct.pack(">I", oid) + old_kind.encode() + tuple_data(old)


def truncate(oids: list[int], flags: int, xid: int | None = None) -> bytes:
    return b"T" + xid_prefix(xid) + struct.pack(">IB", len(oids), flags) + b"".join(struct.pack(">I", o) for o in oids)


def message(transactional: bool, lsn: int, prefix: str, content: bytes, xid: int | None = None) -> bytes:
    return (
        b"M"
        + xid_prefix(xid)
        + struct.pack(">BQ", int(transactional), lsn)
        + cstr(prefix)
        + struct.pack(">I", len(content))
        + content
    )


def stream_start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack(">IB", xid, int(first))


def stream_stop() -> bytes:
    return b"E"


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, commit_time: int, flags: int = 0) -> bytes:
    return b"c" + struct.pack(">IBQQq", xid, flags, commit_lsn, end_lsn, commit_time)


def stream_abort(xid: int, subxid: int, abort_lsn: int | None = None, abort_time: int | None = None) -> bytes:
    out = b"A" + struct.pack(">II", xid, subxid)
    if abort_lsn is not None:
        assert abort_time is not None
        out += struct.pack(">Qq", abort_lsn, abort_time)
    return out


def begin_prepare(prepare_lsn: int, end_lsn: int, prepare_time: int, xid: int, gid: str) -> bytes:
    return b"b" + struct.pack(">QQqI", prepare_lsn, end_lsn, prepare_time, xid) + cstr(gid)


def prepare(prepare_lsn: int, end_lsn: int, prepare_time: int, xid: int, gid: str, code: bytes = b"P") -> bytes:
    return code + struct.pack(">BQQqI", 0, prepare_lsn, end_lsn, prepare_time, xid) + cstr(gid)


def commit_prepared(commit_lsn: int, end_lsn: int, commit_time: int, xid: int, gid: str) -> bytes:
    return b"K" + struct.pack(">BQQqI", 0, commit_lsn, end_lsn, commit_time, xid) + cstr(gid)


def rollback_prepared(
    prepare_end_lsn: int, rollback_end_lsn: int, prepare_time: int, rollback_time: int, xid: int, gid: str
) -> bytes:
    return (
        b"r"
        + struct.pack(">BQQqqI", 0, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid)
        + cstr(gid)
    )


# --- a typical table --------------------------------------------------------------------------

OID = 16390
COLS: list[ColSpec] = [
    (1, "id", 23, -1),  # integer, key
    (0, "name", 1043, 68),  # varchar(64)
    (0, "doc", 25, -1),  # text
    (0, "data", 17, -1),  # bytea
]
REL_MSG = relation(OID, "public", "items", "d", COLS)
ROW: tuple[Value, ...] = ("1", "héllo wörld", None, b"\x00\xff\x10")


def decoder(proto: int = 1, streaming_parallel: bool | None = None) -> PgOutputDecoder:
    dec = PgOutputDecoder(proto, streaming_parallel=streaming_parallel)
    rel = dec.decode(REL_MSG)
    assert isinstance(rel, Relation)
    return dec


PROTOS = [1, 2, 3, 4]


# --- transaction messages ---------------------------------------------------------------------


@pytest.mark.parametrize("proto", PROTOS)
def test_begin_commit(proto: int) -> None:
    dec = PgOutputDecoder(proto)
    assert dec.decode(begin(0x1_0000_0100, 789_000_123, 4242)) == Begin(0x1_0000_0100, 789_000_123, 4242)
    assert dec.decode(commit(0x1_0000_0100, 0x1_0000_0130, 789_000_123)) == Commit(
        0, 0x1_0000_0100, 0x1_0000_0130, 789_000_123
    )


def test_commit_time_before_2000_is_negative() -> None:
    assert PgOutputDecoder().decode(begin(1, -5, 7)) == Begin(1, -5, 7)


@pytest.mark.parametrize("proto", PROTOS)
def test_origin(proto: int) -> None:
    assert PgOutputDecoder(proto).decode(origin(0xABC, "node_a")) == Origin(0xABC, "node_a")


# --- relation and type ------------------------------------------------------------------------


@pytest.mark.parametrize("proto", PROTOS)
def test_relation(proto: int) -> None:
    dec = PgOutputDecoder(proto)
    rel = dec.decode(REL_MSG)
    assert isinstance(rel, Relation)
    assert (rel.oid, rel.namespace, rel.name, rel.replica_identity, rel.xid) == (OID, "public", "items", "d", None)
    assert [c.name for c in rel.columns] == ["id", "name", "doc", "data"]
    assert [c.type_oid for c in rel.columns] == [23, 1043, 25, 17]
    assert [c.type_modifier for c in rel.columns] == [-1, 68, -1, -1]
    assert [c.key for c in rel.columns] == [True, False, False, False]
    assert rel.key_names == ("id",)
    assert [c.type_name for c in rel.columns] == [pgtypes.type_name(o) for o in (23, 1043, 25, 17)]
    assert rel.columns[0].type_name == "integer"
    assert rel.columns[1].type_name == "character varying"
    assert dec.relations[OID] is rel


@pytest.mark.parametrize("ident", ["d", "n", "f", "i"])
def test_relation_replica_identities(ident: str) -> None:
    rel = PgOutputDecoder().decode(relation(5, "s", "t", ident, [(1, "a", 23, -1)]))
    assert isinstance(rel, Relation) and rel.replica_identity == ident


def test_relation_empty_namespace_is_pg_catalog() -> None:
    rel = PgOutputDecoder().decode(relation(5, "", "t", "d", []))
    assert isinstance(rel, Relation) and rel.namespace == "pg_catalog" and rel.columns == ()


def test_type_names_from_type_cache_then_fallback() -> None:
    dec = PgOutputDecoder(4)
    info = dec.decode(type_msg(70001, "myschema", "mood"))
    assert info == TypeInfo(70001, "myschema", "mood", None)
    assert dec.types[70001] == info
    dom = dec.decode(type_msg(70002, "", "int4"))  # a domain: pgoutput names its base type
    assert dom == TypeInfo(70002, "pg_catalog", "int4", None)
    rel = dec.decode(relation(9, "public", "t", "f", [(1, "m", 70001, -1), (1, "d", 70002, -1), (1, "x", 70003, -1)]))
    assert isinstance(rel, Relation)
    assert [c.type_name for c in rel.columns] == ["myschema.mood", "int4", ""]
    assert [c.key for c in rel.columns] == [True, True, True]


def test_relation_cache_replaced_when_relation_comes_again() -> None:
    dec = decoder()
    old_rel = dec.relations[OID]
    new_rel = dec.decode(relation(OID, "public", "items", "f", [*COLS, (0, "extra", 20, -1)]))
    assert isinstance(new_rel, Relation) and new_rel is not old_rel
    assert dec.relations[OID] is new_rel
    ev = dec.decode(insert(OID, (*ROW, "7")))
    assert isinstance(ev, Insert) and ev.relation is new_rel and ev.new == (*ROW, "7")
    with pytest.raises(DecodeError, match=r"tuple has 4 columns but the Relation message for public\.items lists 5"):
        dec.decode(insert(OID, ROW))


def test_relations_view_is_read_only() -> None:
    dec = decoder()
    with pytest.raises(TypeError):
        dec.relations[1] = dec.relations[OID]  # type: ignore[index]


# --- row messages -----------------------------------------------------------------------------


@pytest.mark.parametrize("proto", PROTOS)
def test_insert(proto: int) -> None:
    dec = decoder(proto)
    ev = dec.decode(insert(OID, ROW), 0x5_0000_0010)
    assert ev == Insert(dec.relations[OID], ROW, None, 0x5_0000_0010)
    assert type(ev) is Insert
    assert isinstance(ev.new[3], bytes) and ev.new[2] is None


def test_row_events_are_real_frozen_events() -> None:
    dec = decoder()
    rel = dec.relations[OID]
    events = [
        dec.decode(insert(OID, ROW), 3),
        dec.decode(update(OID, ROW, ROW, "O"), 4),
        dec.decode(delete(OID, ROW), 5),
    ]
    expected = [
        Insert(rel, ROW, None, 3),
        Update(rel, ROW, ROW, "O", None, 4),
        Delete(rel, ROW, "K", None, 5),
    ]
    for ev, exp in zip(events, expected, strict=True):
        assert type(ev) is type(exp)
        assert ev == exp and hash(ev) == hash(exp) and repr(ev) == repr(exp)
        assert dataclasses.astuple(ev) == dataclasses.astuple(exp)
        with pytest.raises(dataclasses.FrozenInstanceError):
            ev.lsn = 9  # type: ignore[misc,union-attr]


def test_insert_unchanged_null_binary_empty() -> None:
    dec = decoder()
    row: tuple[Value, ...] = ("", UNCHANGED, None, b"")
    ev = dec.decode(insert(OID, row))
    assert isinstance(ev, Insert) and ev.new == row and ev.new[1] is UNCHANGED


@pytest.mark.parametrize("proto", PROTOS)
def test_update_without_old(proto: int) -> None:
    dec = decoder(proto)
    ev = dec.decode(update(OID, ROW), 11)
    assert ev == Update(dec.relations[OID], ROW, None, None, None, 11)


@pytest.mark.parametrize("old_kind", ["K", "O"])
def test_update_with_key_or_old_tuple(old_kind: str) -> None:
    """'K' and 'O' are Commit Prepared and Origin at top level, tuple markers inside an Update."""
    dec = decoder(3)
    old: tuple[Value, ...] = ("1", None, None, None) if old_kind == "K" else ("1", "before", UNCHANGED, b"")
    ev = dec.decode(update(OID, ROW, old, old_kind))
    assert ev == Update(dec.relations[OID], ROW, old, old_kind, None, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize("old_kind", ["K", "O"])
def test_delete(old_kind: str) -> None:
    dec = decoder(2)
    ev = dec.decode(delete(OID, ROW, old_kind), 12)
    assert ev == Delete(dec.relations[OID], ROW, old_kind, None, 12)  # type: ignore[arg-type]


def test_top_level_k_o_r_are_transaction_messages() -> None:
    dec = decoder(3)
    assert isinstance(dec.decode(commit_prepared(10, 20, 30, 40, "g")), CommitPrepared)
    assert isinstance(dec.decode(origin(10, "o")), Origin)
    assert isinstance(dec.decode(rollback_prepared(10, 20, 30, 40, 50, "g")), RollbackPrepared)


@pytest.mark.parametrize(
    ("flags", "cascade", "restart"), [(0, False, False), (1, True, False), (2, False, True), (3, True, True)]
)
def test_truncate_flags(flags: int, cascade: bool, restart: bool) -> None:
    dec = decoder()
    other = dec.decode(relation(OID + 1, "s", "other", "n", [(0, "v", 25, -1)]))
    ev = dec.decode(truncate([OID, OID + 1], flags), 77)
    assert ev == Truncate((dec.relations[OID], other), cascade, restart, None, 77)  # type: ignore[arg-type]


def test_truncate_unknown_relation() -> None:
    with pytest.raises(DecodeError, match=r"Truncate message at offset 10: relation OID 99 was not described"):
        decoder().decode(truncate([OID, 99], 0))


@pytest.mark.parametrize("transactional", [True, False])
def test_message(transactional: bool) -> None:
    content = b"\x00binary\xff payload"
    ev = PgOutputDecoder(1).decode(message(transactional, 0xDEAD, "my.prefix", content), 5)
    assert ev == Message(transactional, 0xDEAD, "my.prefix", content, None)


def test_empty_message_content() -> None:
    assert PgOutputDecoder().decode(message(True, 1, "", b"")) == Message(True, 1, "", b"", None)


# --- streaming --------------------------------------------------------------------------------


@pytest.mark.parametrize("proto", [2, 3, 4])
def test_streamed_chunk_carries_xids(proto: int) -> None:
    dec = PgOutputDecoder(proto)
    assert dec.decode(stream_start(900, True)) == StreamStart(900, True)
    assert dec.in_stream
    rel = dec.decode(relation(OID, "public", "items", "d", COLS, xid=900))
    assert isinstance(rel, Relation) and rel.xid == 900
    assert dec.decode(type_msg(70001, "s", "mood", xid=900)) == TypeInfo(70001, "s", "mood", 900)
    assert dec.decode(insert(OID, ROW, xid=900), 1) == Insert(rel, ROW, 900, 1)
    assert dec.decode(update(OID, ROW, ROW, "K", xid=901), 2) == Update(rel, ROW, ROW, "K", 901, 2)
    assert dec.decode(delete(OID, ROW, "O", xid=901), 3) == Delete(rel, ROW, "O", 901, 3)
    assert dec.decode(truncate([OID], 1, xid=900), 4) == Truncate((rel,), True, False, 900, 4)
    assert dec.decode(message(True, 5, "p", b"x", xid=900)) == Message(True, 5, "p", b"x", 900)
    assert dec.decode(stream_stop()) == StreamStop()
    assert not dec.in_stream
    # between chunks: a small transaction without xid prefixes
    assert dec.decode(begin(100, 1, 55)) == Begin(100, 1, 55)
    assert dec.decode(insert(OID, ROW), 6) == Insert(rel, ROW, None, 6)
    assert isinstance(dec.decode(commit(100, 120, 1)), Commit)
    assert dec.decode(stream_start(900, False)) == StreamStart(900, False)
    assert dec.decode(insert(OID, ROW, xid=900)) == Insert(rel, ROW, 900, 0)
    dec.decode(stream_stop())
    assert dec.decode(stream_commit(900, 200, 230, 99)) == StreamCommit(900, 0, 200, 230, 99)


def test_insert_outside_chunk_is_not_read_with_xid() -> None:
    """The same bytes mean different things inside and outside a chunk: the state decides."""
    dec = decoder(2)
    msg = insert(OID, ROW, xid=OID)  # an xid that happens to equal the OID
    with pytest.raises(DecodeError, match="Insert message at offset 5"):
        dec.decode(msg)
    dec.decode(stream_start(OID, True))
    ev = dec.decode(msg)
    assert isinstance(ev, Insert) and ev.xid == OID


@pytest.mark.parametrize(
    "closing",
    [
        begin(1, 2, 3),
        stream_commit(900, 1, 2, 3),
        stream_abort(900, 900),
        begin_prepare(1, 2, 3, 4, "g"),
        prepare(1, 2, 3, 4, "g", b"p"),
    ],
)
def test_transaction_boundaries_close_a_cut_chunk(closing: bytes) -> None:
    """A chunk cut by a reconnect never gets its Stream Stop; what follows starts fresh."""
    dec = decoder(4)
    dec.decode(stream_start(900, True))
    dec.decode(closing)
    assert not dec.in_stream
    assert isinstance(dec.decode(insert(OID, ROW)), Insert)


def test_reset_leaves_the_chunk() -> None:
    dec = decoder(2)
    dec.decode(stream_start(900, True))
    dec.reset()
    assert not dec.in_stream
    assert OID in dec.relations


@pytest.mark.parametrize("proto", [2, 3, 4])
def test_stream_abort_short(proto: int) -> None:
    assert PgOutputDecoder(proto).decode(stream_abort(900, 901)) == StreamAbort(900, 901)


def test_stream_abort_parallel_inferred_from_length() -> None:
    dec = PgOutputDecoder(4)
    ev = dec.decode(stream_abort(900, 900, 0x7_0000_0000, 12345))
    assert ev == StreamAbort(900, 900, 0x7_0000_0000, 12345)
    assert dec.decode(stream_abort(900, 901)) == StreamAbort(900, 901, None, None)


def test_stream_abort_parallel_flag_is_strict() -> None:
    assert PgOutputDecoder(4, streaming_parallel=True).decode(stream_abort(1, 2, 3, 4)) == StreamAbort(1, 2, 3, 4)
    with pytest.raises(DecodeError, match="truncated Stream Abort message at offset 9"):
        PgOutputDecoder(4, streaming_parallel=True).decode(stream_abort(1, 2))
    with pytest.raises(DecodeError, match="Stream Abort message at offset 9: 16 unexpected trailing bytes"):
        PgOutputDecoder(4, streaming_parallel=False).decode(stream_abort(1, 2, 3, 4))


def test_stream_abort_with_abort_info_before_protocol_4_is_rejected() -> None:
    with pytest.raises(DecodeError, match="Stream Abort message at offset 9: 16 unexpected trailing bytes"):
        PgOutputDecoder(3).decode(stream_abort(1, 2, 3, 4))


# --- two-phase commit -------------------------------------------------------------------------


@pytest.mark.parametrize("proto", [3, 4])
def test_two_phase_messages(proto: int) -> None:
    dec = PgOutputDecoder(proto)
    assert dec.decode(begin_prepare(10, 20, 30, 40, "gid-1")) == BeginPrepare(10, 20, 30, 40, "gid-1")
    assert dec.decode(prepare(10, 20, 30, 40, "gid-1")) == Prepare(0, 10, 20, 30, 40, "gid-1")
    assert dec.decode(commit_prepared(50, 60, 70, 40, "gid-1")) == CommitPrepared(0, 50, 60, 70, 40, "gid-1")
    assert dec.decode(rollback_prepared(20, 80, 30, 90, 41, "gid-2")) == RollbackPrepared(
        0, 20, 80, 30, 90, 41, "gid-2"
    )
    assert dec.decode(prepare(11, 21, 31, 42, "gid-3", b"p")) == StreamPrepare(0, 11, 21, 31, 42, "gid-3")


def test_gid_utf8() -> None:
    ev = PgOutputDecoder(3).decode(begin_prepare(1, 2, 3, 4, "tx-é-∑"))
    assert isinstance(ev, BeginPrepare) and ev.gid == "tx-é-∑"


# --- input forms and tuple readers ------------------------------------------------------------


def test_memoryview_and_bytearray_input() -> None:
    dec = decoder()
    msg = insert(OID, ROW)
    expected = dec.decode(msg)
    assert dec.decode(memoryview(b"xx" + msg)[2:]) == expected
    assert dec.decode(bytearray(msg)) == expected


@pytest.mark.parametrize("ncols", [0, 1, 2, 63, 64, 65, 200])
def test_unrolled_and_looped_readers_agree(ncols: int) -> None:
    dec = PgOutputDecoder()
    dec.decode(relation(1, "s", "wide", "f", [(1, f"c{i}", 25, -1) for i in range(ncols)]))
    kinds: list[Value] = ["x", None, UNCHANGED, b"\x01", "ü" * 300]
    row = tuple(kinds[i % len(kinds)] for i in range(ncols))
    ev = dec.decode(insert(1, row))
    assert isinstance(ev, Insert) and ev.new == row
    data = tuple_data(row)
    assert tuple_reader(ncols)(data, 2) == (row, len(data))


# --- errors -----------------------------------------------------------------------------------


def test_unknown_relation_in_insert() -> None:
    with pytest.raises(
        DecodeError, match=r"Insert message at offset 1: relation OID 12 was not described by a Relation"
    ):
        PgOutputDecoder().decode(insert(12, ("a",)))


@pytest.mark.parametrize("build", [lambda: update(12, ("a",)), lambda: delete(12, ("a",))])
def test_unknown_relation_in_update_delete(build: object) -> None:
    with pytest.raises(DecodeError, match="relation OID 12 was not described by a Relation message"):
        PgOutputDecoder().decode(build())  # type: ignore[operator]


def test_unknown_message_type() -> None:
    with pytest.raises(DecodeError, match=r"pgoutput: message at offset 0: unknown message type 'Z'"):
        PgOutputDecoder().decode(b"Z\x00\x01")
    with pytest.raises(DecodeError, match="unknown message type 0xff"):
        PgOutputDecoder().decode(b"\xff")


def test_empty_message() -> None:
    with pytest.raises(DecodeError, match="empty message"):
        PgOutputDecoder().decode(b"")


def test_bad_column_kind() -> None:
    msg = bytearray(insert(OID, ROW))
    msg[8] = ord("x")  # first column's kind byte: I, OID(4), N, ncols(2)
    with pytest.raises(DecodeError, match=r"Insert message at offset 8: unknown column kind 'x' in TupleData"):
        decoder().decode(bytes(msg))


def test_bad_tuple_markers() -> None:
    dec = decoder()
    bad_insert = b"I" + struct.pack(">I", OID) + b"K" + tuple_data(ROW)
    with pytest.raises(DecodeError, match=r"Insert message at offset 5: expected tuple marker 'N', got 'K'"):
        dec.decode(bad_insert)
    bad_update = b"U" + struct.pack(">I", OID) + b"X" + tuple_data(ROW)
    with pytest.raises(DecodeError, match=r"Update message at offset 5: expected tuple marker 'K', 'O' or 'N'"):
        dec.decode(bad_update)
    bad_update_2 = b"U" + struct.pack(">I", OID) + b"K" + tuple_data(ROW) + b"K" + tuple_data(ROW)
    with pytest.raises(DecodeError, match="expected tuple marker 'K', 'O' or 'N', got 'K'"):
        dec.decode(bad_update_2)
    bad_delete = b"D" + struct.pack(">I", OID) + b"N" + tuple_data(ROW)
    with pytest.raises(DecodeError, match=r"Delete message at offset 5: expected tuple marker 'K' or 'O', got 'N'"):
        dec.decode(bad_delete)


def test_unknown_replica_identity() -> None:
    with pytest.raises(DecodeError, match="Relation message at offset 9: unknown replica identity 'x'"):
        PgOutputDecoder().decode(relation(5, "s", "t", "x", []))


def test_trailing_bytes() -> None:
    dec = decoder()
    msg = insert(OID, ROW)
    with pytest.raises(DecodeError, match=rf"Insert message at offset {len(msg)}: 2 unexpected trailing bytes"):
        dec.decode(msg + b"\x00\x00")
    for extra in (begin(1, 2, 3), commit(1, 2, 3), stream_stop(), origin(1, "o"), begin_prepare(1, 2, 3, 4, "g")):
        with pytest.raises(DecodeError, match="unexpected trailing bytes"):
            dec.decode(extra + b"!")


def test_value_running_past_the_end() -> None:
    """A slice does not check bounds: the final length check must catch a length that lies."""
    msg = insert(OID, ("1", None, None, "abc"))
    at = msg.index(b"abc") - 4
    lying = msg[:at] + struct.pack(">I", 200) + msg[at + 4 :]
    with pytest.raises(DecodeError, match=rf"truncated Insert message at offset {len(msg)}: its fields need"):
        decoder().decode(lying)


def test_invalid_utf8() -> None:
    msg = insert(OID, ("1", "ab", None, b""))
    bad = msg.replace(b"ab", b"a\xff")
    with pytest.raises(DecodeError, match=r"invalid UTF-8 in Insert message at offset \d+"):
        decoder().decode(bad)


def test_constructor_checks() -> None:
    with pytest.raises(UsageError, match="proto_version must be 1, 2, 3 or 4, not 5"):
        PgOutputDecoder(5)
    with pytest.raises(UsageError, match="streaming=parallel needs proto_version 4"):
        PgOutputDecoder(3, streaming_parallel=True)


def test_column_dataclass_shape() -> None:
    """The decoder fills Column positionally: guard the field order it relies on."""
    assert [f.name for f in dataclasses.fields(Column)] == ["name", "type_oid", "type_modifier", "type_name", "key"]
