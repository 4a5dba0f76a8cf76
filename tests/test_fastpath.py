"""The fused Insert-to-JSONL path must write exactly what the reference path writes."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgrecv.assemble import StreamAssembler
from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.events import Insert
from pgrecv.fastpath import FastInserts, compile_row
from pgrecv.jsonl import JsonlEncoder
from pgrecv.lsn import LSN
from tests.util import sql

GOLDEN = Path(__file__).parent / "golden"


def messages(path: Path) -> tuple[dict[str, Any], list[tuple[bytes, int]]]:
    lines = path.read_bytes().splitlines()
    meta = orjson.loads(lines[0])["meta"]
    return meta, [(bytes.fromhex(r["data"]), int(LSN.parse(r["lsn"]))) for r in map(orjson.loads, lines[1:])]


def run(msgs: list[tuple[bytes, int]], proto: int, *, fast: bool) -> tuple[bytes, int]:
    """Decode and encode like the streamer does; returns (output, rows written by the fast path)."""
    out: list[bytes] = []
    decoder = PgOutputDecoder(proto)
    encoder = JsonlEncoder(out.append)
    fastpath = FastInserts(encoder, decoder, out.append) if fast else None
    assembler = StreamAssembler()
    taken = 0
    for payload, lsn in msgs:
        for msg, at in assembler.feed(payload, lsn):
            if fastpath is not None and msg[0] == 0x49 and fastpath.insert(msg, at):
                taken += 1
                continue
            event = decoder.decode(msg, at)
            encoder.feed(event)
            if fastpath is not None and isinstance(event, Insert):
                fastpath.learn(event)
    return b"".join(out), taken


def golden_files() -> Iterator[Path]:
    for path in sorted(GOLDEN.glob("pg*/*.pgoutput.jsonl")):
        meta, _ = messages(path)
        if meta["options"].get("binary") != "true":
            yield path


@pytest.mark.parametrize("path", list(golden_files()), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_captures_identical(path: Path) -> None:
    meta, msgs = messages(path)
    reference, none_taken = run(msgs, meta["proto_version"], fast=False)
    fast, _ = run(msgs, meta["proto_version"], fast=True)
    assert none_taken == 0
    assert fast == reference


def test_fast_path_is_taken_on_covered_types(db_dsn: str) -> None:
    sql(
        db_dsn,
        """CREATE TABLE t (id bigint PRIMARY KEY, small smallint, i int, o oid, b boolean, n numeric,
                          d date, tm time, ts timestamp, tz timestamptz, ttz timetz, iv interval, u uuid,
                          l pg_lsn, tx text, vc varchar(20), bp char(3), nm name);
           CREATE PUBLICATION pub FOR ALL TABLES""",
    )
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    sql(
        db_dsn,
        """INSERT INTO t VALUES
           (1, -32768, 2147483647, 4294967295, true, 'NaN', 'infinity', '24:00', '-infinity', 'infinity',
            '00:00+14', '-178000000 years', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'FFFFFFFF/FFFFFFFF',
            E'quote " back \\\\ nl \\n tab \\t bell \\x07 emoji 😀', 'ünïcödé', 'ab', 'x"y'),
           (-9223372036854775808, NULL, NULL, NULL, false, '-1.500000000000000000001', '4713-01-01 BC',
            '00:00:00.000001', '2000-01-01 00:00:00.5', '1999-12-31 23:59:59.999999+00', NULL, '1 day',
            NULL, '0/0', '', '', '   ', ''),
           (3, 0, 0, 0, NULL, 'Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
    )
    sql(db_dsn, "INSERT INTO t (id, tx) SELECT g, repeat('z', g) FROM generate_series(10, 300) g")
    rows = sql(
        db_dsn,
        "SELECT lsn - '0/0'::pg_lsn, data FROM pg_logical_slot_peek_binary_changes("
        "'s', NULL, NULL, 'proto_version', '1', 'publication_names', 'pub')",
    )
    msgs = [(bytes(data), int(lsn)) for lsn, data in rows]
    reference, _ = run(msgs, 1, fast=False)
    fast, taken = run(msgs, 1, fast=True)
    assert fast == reference
    assert taken == 3 + 291 - 1  # every insert but the first of the table, which teaches the path


def test_uncovered_types_are_refused() -> None:
    from pgrecv.events import Column, Relation

    covered = Relation(1, "public", "t", "d", (Column("a", 23, -1, "integer", True),))
    other = Relation(
        2, "public", "u", "d", (Column("a", 23, -1, "integer", True), Column("j", 3802, -1, "jsonb", False))
    )
    assert compile_row(covered) is not None
    assert compile_row(other) is None


def _insert_message(oid: int, values: list[str | None]) -> bytes:
    body = struct.pack(">cIcH", b"I", oid, b"N", len(values))
    for v in values:
        if v is None:
            body += b"n"
        else:
            raw = v.encode()
            body += struct.pack(">cI", b"t", len(raw)) + raw
    return body


def _relation_message(oid: int) -> bytes:
    cols = [(1, "id", 23), (0, 'we"ird\nname', 25), (0, "flag", 16), (0, "amount", 1700)]
    body = struct.pack(">cI", b"R", oid) + b"public\x00" + b"t\x00" + b"d" + struct.pack(">H", len(cols))
    for flags, name, typ in cols:
        body += struct.pack(">B", flags) + name.encode() + b"\x00" + struct.pack(">Ii", typ, -1)
    return body


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-(2**31), 2**31 - 1),
            st.one_of(st.none(), st.text()),
            st.sampled_from(["t", "f", None]),
            st.one_of(st.none(), st.decimals(allow_nan=False, allow_infinity=False).map(str)),
        ),
        min_size=1,
        max_size=20,
    ),
    st.integers(0, 2**40),
)
def test_random_rows_identical(rows: list[tuple[int, str | None, str | None, str | None]], lsn: int) -> None:
    begin = struct.pack(">cQqI", b"B", lsn + 10_000, 0, 7)
    msgs = [(begin, lsn), (_relation_message(99), 0)]
    for i, (n, text, flag, amount) in enumerate(rows):
        if text is not None and "\x00" in text:
            text = text.replace("\x00", "")
        msgs.append((_insert_message(99, [str(n), text, flag, amount]), lsn + i))
    msgs.append((struct.pack(">cbQQq", b"C", 0, lsn + 10_000, lsn + 10_050, 0), lsn + 10_050))
    reference, _ = run(msgs, 1, fast=False)
    fast, taken = run(msgs, 1, fast=True)
    assert fast == reference
    assert taken == len(rows) - 1


def test_malformed_insert_falls_back_to_the_reference_error() -> None:
    from pgrecv.errors import DecodeError

    out: list[bytes] = []
    decoder = PgOutputDecoder(1)
    encoder = JsonlEncoder(out.append)
    fast = FastInserts(encoder, decoder, out.append)
    encoder.feed(decoder.decode(struct.pack(">cQqI", b"B", 100, 0, 7), 1))
    encoder.feed(decoder.decode(_relation_message(99), 0))
    first = decoder.decode(_insert_message(99, ["1", "a", "t", "1.5"]), 2)
    encoder.feed(first)
    fast.learn(first)  # type: ignore[arg-type]
    good = _insert_message(99, ["2", "b", "f", "2"])
    assert fast.insert(good, 3)
    for bad in (good[:-1], good + b"x", good[:6] + b"\x00\x05" + good[8:]):
        assert not fast.insert(bad, 4)
        with pytest.raises(DecodeError):
            decoder.decode(bad, 4)
