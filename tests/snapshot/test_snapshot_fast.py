"""The snapshot's fast path writes the same bytes as the reference path (psycopg rows + JsonlEncoder)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from pgrecv import events as ev
from pgrecv.native import ENV_SWITCH
from pgrecv.output.jsonl import JsonlEncoder
from pgrecv.snapshot import core as snap
from pgrecv.snapshot import fast
from tests.util import awkward_doubles

CP = 0x1_0000_00AB
TEXTS = [
    "plain",
    'it\'s "quoted"',
    "back\\slash \\N \\t \\\\",
    "\\N",
    "N",
    "new\nline\r\nand\ttab \b \f \v",
    "unicode ✓ ünï 中文 \u2028 😀 \x7f",
    "\\",
    "",
    "\x01\x1f ctl",
    "100% %s %(x)s",
]

EDGE_TABLE = '''
CREATE TYPE mood AS ENUM ('ok', 'm"e\\h');
CREATE TABLE "we%ird ""t""" (
  id bigint PRIMARY KEY, i2 smallint, i4 int, o oid, "p%s ""c""" text, vc varchar(20), bp char(3), nm name,
  num numeric, d date, tm time, ts timestamp, tz timestamptz, ttz timetz, iv interval, u uuid, l pg_lsn,
  b boolean, f8 float8, f4 real, j json, jb jsonb, ai int[], at text[], by bytea, m mood, x inet
);
'''
EDGE_COLUMNS = 27


def _edge_rows(n: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for i in range(n):
        t = TEXTS[i % len(TEXTS)]
        if i % 5 == 4:  # a NULL in every column but the key
            rows.append((i,) + (None,) * (EDGE_COLUMNS - 1))
            continue
        rows.append(
            (
                [-(2**63) + i, 2**63 - 1 - i, i, -i][i % 4],
                [-32768, 32767, i % 100][i % 3],
                i,
                4294967295 if i % 2 else 0,
                t,
                t[:20],
                t[:3],
                t[:60],
                ["NaN", "-0.000", "12345678901234567890.123", "Infinity"][i % 4],
                ["infinity", "2026-01-02", "0044-03-15 BC"][i % 3],
                "23:59:59.999999",
                ["-infinity", "2026-01-02 03:04:05.123456"][i % 2],
                ["infinity", "2026-01-02 03:04:05+05:30"][i % 2],
                "03:04:05-08",
                ["1 day -02:00:00.5", "-178000000 years"][i % 2],
                "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                "16/B374D848",
                i % 2 == 0,
                [float("nan"), 1e300, -2.5e-7, float("-inf")][i % 4],
                3.25,
                json.dumps({"t": t, "n": [1, None]}),
                "null" if i % 3 == 0 else json.dumps({"t": t}),
                [1, None, -3],
                [t, None, 'q"q', "{x}"],
                t.encode() + b"\x00\xff",
                ["ok", 'm"e\\h'][i % 2],
                f"10.0.{i % 7}.{i % 256}/{24 + i % 9}",
            )
        )
    return rows


def _fill_edge(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(EDGE_TABLE)
        for row in _edge_rows(n):  # literals: psycopg would read the table name's % as a placeholder
            values = sql.SQL(", ").join(sql.Literal(v) for v in row)
            c.execute(sql.SQL("INSERT INTO {} VALUES ({})").format(sql.Identifier('we%ird "t"'), values))


def _both_paths(dsn: str, tmp_path: Path, table: str) -> tuple[bytes, bytes, int]:
    """The table through copy_task and through copy_task_reference, from one snapshot."""
    with psycopg.connect(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        tables = snap.list_tables(conn, "test_decoding", None, 15, [table], 8192)
        assert len(tables) == 1
        out = []
        counts = []
        for name, fn in (("fast", snap.copy_task), ("ref", snap.copy_task_reference)):
            path = tmp_path / f"{name}.part"
            task = snap.Task(1, tables[0], None, None, str(path), "x")
            reported: list[int] = []

            def report(_seq: int, k: int, r: list[int] = reported) -> None:
                r.append(k)

            counts.append(fn(conn, task, CP, report))
            assert sum(reported) == counts[-1]
            out.append(path.read_bytes())
            path.unlink()
        conn.execute("ROLLBACK")
    assert counts[0] == counts[1]
    return out[0], out[1], counts[0]


# PGRECV_NO_NATIVE=1 (the whole suite on the Python fallback): the C part's own tests are skipped.
# Without the switch they run, and fail if the C part was not built.
SWITCHED_OFF = os.environ.get(ENV_SWITCH, "") not in ("", "0")
needs_c = pytest.mark.skipif(SWITCHED_OFF, reason=f"{ENV_SWITCH} is set")


@pytest.fixture(params=["c", "python"])
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both fast paths: with the C part of pgrecv._copyfast, and without it (as if not built)."""
    if request.param == "c" and SWITCHED_OFF:
        pytest.skip(f"{ENV_SWITCH} is set")
    if request.param == "python":
        monkeypatch.setattr(fast, "_copyfast", None)
    return str(request.param)


@pytest.mark.parametrize("block_bytes", [300, fast.BLOCK_BYTES])
def test_edge_values_identical_to_reference(
    db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int, native: str
) -> None:
    _fill_edge(db_dsn, 200)
    monkeypatch.setattr(fast, "BLOCK_BYTES", block_bytes)  # small: many blocks, some declined, some not
    got, want, n = _both_paths(db_dsn, tmp_path, 'public.we%ird "t"')
    assert n == 200
    assert got == want
    lines = got.splitlines()
    assert len(lines) == 201 and orjson.loads(lines[0])["op"] == "relation"
    assert b'"json_nulls":["jb"]' in got  # the reference's JSON null documents came through


def test_bench_like_table_identical_and_fast_kinds(
    db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id bigint PRIMARY KEY, name text, amount numeric, at timestamptz, ok bool, n int)")
        c.execute(
            "INSERT INTO t SELECT g, 'name ' || g, g * 1.25, '2026-01-01'::timestamptz + g * interval '1 s', "
            "CASE WHEN g % 7 = 0 THEN NULL ELSE g % 2 = 0 END, NULLIF(g % 1000, 3) FROM generate_series(1, 5000) g"
        )
    declined: list[bytes] = []
    real_write_to = fast.BlockEncoder.write_to

    def write_to(self: fast.BlockEncoder, block: bytes, write: Any) -> int | None:
        rows = real_write_to(self, block, write)
        if rows is None:
            declined.append(block)
        return rows

    monkeypatch.setattr(fast.BlockEncoder, "write_to", write_to)
    monkeypatch.setattr(fast, "BLOCK_BYTES", 4096)
    counting = _Counting(fast._copyfast)
    if native == "c":
        monkeypatch.setattr(fast, "_copyfast", counting)
    got, want, n = _both_paths(db_dsn, tmp_path, "public.t")
    assert n == 5000 and got == want
    assert declined == [], "every block of these types takes the fast path"
    if native == "c":  # and it was the C one, reading and encoding
        assert counting.calls["read"] > 0 and counting.calls["encode"] > 50
        assert counting.declined == 0


class _Counting:
    """pgrecv._copyfast, counting the calls of read and encode, and the blocks encode declined."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls = {"read": 0, "encode": 0}
        self.declined = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.real, name)
        if name not in self.calls:
            return real

        def counted(*args: Any) -> Any:
            self.calls[name] += 1
            done = real(*args)
            self.declined += done is None
            return done

        return counted


def _copy_escape(s: str) -> bytes:
    """A value as PostgreSQL's COPY TO writes it in text format (CopyAttributeOutText)."""
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\b\f\n\r\t\v":
            out.append("\\" + "bfnrtv"["\b\f\n\r\t\v".index(ch)])
        else:
            out.append(ch)
    return "".join(out).encode()


_REL = ev.Relation(
    7,
    "s",
    "t%",
    "d",
    (
        ev.Column("k", 23, -1, "integer", True),
        ev.Column("t", 25, -1, "text", False),
        ev.Column("n", 1700, -1, "numeric", False),
        ev.Column("b", 16, -1, "boolean", False),
        ev.Column("a", 1009, -1, "text[]", False),
    ),
)
_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
_ROW = st.tuples(
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1).map(str)),
    st.one_of(st.none(), _TEXT),
    st.one_of(st.none(), st.decimals(allow_nan=False, places=3).map(str), st.just("NaN")),
    st.one_of(st.none(), st.sampled_from(["t", "f"])),
    st.one_of(st.none(), st.lists(_TEXT, max_size=3).map(lambda v: "{" + ",".join(json.dumps(x) for x in v) + "}")),
)


@given(st.lists(_ROW, min_size=1, max_size=20))
@settings(max_examples=300, deadline=None)
def test_block_encoder_matches_snapshot_rows(rows: list[tuple[str | None, ...]]) -> None:
    block = b"".join(b"\t".join(b"\\N" if v is None else _copy_escape(v) for v in row) + b"\n" for row in rows)
    assert fast.parse_block(block) == rows
    want: list[bytes] = []
    JsonlEncoder(want.append).snapshot_rows(_REL, rows, CP)
    done = fast.BlockEncoder(_REL, CP).encode(block)
    if done is None:  # declined (a malformed array literal): the caller takes the reference path
        return
    assert done[1] == len(rows)
    assert done[0] == b"".join(want[1:])


def test_declines_what_it_cannot_do() -> None:
    enc = fast.BlockEncoder(_REL, CP)
    assert enc.encode(b"1\tx\t1\tt\n2\tx\n") is None  # a field missing
    assert enc.encode(b"1\tx\t1\tyes\t{}\n") is None  # not a COPY bool
    assert enc.encode(b"1\tx\t1\tt\t{}") is None  # no final newline
    assert enc.encode(b"1\tx\t1\tt\t{}\n") is not None


@pytest.fixture(scope="module")
def text_table(pg_server: Any) -> Any:
    dsn = pg_server.create_database("snapfast_hypothesis")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE h (id int PRIMARY KEY, t text, v varchar, n int, b bool)")
    yield dsn
    pg_server.drop_database("snapfast_hypothesis")


@given(st.lists(st.tuples(st.one_of(st.none(), _TEXT), st.booleans()), min_size=1, max_size=30))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_texts_from_the_server(
    text_table: str, tmp_path: Path, native: str, values: list[tuple[str | None, bool]]
) -> None:
    with psycopg.connect(text_table, autocommit=True) as c:
        c.execute("TRUNCATE h")
        with c.cursor() as cur:
            cur.executemany(
                "INSERT INTO h VALUES (%s, %s, %s, %s, %s)",
                [(i, t, t, None if flag else i, None if t is None else flag) for i, (t, flag) in enumerate(values)],
            )
    got, want, n = _both_paths(text_table, tmp_path, "public.h")
    assert n == len(values) and got == want


# --- the C part (pgrecv._copyfast) -----------------------------------------------------------


@needs_c
def test_c_part_is_built_and_bound(db_dsn: str) -> None:
    """The install built the C part and it found psycopg's libpq: the tests above ran through it."""
    assert fast._copyfast is not None, "pgrecv._copyfast was not built (is a C compiler installed?)"
    with psycopg.connect(db_dsn) as conn:
        assert fast.native_reader(conn) is not None


@pytest.mark.parametrize("size", [1, 5000, fast.BLOCK_BYTES])
def test_read_blocks_c_and_python_identical(db_dsn: str, size: int) -> None:
    query = (
        "COPY (SELECT g, repeat(chr(65 + g % 26), CASE WHEN g % 1000 = 0 THEN 100000 ELSE g % 50 END), "
        "E'tab\\there' FROM generate_series(1, 20000) g) TO STDOUT"
    )
    got = {}
    with psycopg.connect(db_dsn) as conn:
        for native in (True, False):
            with conn.cursor().copy(query):
                blocks = list(fast.read_blocks(conn, size=size, native=native))
            assert all(b.endswith(b"\n") for b in blocks)
            assert all(len(b) >= size for b in blocks[:-1])
            got[native] = b"".join(blocks)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the COPY was finished properly
    assert got[True] == got[False]
    assert got[True].count(b"\n") == 20000 and b"1000\t" + b"M" * 100000 + b"\ttab\\there\n" in got[True]


@pytest.mark.parametrize("native", [True, False])
def test_read_blocks_raises_the_servers_error(db_dsn: str, native: bool) -> None:
    seen = 0
    with psycopg.connect(db_dsn) as conn:
        query = "COPY (SELECT 1 / (15000 - g) FROM generate_series(1, 20000) g) TO STDOUT"
        with pytest.raises(psycopg.errors.DivisionByZero), conn.cursor().copy(query):
            for block in fast.read_blocks(conn, size=1000, native=native):
                seen += block.count(b"\n")
        conn.rollback()
        assert conn.execute("SELECT 2").fetchone() == (2,)
    assert 0 < seen < 15000  # rows before the error came through; the error was raised, not swallowed


class _Full(Exception):
    pass


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("at", ["first", "last"])
def test_read_blocks_left_by_an_error_leaves_the_connection_clean(
    db_dsn: str, native: bool, at: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer fails on a block (a full disk): leaving the COPY must not leave libpq between
    the end of the data and the COPY's result, where psycopg's cancel found "no COPY in progress",
    its rollback "another command is already in progress", and both were logged onto pgrecv's
    one-line error (CI, 2026-11-29). "last" is the block yielded after the server's CopyDone."""
    import logging

    monkeypatch.setattr(logging.getLogger("psycopg"), "propagate", True)  # main() in-process stops it
    query = "COPY (SELECT g, repeat('x', 40) FROM generate_series(1, 3000) g) TO STDOUT"
    with psycopg.connect(db_dsn) as conn:
        with pytest.raises(_Full), conn.cursor().copy(query):
            blocks = fast.read_blocks(conn, size=20000 if at == "first" else 10**9, native=native)
            next(blocks)
            raise _Full
        assert not [r for r in caplog.records if r.name.startswith("psycopg")], caplog.text
        conn.rollback()
        assert conn.execute("SELECT 3").fetchone() == (3,)


def _c(enc: fast.BlockEncoder, block: bytes) -> tuple[bytes, int] | None:
    """The C encoder alone: (JSON lines, rows), or None where it declines."""
    assert enc._native is not None
    done = enc._native(block)
    return None if done is None else (bytes(enc._out[: done[0]]), done[1])


# _REL with a varchar instead of its array
_SIMPLE = replace(
    _REL, name="simple", columns=(*_REL.columns[:4], ev.Column("v", 1043, -1, "character varying", False))
)

_SIMPLE_ROW = st.tuples(
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1).map(str)),
    st.one_of(st.none(), _TEXT),
    st.one_of(st.none(), st.decimals(allow_nan=False, places=2).map(str), st.just("NaN")),
    st.one_of(st.none(), st.sampled_from(["t", "f"])),
    st.one_of(st.none(), _TEXT),
)


@needs_c
@given(st.lists(_SIMPLE_ROW, min_size=1, max_size=20))
@settings(max_examples=300, deadline=None)
def test_c_encoder_matches_python_and_reference(rows: list[tuple[str | None, ...]]) -> None:
    block = b"".join(b"\t".join(b"\\N" if v is None else _copy_escape(v) for v in row) + b"\n" for row in rows)
    want: list[bytes] = []
    JsonlEncoder(want.append).snapshot_rows(_SIMPLE, rows, CP)
    python = fast.BlockEncoder(_SIMPLE, CP).encode(block)
    assert python == (b"".join(want[1:]), len(rows))
    assert _c(fast.BlockEncoder(_SIMPLE, CP), block) == python  # C alone: it declines no valid text


_PIECES = [b"\t", b"\n", b"\\N", b"\\", b"t", b"f", b'"', b"1", b"\x01", b"\xff", b"ab"]


@needs_c
@given(st.binary(max_size=200) | st.lists(st.sampled_from(_PIECES), max_size=60).map(b"".join))
@settings(max_examples=1000, deadline=None)
def test_c_encoder_on_malformed_blocks(block: bytes) -> None:
    """Whatever the bytes: no crash, and the C encoder declines or agrees with the Python path."""
    c = _c(fast.BlockEncoder(_SIMPLE, CP), block)
    if c is not None:
        assert block.endswith(b"\n") and all(line.count(b"\t") == 4 for line in block[:-1].split(b"\n"))
        assert c == fast.BlockEncoder(_SIMPLE, CP).encode(block)


@needs_c
def test_c_encoder_declines() -> None:
    enc = fast.BlockEncoder(_SIMPLE, CP)
    ok = b"1\tx\t1.5\tt\ty\n"
    assert _c(enc, ok) is not None
    for bad in (
        b"",  # nothing
        b"1\tx\t1.5\tt\ty",  # no final newline
        b"1\tx\t1.5\tt\n",  # a field missing
        b"1\tx\t1.5\tt\ty\tz\n",  # a field too many
        ok + b"1\tx\t1.5\tyes\ty\n",  # not a COPY bool
        b"1\t\xff\t1.5\tt\ty\n",  # not UTF-8
        b'1\t\xc3"\t1.5\tt\ty\n',  # not UTF-8, in a text to escape
        b"1\t\xed\xa0\x80\t1.5\tt\ty\n",  # a surrogate
        b"1\t\xc0\xaf\t1.5\tt\ty\n",  # an overlong form
        b"1\t\xf4\x90\x80\x80\t1.5\tt\ty\n",  # past U+10FFFF
        b"1\t\xe2\x82\t1.5\tt\ty\n",  # cut short
    ):
        assert _c(enc, bad) is None, bad
    for good in (
        b'1\t"q"\t1.5\tt\ty\n',  # a quote
        b"1\tx\\\\y \\n \\t \\v \\b \\f \\r \\x \\\t1.5\tt\ty\n",  # COPY's escapes, others, one at the end
        b"1\tx\x01\x1f\x7f\t1.5\tt\ty\n",  # control bytes
        '1\t\u00e9\u20ac\U0001f600 "\t1.5\tt\t\u00e9\n'.encode(),  # UTF-8 of 2, 3 and 4 bytes
    ):
        assert _c(enc, good) == enc.encode(good) is not None, good
    nulls = b"\\N\t\\N\t\\N\t\\N\t\\N\n"
    assert _c(enc, nulls) == enc.encode(nulls) is not None
    long = ok * 50  # the buffer is reused: a shorter block after a longer one leaves no trace of it
    assert _c(enc, long) == enc.encode(long)
    assert _c(enc, ok) == enc.encode(ok)


@needs_c
def test_write_to_hands_out_views_of_one_buffer() -> None:
    enc = fast.BlockEncoder(_SIMPLE, CP)
    got: list[bytes] = []
    blocks = [b"1\tx\t1.5\tt\ty\n" * 100, b"2\t\xff\t\\N\tf\t\\N\n", b'3\t"z"\t0\tf\tw\n']
    for block in blocks:  # C, Python (C declines the invalid UTF-8; Python copies it as it is), C
        assert enc.write_to(block, lambda view: got.append(bytes(view))) == block.count(b"\n")
    assert got == [enc.encode(b)[0] for b in blocks]  # type: ignore[index]
    kept: list[Any] = []
    enc.write_to(blocks[0], kept.append)  # a writer that keeps the view breaks the contract, loudly
    with pytest.raises(BufferError):
        enc.write_to(blocks[0] * 2, kept.append)


@needs_c
def test_read_blocks_c_with_notices_during_the_copy(db_dsn: str) -> None:
    """libpq calls psycopg's notice handler from inside the C loop (which runs without the GIL)."""
    notices: list[str] = []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute(
            "CREATE FUNCTION pg_temp.noisy(i int) RETURNS int LANGUAGE plpgsql AS "
            "$$ BEGIN IF i % 1000 = 0 THEN RAISE NOTICE 'row %', i; END IF; RETURN i; END $$"
        )
        assert fast.native_reader(conn) is not None
        with conn.cursor().copy("COPY (SELECT pg_temp.noisy(g) FROM generate_series(1, 10000) g) TO STDOUT"):
            data = b"".join(fast.read_blocks(conn, size=100))
    assert data == b"".join(b"%d\n" % i for i in range(1, 10001))
    assert notices == [f"row {i}" for i in range(1000, 10001, 1000)]


# --- the kinds the C encoder shares with the stream's row encoder: floats, json, bytea, arrays -----

_KINDS_REL = ev.Relation(
    16500,
    "public",
    "kinds",
    "d",
    tuple(
        ev.Column(name, oid, -1, tname, name == "id")
        for name, oid, tname in (
            ("id", 20, "bigint"),
            ("f8", 701, "double precision"),
            ("f4", 700, "real"),
            ("jb", 3802, "jsonb"),
            ("js", 114, "json"),
            ("by", 17, "bytea"),
            ("ia", 1007, "integer[]"),
            ("ta", 1009, "text[]"),
            ("fa", 1022, "double precision[]"),
            ("ja", 3807, "jsonb[]"),
            ("ba", 1000, "boolean[]"),
            ("bya", 1001, "bytea[]"),
            ("box", 1020, "box[]"),
        )
    ),
)


def _kinds_rows() -> st.SearchStrategy[tuple[str | None, ...]]:
    from tests.output.test_fastpath import _array, _float_text, json_docs, texts

    docs = json_docs.filter(lambda t: t != "null")  # a JSON null document: declined, tested below
    floats = st.floats().map(_float_text)
    hexes = st.binary(max_size=20).map(lambda b: "\\x" + b.hex())
    opt = st.none().__or__
    return st.tuples(
        st.integers(-(2**63), 2**63 - 1).map(str),
        opt(floats),
        opt(st.floats(width=32).map(_float_text)),
        opt(docs),
        opt(docs),
        opt(hexes),
        opt(st.lists(st.none() | st.integers(-99, 99).map(str), max_size=4).map(_array)),
        opt(st.lists(st.none() | texts, max_size=4).map(_array)),
        opt(st.lists(st.none() | floats, max_size=3).map(_array)),
        opt(st.lists(st.none() | json_docs, max_size=3).map(_array)),
        opt(st.lists(st.none() | st.sampled_from(["t", "f"]), max_size=3).map(_array)),
        opt(st.lists(st.none() | hexes, max_size=3).map(_array)),
        opt(st.sampled_from(["{(1,2),(0,0);(3,4),(1,1)}", "{}"])),
    )


def _block(rows: list[tuple[str | None, ...]]) -> bytes:
    return b"".join(b"\t".join(b"\\N" if v is None else _copy_escape(v) for v in row) + b"\n" for row in rows)


@pytest.mark.parametrize("major", [None, 18])
@given(st.lists(_kinds_rows(), min_size=1, max_size=10))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_c_encoder_takes_floats_json_bytea_arrays(major: int | None, rows: list[tuple[str | None, ...]]) -> None:
    """The server's texts of these kinds: the C encoder writes the reference's lines itself (the
    floats are repr's shortest texts, as a server of 12 or later writes them, with 16 or 17 digits
    taken as they are when ``major`` says so)."""
    block = _block(rows)
    want: list[bytes] = []
    JsonlEncoder(want.append).snapshot_rows(_KINDS_REL, rows, CP)
    enc = fast.BlockEncoder(_KINDS_REL, CP, major)
    assert enc._native is not None or fast._copyfast is None
    if enc._native is not None:
        assert _c(enc, block) == (b"".join(want[1:]), len(rows))


@given(
    st.lists(
        st.tuples(st.integers(0, 12), st.sampled_from(["null", " null", "x", "{1,,2}", "1e400", "\\xz", ""])),
        max_size=4,
    )
)
@settings(max_examples=300, deadline=None)
def test_c_encoder_declines_or_agrees_on_odd_values(edits: list[tuple[int, str]]) -> None:
    """A JSON null document, values only the Python converters read (or nobody does): the C
    encoder declines the block or writes exactly what the Python path writes."""
    row: list[str | None] = ["1", "1.5", "2.5", "{}", "[]", "\\x00", "{1}", "{a}", "{1.5}", "{}", "{t}", "{}", "{}"]
    for col, value in edits:
        if col:
            row[col] = value
    block = _block([tuple(row)])
    enc = fast.BlockEncoder(_KINDS_REL, CP)
    if enc._native is None:
        return
    c = _c(enc, block)
    if c is not None:
        assert c == fast.BlockEncoder(_KINDS_REL, CP).encode(block)


def test_snapshot_of_the_new_kinds_from_the_server(
    db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(
            "CREATE TABLE k (id bigint PRIMARY KEY, f8 float8, f4 real, jb jsonb, by bytea, ia int[], ta text[], "
            "fa float8[], ja jsonb[])"
        )
        c.execute(
            "INSERT INTO k SELECT g, g / 7.0, g / 3.0, jsonb_build_object('g', g, 's', E'a\\nb'), "
            "decode(md5(g::text), 'hex'), ARRAY[g, NULL, -g], ARRAY['x y', NULL, 'NULL', E'q\"'], "
            "ARRAY[g * 1e-7, 'NaN'], ARRAY['{\"a\": 1}'::jsonb, 'null'] FROM generate_series(1, 3000) g"
        )
        # doubles of 15 to 17 digits on both sides of the layout's switches, and near the ends; some
        # of their texts are not the shortest (2.7e22 is written 2.7000000000000002e+22)
        c.execute(
            "INSERT INTO k (id, f8, fa) SELECT 10000 + g, x, ARRAY[x, -x] FROM generate_series(1, 3000) g, "
            "LATERAL (SELECT (g / 7.0)::float8 * power(10::float8, g % 48 - 24) * (CASE WHEN g % 97 = 0 "
            "THEN power(10::float8, 280 * sign(g % 2 - 0.5)) ELSE 1 END) AS x) v"
        )
        c.execute("INSERT INTO k VALUES (0, 'Infinity', '-Infinity', '[]', '', '{}', '{}', '{}', '{}')")
    counting = _Counting(fast._copyfast)
    if native == "c":
        monkeypatch.setattr(fast, "_copyfast", counting)
    monkeypatch.setattr(fast, "BLOCK_BYTES", 8192)
    got, want, n = _both_paths(db_dsn, tmp_path, "public.k")
    assert n == 6001 and got == want
    for value in (b"1.4285714285714285e-24", b"5571428571428571.0", b"2.7e+22", b"2.7714285714285716e-301"):
        assert b'"f8":' + value + b"," in got
    if native == "c":
        assert counting.calls["encode"] > 20 and counting.declined == 0


@needs_c
def test_doubles_of_16_and_17_digits_from_the_server(
    db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From PostgreSQL 12 on, the C encoder writes the server's 16- and 17-digit float8 texts as
    they are (Kind.SHORTEST): the reference's bytes for doubles all over the range, at the
    switches (10^15, where it stops; 2^53, above which the server's text may not be the shortest)
    and for integers whose shortest text the server does not write (2.7e22)."""
    xs = awkward_doubles(15000)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE dbl (id int PRIMARY KEY, x float8, xs float8[])")
        with c.cursor().copy("COPY dbl FROM STDIN") as copy:
            for i, x in enumerate(xs):
                copy.write_row((i, repr(x), f"{{{x!r},{-x!r}}}"))
        long = c.execute(
            "SELECT count(*) FROM dbl WHERE abs(x) < 1e15 AND "
            "length(ltrim(regexp_replace(split_part(x::text, 'e', 1), '[^0-9]', '', 'g'), '0')) >= 16"
        ).fetchone()
    assert long is not None and long[0] > 10000, long  # the texts the new path takes
    counting = _Counting(fast._copyfast)
    monkeypatch.setattr(fast, "_copyfast", counting)
    monkeypatch.setattr(snap, "WRITEBACK", 64 << 10)  # the background syncs run during this COPY too
    got, want, n = _both_paths(db_dsn, tmp_path, "public.dbl")
    assert n == len(xs) and got == want and len(got) > 20 * (64 << 10)
    assert counting.calls["encode"] > 0 and counting.declined == 0


@needs_c
@pytest.mark.parametrize(
    ("text", "shortest", "float_"),
    [
        ("0.10000000000000001", "0.10000000000000001", "0.1"),  # %.17g of 0.1: a text 12+ never writes
        ("1234567890.1234567", "1234567890.1234567", "1234567890.1234567"),
        ("2.7000000000000002e+22", "2.7e+22", "2.7e+22"),  # at or past 10^15: float() always
        ("1000000000000000.1", "1000000000000000.1", "1000000000000000.1"),
    ],
)
def test_shortest_takes_the_digits_as_they_are(text: str, shortest: str, float_: str) -> None:
    """SHORTEST trusts the digits below 10^15 (so it never calls float() there: a %.17g text
    shows it), and leaves the rest to float() as FLOAT does."""
    rel = replace(_REL, name="f", columns=(ev.Column("x", 701, -1, "double precision", False),))
    for major, want in ((18, shortest), (11, float_), (None, float_)):
        lines = _c(fast.BlockEncoder(rel, CP, major), text.encode() + b"\n")
        assert lines is not None and orjson.loads(lines[0])["new"]["x"] == float(want)
        assert b'"x":' + want.encode() + b"}," in lines[0], (major, lines)


def test_progress_shows_a_table_name_that_looks_like_markup() -> None:
    from pgrecv import events as ev
    from pgrecv.snapshot.core import Table, Task, _Progress

    rel = ev.Relation(1, "public", "[bold]x", "d", (ev.Column("id", 23, -1, "integer", True),))
    bar = _Progress([Task(1, Table(rel, ("id",), None, 1, 10), None, None, "tmp", "name")])
    try:
        task = bar._p.tasks[0]
        assert bar._p.columns[0].render(task).plain == "public.[bold]x"
    finally:
        bar.stop()
