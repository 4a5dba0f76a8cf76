"""TestDecodingParser against real servers: lines come from test_decoding itself (PG 15 and 18),
values are compared with what the same server says about the same rows.

The server's own text form of a value is ``format('%s', col)`` (the type's output function, as
test_decoding uses it; ``col::text`` differs for booleans: 'true' vs 't').
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgrecv.decode.test_decoding import TestDecodingParser, parse_timestamptz
from pgrecv.errors import DecodeError
from pgrecv.events import (
    UNCHANGED,
    Begin,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Insert,
    Message,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Update,
)

Conn = psycopg.Connection[Any]


# --- helpers ---------------------------------------------------------------------------------


def make_slot(conn: Conn, name: str = "td") -> str:
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding', false, true)", (name,))
    return name


def get_lines(conn: Conn, slot: str, *options: str) -> list[tuple[int, int, str]]:
    """(lsn, xid, line) rows of pg_logical_slot_get_changes with test_decoding options."""
    rows = conn.execute(
        "SELECT (lsn - '0/0'::pg_lsn)::int8, xid::text::int8, data "
        "FROM pg_logical_slot_get_changes(%s, NULL, NULL, VARIADIC %s::text[])",
        (slot, list(options)),
    ).fetchall()
    return [(int(lsn), int(xid), data) for lsn, xid, data in rows]


def decode_all(lines: list[tuple[int, int, str]], parser: TestDecodingParser | None = None) -> list[Event | None]:
    p = parser or TestDecodingParser()
    return [p.decode(line, lsn) for lsn, _, line in lines]


def rows_of(events: Sequence[Event | None], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def server_text(conn: Conn, table: str, columns: list[str], order_by: str = "id") -> list[dict[str, str | None]]:
    """Each row as {column: output-function text or None}, in ``order_by`` order."""
    exprs = sql.SQL(", ").join(
        sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END").format(c=sql.Identifier(c))
        for c in columns
    )
    query = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(exprs, sql.SQL(table), sql.Identifier(order_by))
    return [dict(zip(columns, row, strict=True)) for row in conn.execute(query).fetchall()]


def server_micros(conn: Conn, text: str) -> int:
    """Microseconds since 2000-01-01 UTC of a timestamptz text, computed by the server (exactly:
    an interval's epoch is numeric, unlike a timestamp's near the end of the range)."""
    row = conn.execute(
        "SELECT (extract(epoch FROM %s::timestamptz - '2000-01-01 00:00:00+00'::timestamptz) * 1000000)::int8",
        (text,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def as_dict(rel: Relation, values: tuple[Any, ...]) -> dict[str, Any]:
    return {c.name: v for c, v in zip(rel.columns, values, strict=True)}


# --- values and quoting -------------------------------------------------------------------

TABLE = '"My Schema"."Odd ""Table"""'
TYPES_DDL = r"""
CREATE SCHEMA "My Schema";
CREATE TYPE "My Schema"."Mood Type" AS ENUM ('sad', 'o''k', 'new
line');
CREATE TYPE "we]:ird" AS ENUM ('a', 'b c');
CREATE SCHEMA s2;
CREATE TYPE s2.color AS ENUM ('red', 'green');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TYPE pair AS (a int, b text);
CREATE TABLE {table} (
    id int PRIMARY KEY,
    t text, vc varchar(20), ch char(3), nm name, i2 int2, i8 int8, o oid, f4 real, f8 double precision,
    n numeric, n2 numeric(10,2), b bool, bits bit(4), vb varbit, by bytea, d date, ts timestamp(3),
    tstz timestamptz, iv interval, tm time, tmtz timetz, u uuid, j json, jb jsonb, ia int[], ta text[],
    ba bool[], na numeric[], mood "My Schema"."Mood Type", moods "My Schema"."Mood Type"[], w "we]:ird",
    ws "we]:ird"[], c s2.color, cs s2.color[], pi posint, p pair, "Select" int, "Col A" text,
    "x"" y[int]:'z" text, "ñame" text, "new
col" text, ip inet, mon money, pt point, rng int4range, tq tsquery, tsv tsvector, "char" "char"
)
""".replace("{table}", TABLE)

ROW_1 = r"""VALUES (1, 'x', 'v', 'ab', 'nm', -32768, 9223372036854775807, 4294967295, 'NaN', '-Infinity',
    'NaN', 12.5, true, B'0101', B'', '\x00ff', '2026-02-28', '2026-01-02 03:04:05.678',
    '2026-01-02 03:04:05.123456+05:30', '1 year 2 mons -3 days 04:05:06.7', '23:59:59.999999', '10:00+02',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"k": [1, 2.50, null]}', '{"k": "v\n", "n": null}', '{1,NULL,3}',
    '{"a b","c\"d",NULL,"NULL","","back\\slash"}', '{t,f}', '{1.5,NaN}', 'o''k', '{sad,"new
line"}', 'b c', '{a,"b c"}', 'red', '{red,green}', 7, '(1,"x y")', 5, 'A', 'z', 'ñ', 'nl', '10.1.2.3/16', 12.34,
    '(1.5,-2)', '[1,5)', 'fat & !rat', 'a fat cat', 'q')"""

TRICKY_TEXTS = [
    "it's",
    "a\nb\r\nc",
    "tab\there",
    "back\\slash \\x41 \\\\",
    "'",
    "''",
    "",
    " leading and trailing ",
    "null",
    "NULL",
    "unchanged-toast-datum",
    "true",
    "B'0101'",
    " x[integer]:1",
    " new-tuple: y[integer]:2 ",
    "ñ😀 \u2028 \x01",
    "'quoted' \"double\" [br]:",
]


def _insert_tricky_rows(conn: Conn) -> None:
    conn.execute(TYPES_DDL)
    ins = f"INSERT INTO {TABLE} "
    for i, txt in enumerate(TRICKY_TEXTS):
        conn.execute(
            ins + '(id, t, vc, ch, nm, "Col A", "x"" y[int]:\'z", "ñame", "new\ncol", ta, j, jb, by) '
            "VALUES (%s, %s, left(%s, 20), left(%s, 3), %s, %s, %s, %s, %s, ARRAY[%s, NULL, %s], "
            "to_json(%s::text), jsonb_build_object(%s::text, %s::text), convert_to(%s, 'UTF8'))",
            (100 + i, *[txt] * 14),
        )
    conn.execute(ins + ROW_1)
    conn.execute(ins + "(id) VALUES (2)")  # every other column NULL
    conn.execute(
        ins + "(id, f4, f8, n, i2) VALUES (3, 'Infinity', 1e300, 'Infinity', 0), (4, '-0', 1.5e-310, "
        "'-123456789012345678901234567890.000000000000000000001', 1)"
    )
    conn.execute(ins + "(id, t) VALUES (5, repeat('long text ', 20000))")  # TOASTed, sent whole


def test_insert_values_match_the_server(db_conn: Conn) -> None:
    slot = make_slot(db_conn)
    _insert_tricky_rows(db_conn)
    events = decode_all(get_lines(db_conn, slot))
    inserts = rows_of(events, Insert)
    assert len(inserts) == len(TRICKY_TEXTS) + 5
    rel = inserts[0].relation
    assert (rel.namespace, rel.name, rel.oid, rel.replica_identity) == ("My Schema", 'Odd "Table"', 0, "?")
    names = [c.name for c in rel.columns]
    expected = server_text(db_conn, TABLE, names)
    got = sorted((as_dict(e.relation, e.new) for e in inserts), key=lambda r: int(r["id"]))
    assert len(got) == len(expected)
    for g, x in zip(got, expected, strict=True):
        assert g == x
    # spot checks of the normalisations, independent of format()
    one = next(g for g in got if g["id"] == "1")
    assert (one["b"], one["bits"], one["vb"], one["f4"], one["n"]) == ("t", "0101", "", "NaN", "NaN")
    long_row = next(g for g in got if g["id"] == "5")
    assert long_row["t"] == "long text " * 20000


def test_relation_columns_match_the_catalog(db_conn: Conn) -> None:
    slot = make_slot(db_conn)
    _insert_tricky_rows(db_conn)
    rel = rows_of(decode_all(get_lines(db_conn, slot)), Insert)[0].relation
    catalog = db_conn.execute(
        "SELECT attname, format_type(atttypid, NULL), atttypid::int, "
        "  (SELECT n.nspname = 'pg_catalog' AND t.oid < 10000 FROM pg_type t "
        "   JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = atttypid) "
        'FROM pg_attribute WHERE attrelid = \'"My Schema"."Odd ""Table"""\'::regclass '
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    ).fetchall()
    assert [(c.name, c.type_name) for c in rel.columns] == [(name, typ) for name, typ, _, _ in catalog]
    for col, (_, _, oid, builtin) in zip(rel.columns, catalog, strict=True):
        assert col.type_oid == (oid if builtin else 0), col
        assert (col.type_modifier, col.key) == (-1, False)
    user_types = {c.name: c.type_name for c in rel.columns if c.type_oid == 0}
    assert user_types["mood"] == '"My Schema"."Mood Type"'
    assert user_types["ws"] == '"we]:ird"[]'
    assert user_types["cs"] == "s2.color[]"


def test_same_signature_same_relation_object(db_conn: Conn) -> None:
    slot = make_slot(db_conn)
    db_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db_conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 5) g")
    db_conn.execute("ALTER TABLE t ADD COLUMN w int")
    db_conn.execute("INSERT INTO t VALUES (6, 'six', 6)")
    inserts = rows_of(decode_all(get_lines(db_conn, slot)), Insert)
    assert [e.new for e in inserts] == [(str(i), f"v{i}") for i in range(1, 6)] + [("6", "six", "6")]
    assert len({id(e.relation) for e in inserts[:5]}) == 1
    assert [c.name for c in inserts[5].relation.columns] == ["id", "v", "w"]


# --- updates, deletes and their old images ------------------------------------------------


def test_update_delete_old_images(db_conn: Conn) -> None:
    slot = make_slot(db_conn)
    db_conn.execute(
        'CREATE TABLE k ("Key A" text, kb int, v text, big text, PRIMARY KEY ("Key A", kb));'
        "ALTER TABLE k ALTER COLUMN big SET STORAGE EXTERNAL;"
        "CREATE TABLE f (a int, b text, c text); ALTER TABLE f REPLICA IDENTITY FULL;"
        "CREATE TABLE nothing (a int); ALTER TABLE nothing REPLICA IDENTITY NOTHING;"
    )
    db_conn.execute("INSERT INTO k VALUES ('it''s\nkey', 1, 'v', repeat('B', 5000))")
    db_conn.execute("UPDATE k SET v = 'w'")  # key unchanged: no old image; TOAST not sent
    db_conn.execute("UPDATE k SET kb = 2")  # key changed: old key
    db_conn.execute("DELETE FROM k")
    db_conn.execute("INSERT INTO f VALUES (1, NULL, 'c')")
    db_conn.execute("UPDATE f SET c = 'd'")
    db_conn.execute("DELETE FROM f")
    db_conn.execute("INSERT INTO nothing VALUES (1); UPDATE nothing SET a = 2; DELETE FROM nothing")
    events = decode_all(get_lines(db_conn, slot))
    updates, deletes = rows_of(events, Update), rows_of(events, Delete)
    key = "it's\nkey"

    u1, u2, u3, u4 = updates
    assert (u1.new, u1.old, u1.old_kind) == ((key, "1", "w", UNCHANGED), None, None)
    assert u1.relation.key_names == ()
    assert u2.new == (key, "2", "w", UNCHANGED)
    assert (u2.old, u2.old_kind, u2.relation.key_names) == ((key, "1", None, None), "K", ("Key A", "kb"))
    assert [c.name for c in u2.relation.columns] == ["Key A", "kb", "v", "big"]
    # REPLICA IDENTITY FULL: the old row without its NULL column (test_decoding skips NULLs there)
    assert (u3.new, u3.old, u3.old_kind) == (("1", None, "d"), ("1", None, "c"), "K")
    assert u3.relation.key_names == ("a", "c")
    assert (u4.new, u4.old) == (("2",), None)

    d1, d2, d3 = deletes
    assert (d1.old, d1.old_kind, d1.relation.key_names) == ((key, "2"), "K", ("Key A", "kb"))
    assert [c.type_name for c in d1.relation.columns] == ["text", "integer"]
    assert (d2.old, d2.relation.key_names) == (("1", "d"), ("a", "c"))
    assert (d3.old, d3.old_kind, d3.relation.columns) == (None, None, ())
    assert all(e.xid is None and e.lsn > 0 for e in updates + deletes)


def test_repeated_rows_take_the_fast_path_with_the_same_result(db_conn: Conn) -> None:
    slot = make_slot(db_conn)
    db_conn.execute("CREATE TABLE r (id int PRIMARY KEY, t text, b bool, bits varbit)")
    texts = ["a", "it's", "x''y", "", "'", "  ", "a b", "new\nline"]
    for i, t in enumerate(texts):
        db_conn.execute("INSERT INTO r VALUES (%s, %s, %s, %s)", (i, t, i % 2 == 0, "1" * i))
    for i, _ in enumerate(texts):
        db_conn.execute("UPDATE r SET id = id + 100, t = t || '!' WHERE id = %s", (i,))
    db_conn.execute("DELETE FROM r")
    lines = get_lines(db_conn, slot)
    one = decode_all(lines)
    fresh = [TestDecodingParser().decode(line, lsn) for lsn, _, line in lines]  # never warmed up
    assert one == fresh
    inserts = rows_of(one, Insert)
    assert [e.new[1] for e in inserts] == texts
    assert [e.new[2] for e in inserts] == ["t", "f"] * 4
    assert [e.new[3] for e in inserts] == ["1" * i for i in range(len(texts))]
    assert [e.new[1] for e in rows_of(one, Update)] == [t + "!" for t in texts]
    assert [e.old for e in rows_of(one, Update)] == [(str(i), None, None, None) for i in range(len(texts))]
    assert sorted(e.old[0] for e in rows_of(one, Delete)) == sorted(str(i + 100) for i in range(len(texts)))


def test_truncate(db_conn: Conn) -> None:
    slot = make_slot(db_conn)
    db_conn.execute('CREATE SCHEMA "S p"; CREATE TABLE "S p"."T,1" (a int); CREATE TABLE u (a serial)')
    db_conn.execute('TRUNCATE "S p"."T,1", u')
    db_conn.execute("TRUNCATE u RESTART IDENTITY")
    db_conn.execute("TRUNCATE u CASCADE")
    db_conn.execute("TRUNCATE u RESTART IDENTITY CASCADE")
    truncs = rows_of(decode_all(get_lines(db_conn, slot)), Truncate)
    assert [[(r.namespace, r.name) for r in t.relations] for t in truncs] == [
        [("S p", "T,1"), ("public", "u")],
        [("public", "u")],
        [("public", "u")],
        [("public", "u")],
    ]
    flags = [(False, False), (True, False), (False, True), (True, True)]
    assert [(t.restart_identity, t.cascade) for t in truncs] == flags


# --- transactions ----------------------------------------------------------------------------


@pytest.mark.parametrize("timezone", ["UTC", "Asia/Kolkata", "America/St_Johns", "America/Los_Angeles"])
def test_begin_commit_xids_and_times(db_conn: Conn, timezone: str) -> None:
    db_conn.execute("CREATE TABLE t (a int)")
    slot = make_slot(db_conn)
    db_conn.execute(sql.SQL("SET TimeZone = {}").format(sql.Literal(timezone)))
    with db_conn.transaction():
        db_conn.execute("INSERT INTO t VALUES (9)")
        xid = int(db_conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
    for options, with_xid, with_time in [
        ((), True, False),
        (("include-timestamp", "1"), True, True),
        (("include-xids", "0"), False, False),
        (("include-xids", "0", "include-timestamp", "on"), False, True),
    ]:
        rows = db_conn.execute(
            "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
            "VARIADIC %s::text[])",
            (slot, list(options)),
        ).fetchall()
        events = [TestDecodingParser().decode(data, lsn) for lsn, data in rows]
        begin, ins, commit = events
        assert isinstance(begin, Begin) and isinstance(ins, Insert) and isinstance(commit, Commit)
        assert begin == Begin(0, None, xid if with_xid else None)
        assert (commit.xid, commit.flags) == (xid if with_xid else None, 0)
        assert commit.commit_lsn == commit.end_lsn == rows[2][0]
        if with_time:
            text = rows[2][1].rpartition("(at ")[2].rstrip(")")
            assert commit.commit_time == server_micros(db_conn, text)
            if timezone != "UTC":
                assert not text.endswith("+00")
        else:
            assert commit.commit_time is None


@pytest.mark.parametrize(
    ("timezone", "value"),
    [
        ("UTC", "2026-11-22 07:37:15.123456"),
        ("Asia/Kolkata", "2026-11-22 07:37:15.1"),
        ("America/St_Johns", "1999-12-31 23:59:59.999999"),
        ("Europe/Amsterdam", "1900-06-01 12:00:00.5"),  # LMT offset with seconds: +00:19:32
        ("America/New_York", "0044-03-15 12:00:00 BC"),
        ("UTC", "294276-12-31 23:59:59.999999"),
        ("Pacific/Kiritimati", "2000-01-01 00:00:00"),
    ],
)
def test_parse_timestamptz_against_the_server(db_conn: Conn, timezone: str, value: str) -> None:
    """Texts in the style timestamptz_to_str() prints (ISO, numeric offset), read back by the server."""
    db_conn.execute(sql.SQL("SET TimeZone = {}").format(sql.Literal(timezone)))
    db_conn.execute("SET DateStyle = ISO")
    text = db_conn.execute("SELECT %s::timestamptz::text", (value,)).fetchone()[0]  # type: ignore[index]
    assert parse_timestamptz(text) == server_micros(db_conn, text), text


def test_two_phase(db_conn: Conn) -> None:
    slot = make_slot(db_conn)
    db_conn.execute("CREATE TABLE t (a int)")
    gids = ["plain", "it's", "back\\slash'n", "with, txid 5 (at x)"]
    xids = []
    for gid in gids:
        db_conn.execute("BEGIN")
        db_conn.execute("INSERT INTO t VALUES (1)")
        xids.append(int(db_conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]))  # type: ignore[index]
        db_conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    for i, gid in enumerate(gids):
        verb = "COMMIT PREPARED {}" if i % 2 == 0 else "ROLLBACK PREPARED {}"
        db_conn.execute(sql.SQL(verb).format(sql.Literal(gid)))
    lines = get_lines(db_conn, slot, "include-timestamp", "1")
    events = [e for e in decode_all(lines) if not isinstance(e, Begin | Commit | Insert)]
    prepares = rows_of(events, Prepare)
    assert [(p.gid, p.xid) for p in prepares] == list(zip(gids, xids, strict=True))
    assert all(p.prepare_time is not None and p.prepare_lsn == p.end_lsn > 0 for p in prepares)
    commits, rollbacks = rows_of(events, CommitPrepared), rows_of(events, RollbackPrepared)
    assert [(c.gid, c.xid) for c in commits] == [(gids[0], xids[0]), (gids[2], xids[2])]
    assert [(r.gid, r.xid) for r in rollbacks] == [(gids[1], xids[1]), (gids[3], xids[3])]
    assert all(r.rollback_time is not None and r.rollback_end_lsn > 0 for r in rollbacks)
    assert any(line.startswith("PREPARE TRANSACTION E'") for _, _, line in lines)  # the backslash form

    # and without xids and timestamps
    db_conn.execute("BEGIN; INSERT INTO t VALUES (2); PREPARE TRANSACTION 'g2'")
    db_conn.execute("COMMIT PREPARED 'g2'")
    lines = get_lines(db_conn, slot, "include-xids", "0")
    plain = decode_all(lines)
    (prep,), (done,) = rows_of(plain, Prepare), rows_of(plain, CommitPrepared)
    lsn_of = {line: lsn for lsn, _, line in lines}
    assert prep == Prepare(0, lsn_of["PREPARE TRANSACTION 'g2'"], lsn_of["PREPARE TRANSACTION 'g2'"], None, None, "g2")
    assert done == CommitPrepared(0, lsn_of["COMMIT PREPARED 'g2'"], lsn_of["COMMIT PREPARED 'g2'"], None, None, "g2")


def test_messages(db_conn: Conn) -> None:
    slot = make_slot(db_conn)
    cases = [
        (True, "plain", b"abc"),
        (False, "", b""),
        (True, "pre, sz: 3 content:", b"x\ny"),
        (False, "p", b", sz: 99 content:zz"),
        (True, "ñ", "ü\r\n\t'\\".encode()),
    ]
    for transactional, prefix, content in cases:
        db_conn.execute("SELECT pg_logical_emit_message(%s, %s, %s::bytea)", (transactional, prefix, content))
    msgs = rows_of(decode_all(get_lines(db_conn, slot)), Message)
    assert [(m.transactional, m.prefix, m.content, m.xid) for m in msgs] == [(*c, None) for c in cases]
    assert all(m.lsn > 0 for m in msgs)


def test_binary_interface_gives_bytes_with_the_same_events(db_conn: Conn) -> None:
    """The replication protocol hands lines over as bytes; message contents stay exact bytes."""
    slot = make_slot(db_conn)
    db_conn.execute("CREATE TABLE t (id int, v text)")
    db_conn.execute("INSERT INTO t VALUES (1, 'ñ\n''x')")
    db_conn.execute("SELECT pg_logical_emit_message(false, 'bin', '\\xff00fe'::bytea)")
    db_conn.execute("SELECT pg_logical_emit_message(true, 'txt', 'plain'::bytea)")
    rows = db_conn.execute(
        "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL)", (slot,)
    ).fetchall()
    from_bytes = decode_all([(lsn, 0, data) for lsn, data in rows])
    assert all(isinstance(data, bytes) for _, data in rows)
    ins = rows_of(from_bytes, Insert)[0]
    assert ins.new == ("1", "ñ\n'x")
    msgs = [(m.prefix, m.content) for m in rows_of(from_bytes, Message)]
    assert msgs == [("bin", b"\xff\x00\xfe"), ("txt", b"plain")]
    text_rows = [(lsn, data.decode()) for lsn, data in rows if b"\xff" not in data]
    from_text = decode_all([(lsn, 0, data) for lsn, data in text_rows])
    assert from_text == [e for e, (_, data) in zip(from_bytes, rows, strict=True) if b"\xff" not in data]


# --- streamed transactions ------------------------------------------------------------------


def test_streamed_transactions(db_conn: Conn) -> None:
    slot = make_slot(db_conn)
    db_conn.execute("CREATE TABLE st (id int, data text)")
    db_conn.execute("BEGIN")
    db_conn.execute("SELECT pg_logical_emit_message(true, 'tp', 'abc')")
    db_conn.execute("SELECT pg_logical_emit_message(false, 'ntp', 'nontx')")
    db_conn.execute("INSERT INTO st SELECT g, repeat('a', 200) FROM generate_series(1, 1000) g")
    top = int(db_conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
    db_conn.execute("SAVEPOINT s1")
    db_conn.execute("INSERT INTO st SELECT g, repeat('b', 200) FROM generate_series(1, 1000) g")
    db_conn.execute("TRUNCATE st")
    db_conn.execute("ROLLBACK TO s1")
    db_conn.execute("INSERT INTO st VALUES (1, 'x')")
    db_conn.execute("COMMIT")
    db_conn.execute("BEGIN")
    db_conn.execute("INSERT INTO st SELECT g, repeat('c', 200) FROM generate_series(1, 1000) g")
    prepared = int(db_conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
    db_conn.execute("PREPARE TRANSACTION 'sp''1'")
    db_conn.execute("COMMIT PREPARED 'sp''1'")
    db_conn.execute("SET logical_decoding_work_mem = '64kB'")
    for options, with_xids in [
        (("include-timestamp", "1", "stream-changes", "1"), True),
        (("include-xids", "0", "stream-changes", "1", "skip-empty-xacts", "1"), False),
    ]:
        rows = db_conn.execute(
            "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
            "VARIADIC %s::text[])",
            (slot, list(options)),
        ).fetchall()
        lines = [data for _, data in rows]
        assert any(line.startswith("streaming change for") for line in lines)
        assert any(line.startswith("streaming message: transactional: 1") for line in lines)
        parser = TestDecodingParser()
        events = [parser.decode(data, lsn) for lsn, data in rows]
        # lines that only announce a change carry no event
        for line, e in zip(lines, events, strict=True):
            assert (e is None) == (line.startswith(("streaming change", "streaming truncate", "streaming message")))
        starts = rows_of(events, StreamStart)
        assert len(starts) == len(rows_of(events, StreamStop)) >= 2
        assert starts[0].first and not any(s.first for s in starts[1 : len(starts) // 2])
        aborts = rows_of(events, StreamAbort)
        assert len(aborts) == 1
        commit, prep = rows_of(events, StreamCommit), rows_of(events, StreamPrepare)
        assert len(commit) == len(prep) == 1
        assert prep[0].gid == "sp'1"
        assert commit[0].commit_lsn == commit[0].end_lsn > 0
        assert [(m.prefix, m.content, m.transactional) for m in rows_of(events, Message)] == [("ntp", b"nontx", False)]
        if with_xids:
            assert {s.xid for s in starts} == {top, prepared}
            assert aborts[0].xid == top and aborts[0].subxid > top
            assert commit[0].xid == top and prep[0].xid == prepared
            assert commit[0].commit_time > 0 and prep[0].prepare_time > 0
        else:
            assert {s.xid for s in starts} == {0}
            assert (commit[0].xid, commit[0].commit_time, prep[0].xid, prep[0].prepare_time) == (0, 0, 0, 0)


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "what", "column"),
    [
        ("table public.t: INSERT: a[text]:'abc", "unterminated quoted value", 33),
        ("table public.t: INSERT: a[text]:'a''", "unterminated quoted value", 33),
        ("table public.t: INSERT: a[integer]:", "expected a value", 36),
        ("table public.t: INSERT: a[integer]:1x'", "expected a value", 36),
        ("table public.t: INSERT: a[integer]:1  b[text]:null", "expected a column name", 38),
        ("table public.t: INSERT: a[integer:1", "unterminated type name", 26),
        ('table public.t: INSERT: "a[integer]:1', "unterminated quoted column name", 25),
        ('table public.t: INSERT: a[public."my ""type]:1', "unterminated quoted type name", 34),
        ("table public.t: INSERT: a[integer]:'x'b[text]:null", "expected a space", 39),
        ("table public.t: UPSERT: a[integer]:1", "expected INSERT:, UPDATE:, DELETE: or TRUNCATE:", 16),
        ("table public.t: UPDATE: old-key: a[integer]:1", "expected 'new-tuple:'", 46),
        ("table t: INSERT: a[integer]:1", "expected '.' between schema and table name", 8),
        ('table "pub.t: INSERT: a[integer]:1', "unterminated quoted table name", 7),
        ("table public.t: TRUNCATE: restart_seqs sometimes", "expected (no-flags)", 26),
        ("BEGIN x", "expected BEGIN or BEGIN <xid>", 6),
        ("COMMIT 12 (at yesterday)", "expected a timestamp", 15),
        ("COMMIT PREPARED gid", "expected a quoted transaction identifier", 17),
        ("PREPARE TRANSACTION 'g', txid x", "expected [, txid <xid>]", 24),
        ("message: transactional: 2 prefix: p, sz: 1 content:x", "expected 'transactional: 0|1 prefix: '", 10),
        ("message: transactional: 1 prefix: p content:x", "expected ', sz: <size> content:'", 35),
        ("streaming change for TXN x", "expected 'transaction' or 'TXN <xid>'", 22),
        ("opening a streamed block for transaction 12", "expected end of line or 'TXN <xid>'", 41),
        ("INSERT INTO t VALUES (1)", "unrecognised test_decoding line", 1),
        ("", "unrecognised test_decoding line", 1),
    ],
)
def test_errors_name_what_and_where(line: str, what: str, column: int) -> None:
    with pytest.raises(DecodeError) as info:
        TestDecodingParser().decode(line)
    msg = str(info.value)
    assert msg.startswith("test_decoding: ")
    assert what in msg
    assert f"at column {column} of line: " in msg
    assert "\n" not in msg


def test_error_message_is_one_short_line() -> None:
    line = "table public.t: INSERT: a[text]:'" + "x\ny" * 1000
    with pytest.raises(DecodeError) as info:
        TestDecodingParser().decode(line)
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 400
    assert "x\\ny" in msg
    assert info.value.detail is not None and "x\\ny" in info.value.detail


def test_invalid_utf8_bytes() -> None:
    with pytest.raises(DecodeError, match="not valid UTF-8"):
        TestDecodingParser().decode(b"table public.t: INSERT: a[text]:'\xff'")
    # a message's content is arbitrary bytes
    msg = TestDecodingParser().decode(b"message: transactional: 0 prefix: p, sz: 2 content:\xff\x00", 7)
    assert msg == Message(False, 7, "p", b"\xff\x00", None)


def test_text_that_cannot_be_message_bytes() -> None:
    with pytest.raises(DecodeError, match="message content is not text"):
        TestDecodingParser().decode("message: transactional: 1 prefix: p, sz: 1 content:\ud800")


def test_relation_cache_is_bounded() -> None:
    """REPLICA IDENTITY FULL old rows make one relation per NULL pattern: the cache must not grow
    without bound, and relations rebuilt after it is dropped are equal to the first ones."""
    from pgrecv.decode import test_decoding as td

    p = TestDecodingParser()
    first = p.decode("table public.t: DELETE: c0[integer]:1")
    for i in range(td._MAX_RELATIONS + 10):
        e = p.decode(f"table public.t: DELETE: c{i}[integer]:1")
        assert isinstance(e, Delete) and e.relation.columns[0].name == f"c{i}"
    assert len(p._rels) <= td._MAX_RELATIONS
    again = p.decode("table public.t: DELETE: c0[integer]:1")
    assert again == first
