#!/usr/bin/env python3
"""Capture the golden files under tests/golden/ from real PostgreSQL servers.

    python tools/capture_golden.py [--versions 15,18] [--cases types,toast] [--out tests/golden]

For every installed major version asked for, a throwaway server (pgrecv.pg.server.TempServer) runs
each case below in its own database. Per case a pgoutput slot ``p`` and a test_decoding slot
``t`` are created after the schema and before the workload, so both plugins describe the same
changes. The slots are then only peeked (never consumed), once per capture variant:

* ``pg<MAJOR>/<file>.pgoutput.jsonl``: ``pg_logical_slot_peek_binary_changes`` rows as
  ``{"lsn": "0/1A2B", "xid": 123, "data": "<hex>"}``;
* ``pg<MAJOR>/<file>.test_decoding.jsonl``: the same with ``"data": "<line>"``. The lines are
  fetched with the binary variant and ``force-binary`` so that message contents keep their bytes
  (the text variant stops at a NUL byte); a line that is not valid UTF-8 is stored as
  ``"data_hex"`` instead of ``"data"``;
* each file starts with ``{"meta": {...}}``: case (the workload), changes (a label: files of one
  directory with the same label describe the same row changes and messages; test_decoding's
  stream-changes files show them only as placeholders), plugin, proto_version (pgoutput),
  options (everything passed to the plugin), server_version, slot_two_phase,
  logical_decoding_work_mem, sql_function, and for pgoutput ``not_published``
  ({"schema.table": [ops]} that test_decoding shows but the publication leaves out);
* ``pg<MAJOR>/<case>.tables.json``: the final table contents, {"schema.table": [{column: text
  form or null}, ...]}, each value as the type's output function writes it (the form plugins
  send), ordered by the columns' text, to check decoded values against the server's own text.

``cases.sql`` (written next to the version directories) lists every statement each case ran,
with the connection that ran it. LSNs, xids and times differ between captures; values do not.
The script checks that each workload produced what it is for (streamed chunks, prepares, TOAST
placeholders, ...) and fails loudly otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.adapt import AdaptersMap
from psycopg.types.string import TextLoader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pgrecv.pg.server import PgInstall, TempServer, find_installations  # noqa: E402

SMALL_WORK_MEM = "64kB"  # the minimum: large transactions get streamed early


# --- sessions that remember what they ran --------------------------------------------------------


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def case(self, name: str) -> None:
        self.lines.append(f"\n-- ===== case: {name} =====")

    def add(self, label: str, statement: str) -> None:
        self.lines.append(f"-- [{label}]\n{statement.strip()};")


class Session:
    """An autocommit connection; transactions are explicit BEGIN/COMMIT statements, logged."""

    def __init__(self, dsn: str, label: str, log: Log | None) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.label = label
        self.log = log

    def run(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        if self.log is not None:
            self.log.add(self.label, statement if params is None else f"{statement}  /* {params!r} */")
        cur = self.conn.execute(statement, params)
        return cur.fetchall() if cur.description else []

    def script(self, statements: str) -> None:
        for stmt in statements.split(";\n"):
            if stmt.strip():
                self.run(stmt)

    def close(self) -> None:
        self.conn.close()


@dataclass
class Ctx:
    dsn: str
    version: int
    log: Log
    has_xml: bool
    sessions: list[Session] = field(default_factory=list)

    def session(self, label: str = "main") -> Session:
        s = Session(self.dsn, label, self.log)
        self.sessions.append(s)
        return s


# --- captures --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    file: str  # file name stem: <file>.<plugin>.jsonl
    plugin: str  # "pgoutput" | "test_decoding"
    options: dict[str, str]
    work_mem: str | None = None
    changes: str | None = None  # meta "changes" label; None: the case name


def _pop_str(options: dict[str, str], key: str) -> str | None:
    value = options.pop(key, None)
    return value if value else None


def max_proto(version: int) -> int:
    return 4 if version >= 16 else 3 if version >= 15 else 2


def pgo(file: str, version: int, *, proto: int | None = None, **options: str) -> Capture:
    opts = {"proto_version": str(proto or max_proto(version)), "publication_names": "pub", "messages": "true"}
    work_mem, changes = _pop_str(options, "work_mem"), _pop_str(options, "changes")
    opts.update(options)
    return Capture(file, "pgoutput", opts, work_mem, changes)


def td(file: str, **options: str) -> Capture:
    opts = {"include-xids": "1", "skip-empty-xacts": "1"}
    work_mem, changes = _pop_str(options, "work_mem"), _pop_str(options, "changes")
    opts.update({k.replace("_", "-"): v for k, v in options.items()})
    opts["force-binary"] = "1"
    return Capture(file, "test_decoding", opts, work_mem, changes)


@dataclass
class Case:
    name: str
    setup: Callable[[Session, Ctx], None]
    workload: Callable[[Ctx], None]
    captures: Callable[[int], list[Capture]]
    check: Callable[[dict[str, list[dict[str, Any]]], int], None]
    two_phase: bool = False
    not_published: dict[str, list[str]] = field(default_factory=dict)
    teardown: Callable[[Ctx], None] | None = None


def pgo_types(lines: list[dict[str, Any]]) -> list[str]:
    return [bytes.fromhex(m["data"])[:1].decode() for m in lines]


def td_data(lines: list[dict[str, Any]]) -> list[str]:
    return [m.get("data", "") for m in lines]


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"capture check failed: {what}")


# --- case: types -------------------------------------------------------------------------------------

TYPES_COLUMNS = """
    id int PRIMARY KEY,
    c_bool bool, c_int2 int2, c_int4 int4, c_int8 int8,
    c_numeric numeric, c_numeric_p numeric(38,10), c_float4 float4, c_float8 float8,
    c_text text, c_varchar varchar(20), c_char char(5), c_name name, c_bytea bytea,
    c_date date, c_time time, c_timetz timetz, c_ts timestamp, c_tstz timestamptz, c_ts3 timestamp(3),
    c_interval interval, c_uuid uuid, c_money money, c_bit bit(4), c_varbit varbit, c_oid oid,
    c_inet inet, c_cidr cidr, c_macaddr macaddr,
    c_point point, c_box box, c_lseg lseg, c_circle circle, c_polygon polygon, c_path path,
    c_tsvector tsvector, c_int4range int4range, c_tstzrange tstzrange,
    c_json json, c_jsonb jsonb,
    c_int_arr int[], c_text_arr text[], c_int_2d int[], c_lb_arr int[], c_jsonb_arr jsonb[],
    c_numeric_arr numeric[], c_bool_arr bool[], c_tstz_arr timestamptz[], c_box_arr box[], c_float8_arr float8[],
    c_enum mood, c_domain posint, c_comp pair, c_comp_q pair, c_enum_arr mood[], c_other "My Schema".color
"""

TYPES_ROWS: list[dict[str, str]] = [
    {  # ordinary values
        "id": "1",
        "c_bool": "true",
        "c_int2": "12",
        "c_int4": "-34",
        "c_int8": "5678901234",
        "c_numeric": "3.14159",
        "c_numeric_p": "12345.6789",
        "c_float4": "1.5",
        "c_float8": "-2.25e-10",
        "c_text": "'hello'",
        "c_varchar": "'varchar'",
        "c_char": "'ab'",
        "c_name": "'name'",
        "c_bytea": "'\\xdeadbeef'",
        "c_date": "'2026-01-02'",
        "c_time": "'03:04:05.123456'",
        "c_timetz": "'03:04:05+02'",
        "c_ts": "'2026-01-02 03:04:05.123'",
        "c_tstz": "'2026-01-02 03:04:05.123+05:30'",
        "c_ts3": "'2026-01-02 03:04:05.123456'",
        "c_interval": "'1 year 2 mons 3 days 04:05:06.789'",
        "c_uuid": "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
        "c_money": "1234.56",
        "c_bit": "B'1010'",
        "c_varbit": "B'101'",
        "c_oid": "4294967295",
        "c_inet": "'192.168.1.5/24'",
        "c_cidr": "'10.0.0.0/8'",
        "c_macaddr": "'08:00:2b:01:02:03'",
        "c_point": "'(1.5,-2)'",
        "c_box": "'((0,0),(1,1))'",
        "c_lseg": "'[(0,0),(1,1)]'",
        "c_circle": "'<(0,0),2>'",
        "c_polygon": "'((0,0),(1,0),(0,1))'",
        "c_path": "'[(0,0),(1,1),(2,0)]'",
        "c_tsvector": "'a fat cat'",
        "c_int4range": "'[1,10)'",
        "c_tstzrange": "'[2026-01-01,2026-02-01)'",
        "c_json": """'{"a": [1, 2.5, "x"], "b": {"c": null}}'""",
        "c_jsonb": """'{"a": [1, 2.5, "x"], "b": {"c": null}}'""",
        "c_int_arr": "'{1,2,3}'",
        "c_text_arr": "'{a,b}'",
        "c_int_2d": "'{{1,2},{3,4}}'",
        "c_lb_arr": "'[0:1]={1,2}'",
        "c_jsonb_arr": """ARRAY['{"k": 1}'::jsonb, 'null']""",
        "c_numeric_arr": "'{1.5,NaN,-0.001}'",
        "c_bool_arr": "'{t,f,NULL}'",
        "c_tstz_arr": """'{"2026-01-02 03:04:05+00",infinity}'""",
        "c_box_arr": "'{(1,1),(0,0);(2,2),(1,1)}'",
        "c_float8_arr": "'{1.5,NaN,Infinity,-Infinity,-0}'",
        "c_enum": "'happy'",
        "c_domain": "42",
        "c_comp": "ROW(1, 'one')",
        "c_comp_q": """ROW(2, 'it''s "q" \\ ,()')""",
        "c_enum_arr": "'{sad,happy}'",
        "c_other": "'red'",
        "c_xml": """'<a b="c">t</a>'""",
    },
    {"id": "2"},  # every column NULL
    {  # minimums, negatives, empties, -infinity, NaN
        "id": "3",
        "c_bool": "false",
        "c_int2": "-32768",
        "c_int4": "-2147483648",
        "c_int8": "-9223372036854775808",
        "c_numeric": "'NaN'",
        "c_numeric_p": "-9999999999999999999999999999.9999999999",
        "c_float4": "'-Infinity'",
        "c_float8": "'-0'",
        "c_text": "''",
        "c_varchar": "''",
        "c_char": "''",
        "c_name": "''",
        "c_bytea": "'\\x'",
        "c_date": "'-infinity'",
        "c_time": "'00:00:00'",
        "c_timetz": "'23:59:59.999999-12'",
        "c_ts": "'-infinity'",
        "c_tstz": "'-infinity'",
        "c_ts3": "'-infinity'",
        "c_interval": "'-1 day -1 second'",
        "c_uuid": "'00000000-0000-0000-0000-000000000000'",
        "c_money": "-0.01",
        "c_bit": "B'0000'",
        "c_varbit": "B''",
        "c_oid": "0",
        "c_inet": "'::1'",
        "c_cidr": "'2001:db8::/32'",
        "c_macaddr": "'00:00:00:00:00:00'",
        "c_point": "'(0,0)'",
        "c_tsvector": "''",
        "c_int4range": "'empty'",
        "c_tstzrange": "'(,)'",
        "c_json": "'null'",
        "c_jsonb": "'null'",
        "c_int_arr": "'{}'",
        "c_text_arr": "'{}'",
        "c_int_2d": "'{}'",
        "c_lb_arr": "'[-2:-1]={-1,-2}'",
        "c_jsonb_arr": "'{}'",
        "c_numeric_arr": "'{}'",
        "c_bool_arr": "'{}'",
        "c_tstz_arr": "'{-infinity}'",
        "c_box_arr": "'{}'",
        "c_float8_arr": "'{}'",
        "c_enum": "'sad'",
        "c_domain": "1",
        "c_comp": "ROW(NULL, NULL)",
        "c_comp_q": "ROW(NULL, '')",
        "c_enum_arr": "'{}'",
        "c_other": "'green'",
        "c_xml": "''",
    },
    {  # maximums, Infinity, unicode, quoting, escaping
        "id": "4",
        "c_bool": "true",
        "c_int2": "32767",
        "c_int4": "2147483647",
        "c_int8": "9223372036854775807",
        "c_numeric": "'Infinity'",
        "c_numeric_p": "9999999999999999999999999999.9999999999",
        "c_float4": "'Infinity'",
        "c_float8": "'NaN'",
        "c_text": "E'unicode \u00e9 \u00fc \u4e2d\u6587 \U0001f600 quotes '' \" "
        "backslash \\\\ newline\\n tab\\t cr\\r end'",
        "c_varchar": "'\u00fcn\u00efc\u00f6d\u00e9 \U0001f600'",
        "c_char": "'\u00f1\U0001f600'",
        "c_name": "'\u03a9mega'",
        "c_bytea": "'\\x00ff00'",
        "c_date": "'infinity'",
        "c_time": "'24:00:00'",
        "c_timetz": "'24:00:00+15:59'",
        "c_ts": "'infinity'",
        "c_tstz": "'infinity'",
        "c_ts3": "'infinity'",
        "c_interval": "'178000000 years'",
        "c_uuid": "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
        "c_money": "92233720368547758.07",
        "c_bit": "B'1111'",
        "c_varbit": "B'1010101010101'",
        "c_oid": "1",
        "c_inet": "'2001:db8::1/64'",
        "c_cidr": "'192.168.0.0/16'",
        "c_macaddr": "'ff:ff:ff:ff:ff:ff'",
        "c_box": "'((-1.5,-2.5),(1e+300,3))'",
        "c_tsvector": "E'''quoted word'' back\\\\\\\\slash \u00e9\u00e9'",
        "c_int4range": "'(,5]'",
        "c_tstzrange": "'[2026-01-01 00:00:00+00,infinity)'",
        "c_json": 'E\'{\\n  "text": "line1\\\\nline2\\\\ttab \\\\"q\\\\" \\\\\\\\ \\\\u00e9 \U0001f600",\\n  '
        '"n": [1e100, -0, 0.1]\\r\\n}\'',
        "c_jsonb": 'E\'{"s": "line1\\\\nline2", "e": "\U0001f600", "empty": "", '
        '"nested": {"a": [[], {}, null, true, false]}, "big": 12345678901234567890.5}\'',
        "c_int_arr": "'{NULL,-1,2147483647}'",
        "c_text_arr": "ARRAY[NULL, '', 'NULL', 'null', 'a,b', '{braces}', 'quote\"d', 'back\\slash', ' spaced ', "
        "'\u00e9\U0001f600', E'new\\nline']",
        "c_int_2d": "'{{1,NULL},{NULL,4}}'",
        "c_lb_arr": "'[5:6][1:2]={{1,2},{3,4}}'",
        "c_jsonb_arr": """ARRAY['"str"'::jsonb, '[1,{"a":"b"}]', NULL]""",
        "c_numeric_arr": "'{Infinity,-Infinity,123456789012345678901234567890.123456789}'",
        "c_bool_arr": "'{NULL}'",
        "c_tstz_arr": """'{"2026-06-30 23:59:59.999999+00",NULL,-infinity}'""",
        "c_box_arr": "'{(3,3),(1,1)}'",
        "c_float8_arr": "'{1e308,5e-324,-1.5}'",
        "c_enum": "'with \"quote\"'",
        "c_domain": "2147483647",
        "c_comp": "ROW(-1, E'multi\\nline')",
        "c_comp_q": """ROW(3, '"')""",
        "c_enum_arr": """ARRAY['with "quote"', 'it''s', 'so-so']::mood[]""",
        "c_other": "'blue'",
        "c_xml": "'<r>\u00e9 &amp; \U0001f600</r>'",
    },
    {  # big precision, far dates
        "id": "5",
        "c_numeric": "'-Infinity'",
        "c_numeric_p": "0.0000000001",
        "c_float4": "'3.4028235e+38'",
        "c_float8": "'1.7976931348623157e308'",
        "c_text": "repeat('x', 300)",
        "c_date": "'0044-03-15 BC'",
        "c_ts": "'0001-01-01 00:00:00 BC'",
        "c_tstz": "'1999-12-31 23:59:59.999999+00'",
        "c_interval": "'-178000000 years'",
        "c_time": "'23:59:59.999999'",
        "c_int_arr": "'{{{1},{2}},{{3},{4}}}'",
        "c_numeric_arr": "'{12345678901234567890.123456789012345678901234567890,0.000}'",
    },
]


def types_setup(s: Session, ctx: Ctx) -> None:
    s.script(
        """
        CREATE TYPE mood AS ENUM ('sad', 'happy', 'so-so', 'with "quote"', 'it''s');
        CREATE DOMAIN posint AS int CHECK (VALUE > 0);
        CREATE TYPE pair AS (a int, b text);
        CREATE SCHEMA "My Schema";
        CREATE TYPE "My Schema".color AS ENUM ('red', 'green', 'blue');
        CREATE TABLE "My Schema"."odd.table" ("a b" int PRIMARY KEY, "x""y" text, "Δ" numeric)
        """
    )
    columns = TYPES_COLUMNS + (", c_xml xml" if ctx.has_xml else "")
    s.run(f"CREATE TABLE all_types ({columns})")
    s.run("CREATE PUBLICATION pub FOR ALL TABLES")


def types_workload(ctx: Ctx) -> None:
    s = ctx.session()
    for row in TYPES_ROWS:
        cols = [c for c in row if ctx.has_xml or c != "c_xml"]
        s.run(f"INSERT INTO all_types ({', '.join(cols)}) VALUES ({', '.join(row[c] for c in cols)})")
    s.run("UPDATE all_types SET c_text = E'updated\\ttext', c_int_arr = '{9}' WHERE id = 1")
    s.run("UPDATE all_types SET id = 40, c_int4 = 0 WHERE id = 4")  # key change: old key sent
    s.run("DELETE FROM all_types WHERE id = 5")
    s.run("""INSERT INTO "My Schema"."odd.table" VALUES (1, 'x"y''z', 1.50), (2, NULL, -0.0)""")
    s.run("""UPDATE "My Schema"."odd.table" SET "x""y" = 'changed' WHERE "a b" = 1""")
    s.run("""DELETE FROM "My Schema"."odd.table" WHERE "a b" = 2""")


def types_captures(v: int) -> list[Capture]:
    return [pgo("types", v), pgo("types_proto1", v, proto=1), td("types")]


def types_check(files: dict[str, list[dict[str, Any]]], v: int) -> None:
    kinds = pgo_types(files["types.pgoutput"])
    expect("Y" in kinds and kinds.count("I") == 7 and kinds.count("U") == 3 and kinds.count("D") == 2, f"types {kinds}")
    expect(pgo_types(files["types_proto1.pgoutput"]) == kinds, "proto 1 gives the same message kinds")


# --- case: replica_identity ------------------------------------------------------------------------


def ri_setup(s: Session, ctx: Ctx) -> None:
    s.script(
        """
        CREATE TABLE ri_default (id int PRIMARY KEY, v text);
        CREATE TABLE ri_full (id int, v text, n numeric);
        ALTER TABLE ri_full REPLICA IDENTITY FULL;
        CREATE TABLE ri_index (a int NOT NULL, b text NOT NULL, v text);
        CREATE UNIQUE INDEX ri_index_ab ON ri_index (a, b);
        ALTER TABLE ri_index REPLICA IDENTITY USING INDEX ri_index_ab;
        CREATE TABLE ri_nothing (id int, v text);
        ALTER TABLE ri_nothing REPLICA IDENTITY NOTHING;
        CREATE PUBLICATION pub FOR TABLE ri_default, ri_full, ri_index;
        CREATE PUBLICATION pub_ins FOR TABLE ri_nothing WITH (publish = 'insert')
        """
    )


def ri_workload(ctx: Ctx) -> None:
    s = ctx.session()
    s.script(
        """
        INSERT INTO ri_default VALUES (1, 'a'), (2, 'b'), (3, 'c');
        UPDATE ri_default SET v = 'a2' WHERE id = 1;
        UPDATE ri_default SET id = 10 WHERE id = 2;
        UPDATE ri_default SET id = id + 100, v = 'both' WHERE id = 3;
        DELETE FROM ri_default WHERE id = 10;
        INSERT INTO ri_full VALUES (1, 'a', 1.5), (2, NULL, NULL), (3, 'dup', 0), (3, 'dup', 0);
        UPDATE ri_full SET v = 'a2' WHERE id = 1;
        UPDATE ri_full SET id = 20, n = -1 WHERE id = 2;
        DELETE FROM ri_full WHERE id = 1;
        DELETE FROM ri_full WHERE id = 3;
        INSERT INTO ri_index VALUES (1, 'x', 'v1'), (2, 'y', NULL);
        UPDATE ri_index SET v = 'v2' WHERE a = 1;
        UPDATE ri_index SET b = 'x2' WHERE a = 1;
        DELETE FROM ri_index WHERE a = 2;
        INSERT INTO ri_nothing VALUES (1, 'n1'), (2, 'n2');
        UPDATE ri_nothing SET v = 'n1b' WHERE id = 1;
        DELETE FROM ri_nothing WHERE id = 2;
        BEGIN;
        INSERT INTO ri_default VALUES (50, 'several in one');
        UPDATE ri_full SET n = n + 1;
        DELETE FROM ri_index;
        COMMIT
        """
    )


def ri_captures(v: int) -> list[Capture]:
    return [pgo("replica_identity", v, publication_names="pub,pub_ins"), td("replica_identity", include_timestamp="1")]


def ri_check(files: dict[str, list[dict[str, Any]]], v: int) -> None:
    kinds = pgo_types(files["replica_identity.pgoutput"])
    lines = td_data(files["replica_identity.test_decoding"])
    expect(any("(no-tuple-data)" in ln for ln in lines), "test_decoding shows the NOTHING delete")
    expect(any("old-key:" in ln for ln in lines), "old keys present")
    expect(kinds.count("D") == 6, f"pgoutput deletes {kinds}")


# --- case: toast ------------------------------------------------------------------------------------------

BIG = "(SELECT string_agg(md5(g::text || '{seed}'), '') FROM generate_series(1, 100) g)"  # 3200 chars, incompressible


def toast_setup(s: Session, ctx: Ctx) -> None:
    s.script(
        """
        CREATE TABLE toast_d (id int PRIMARY KEY, n int, big text, small text);
        CREATE TABLE toast_f (id int, n int, big text, small text);
        ALTER TABLE toast_f REPLICA IDENTITY FULL;
        CREATE PUBLICATION pub FOR ALL TABLES
        """
    )


def toast_workload(ctx: Ctx) -> None:
    s = ctx.session()
    for table in ("toast_d", "toast_f"):
        s.run(f"INSERT INTO {table} VALUES (1, 0, {BIG.format(seed='a')}, 's1'), (2, 0, 'short', 's2')")
        s.run(f"UPDATE {table} SET n = 1 WHERE id = 1")  # big unchanged and not sent
        s.run(f"UPDATE {table} SET n = 2, small = NULL WHERE id = 1")
        s.run(f"UPDATE {table} SET big = {BIG.format(seed='b')} WHERE id = 1")  # big changed: sent
        s.run(f"UPDATE {table} SET n = 3 WHERE id = 2")
        s.run(f"UPDATE {table} SET big = NULL, n = 4 WHERE id = 1")
        s.run(f"UPDATE {table} SET big = {BIG.format(seed='c')} WHERE id = 2")
        s.run(f"UPDATE {table} SET n = 5 WHERE id = 2")
        s.run(f"DELETE FROM {table} WHERE id = 2")


def toast_captures(v: int) -> list[Capture]:
    return [pgo("toast", v), td("toast")]


def toast_check(files: dict[str, list[dict[str, Any]]], v: int) -> None:
    lines = td_data(files["toast.test_decoding"])
    expect(sum("unchanged-toast-datum" in ln for ln in lines) >= 4, "unchanged TOAST in test_decoding")
    small_updates = [m for m in files["toast.pgoutput"] if m["data"].startswith("55") and len(m["data"]) < 2000]
    expect(len(small_updates) >= 4, "updates without the TOASTed value in pgoutput")


# --- case: truncate ---------------------------------------------------------------------------------------


def truncate_setup(s: Session, ctx: Ctx) -> None:
    s.script(
        """
        CREATE TABLE parent (id int PRIMARY KEY);
        CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent);
        CREATE TABLE seq_t (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text);
        CREATE TABLE plain_a (id int PRIMARY KEY);
        CREATE TABLE plain_b (id int PRIMARY KEY);
        CREATE PUBLICATION pub FOR ALL TABLES
        """
    )


def truncate_workload(ctx: Ctx) -> None:
    s = ctx.session()
    s.script(
        """
        INSERT INTO parent VALUES (1), (2);
        INSERT INTO child VALUES (1, 1), (2, 2);
        INSERT INTO seq_t (v) VALUES ('a'), ('b');
        INSERT INTO plain_a VALUES (1);
        INSERT INTO plain_b VALUES (1);
        TRUNCATE parent CASCADE;
        TRUNCATE seq_t RESTART IDENTITY;
        INSERT INTO seq_t (v) VALUES ('c');
        TRUNCATE plain_a, plain_b;
        BEGIN;
        INSERT INTO plain_a VALUES (2);
        TRUNCATE plain_a;
        INSERT INTO plain_a VALUES (3);
        COMMIT;
        TRUNCATE ONLY plain_b RESTART IDENTITY CASCADE
        """
    )


def truncate_captures(v: int) -> list[Capture]:
    return [pgo("truncate", v), td("truncate", include_xids="0")]


def truncate_check(files: dict[str, list[dict[str, Any]]], v: int) -> None:
    expect(pgo_types(files["truncate.pgoutput"]).count("T") == 5, "five truncates")
    lines = td_data(files["truncate.test_decoding"])
    expect(any("TRUNCATE: restart_seqs cascade" in ln for ln in lines), "test_decoding truncate flags")


# --- case: messages ---------------------------------------------------------------------------------------


def messages_setup(s: Session, ctx: Ctx) -> None:
    s.script("CREATE TABLE m_t (id int PRIMARY KEY);\nCREATE PUBLICATION pub FOR ALL TABLES")


def messages_workload(ctx: Ctx) -> None:
    s = ctx.session()
    s.script(
        r"""
        SELECT pg_logical_emit_message(true, 'txn', 'transactional text');
        SELECT pg_logical_emit_message(false, 'nontxn', 'non-transactional text');
        SELECT pg_logical_emit_message(true, 'bin', '\x00c3a9017f'::bytea);
        SELECT pg_logical_emit_message(true, 'nonutf8', '\xfffe00'::bytea);
        SELECT pg_logical_emit_message(true, '', 'empty prefix');
        SELECT pg_logical_emit_message(false, 'empty', '');
        BEGIN;
        INSERT INTO m_t VALUES (1);
        SELECT pg_logical_emit_message(true, 'in-txn', 'with a row');
        SELECT pg_logical_emit_message(false, 'nt-in-txn', 'sent at once');
        COMMIT;
        BEGIN;
        SELECT pg_logical_emit_message(true, 'rolled-back', 'never decoded');
        SELECT pg_logical_emit_message(false, 'nt-rolled-back', 'decoded anyway');
        ROLLBACK;
        SELECT pg_logical_emit_message(true, 'unicode é😀', E'multi\nline é😀 "quoted" \\ back')
        """
    )


def messages_captures(v: int) -> list[Capture]:
    return [pgo("messages", v), td("messages")]


def messages_check(files: dict[str, list[dict[str, Any]]], v: int) -> None:
    expect(pgo_types(files["messages.pgoutput"]).count("M") == 10, "ten messages in pgoutput")
    td_lines = files["messages.test_decoding"]
    count = sum("message:" in m.get("data", "") for m in td_lines) + sum("data_hex" in m for m in td_lines)
    expect(count == 10, f"ten messages in test_decoding, not {count}")


# --- case: streaming --------------------------------------------------------------------------------------


def streaming_setup(s: Session, ctx: Ctx) -> None:
    s.script(
        """
        CREATE TABLE big (id int PRIMARY KEY, v text);
        CREATE TABLE small (id int PRIMARY KEY, v text);
        CREATE PUBLICATION pub FOR ALL TABLES
        """
    )


def streaming_workload(ctx: Ctx) -> None:
    a, b = ctx.session("A"), ctx.session("B")
    a.run("BEGIN")
    a.run("INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, 1000) g")
    a.run("SAVEPOINT s1")
    a.run("INSERT INTO big SELECT g, 'rolled back' FROM generate_series(1001, 1500) g")
    a.run("ROLLBACK TO SAVEPOINT s1")
    b.run("INSERT INTO small VALUES (1, 'committed while A is open')")
    a.run("SAVEPOINT s2")
    a.run("INSERT INTO big SELECT g, 'kept subxact' FROM generate_series(1501, 1700) g")
    a.run("RELEASE SAVEPOINT s2")
    a.run("INSERT INTO big SELECT g, 'v' || g FROM generate_series(1701, 2000) g")
    a.run("UPDATE big SET v = 'updated' WHERE id <= 5")
    b.run("INSERT INTO small VALUES (2, 'second small')")
    a.run("COMMIT")
    a.run("BEGIN")
    a.run("INSERT INTO big SELECT g, 'aborted' FROM generate_series(3001, 3800) g")
    a.run("ROLLBACK")
    b.run("INSERT INTO small VALUES (3, 'after')")


def streaming_captures(v: int) -> list[Capture]:
    caps = [
        pgo("streaming", v, proto=2, streaming="on", work_mem=SMALL_WORK_MEM),
        td("streaming", work_mem=SMALL_WORK_MEM, stream_changes="1"),
        td("streaming_plain", work_mem=SMALL_WORK_MEM),
    ]
    if v >= 16:
        caps.append(pgo("streaming_parallel", v, proto=4, streaming="parallel", work_mem=SMALL_WORK_MEM))
    return caps


def streaming_check(files: dict[str, list[dict[str, Any]]], v: int) -> None:
    for name in ("streaming.pgoutput", "streaming_parallel.pgoutput"):
        if name in files:
            kinds = pgo_types(files[name])
            # PostgreSQL 17+ checks the commit log before streaming and drops a transaction already
            # aborted by the time it is decoded, so only the rolled-back savepoint shows there
            aborts = 1 if v >= 17 else 2
            expect(kinds.count("S") >= 3 and "c" in kinds and kinds.count("A") == aborts and "B" in kinds, name)
    lines = td_data(files["streaming.test_decoding"])
    expect(any(ln.startswith("opening a streamed block") for ln in lines), "test_decoding streamed")
    expect(any(ln.startswith("aborting streamed") for ln in lines), "test_decoding streamed abort")


# --- case: twophase ---------------------------------------------------------------------------------------


def twophase_setup(s: Session, ctx: Ctx) -> None:
    s.script("CREATE TABLE tp (id int PRIMARY KEY, v text);\nCREATE PUBLICATION pub FOR ALL TABLES")


def twophase_workload(ctx: Ctx) -> None:
    s = ctx.session()
    s.script(
        """
        BEGIN;
        INSERT INTO tp VALUES (1, 'committed'), (2, 'c2');
        PREPARE TRANSACTION 'gx_commit';
        COMMIT PREPARED 'gx_commit';
        BEGIN;
        INSERT INTO tp VALUES (3, 'rolled back');
        UPDATE tp SET v = 'rb' WHERE id = 1;
        PREPARE TRANSACTION 'gx ''quoted'' rollback';
        ROLLBACK PREPARED 'gx ''quoted'' rollback';
        BEGIN;
        INSERT INTO tp SELECT g, 'big' FROM generate_series(100, 899) g;
        PREPARE TRANSACTION 'gx_big';
        COMMIT PREPARED 'gx_big';
        BEGIN;
        INSERT INTO tp SELECT g, 'big rolled back' FROM generate_series(2000, 2599) g;
        PREPARE TRANSACTION 'gx_big_rb';
        ROLLBACK PREPARED 'gx_big_rb';
        INSERT INTO tp VALUES (5, 'plain commit');
        BEGIN;
        INSERT INTO tp VALUES (4, 'still prepared');
        PREPARE TRANSACTION 'gx_pending'
        """
    )


def twophase_teardown(ctx: Ctx) -> None:
    s = ctx.session("teardown")
    s.run("ROLLBACK PREPARED 'gx_pending'")  # a prepared transaction would block the next slot creation


def twophase_captures(v: int) -> list[Capture]:
    # with little memory, 17+ drops the changes of a transaction known to be rolled back when it
    # would spill or stream it, so the low-memory captures describe different changes
    low = "twophase_lowmem"
    return [
        pgo("twophase", v, proto=3, two_phase="on"),
        pgo("twophase_streamed", v, proto=3, two_phase="on", streaming="on", work_mem=SMALL_WORK_MEM, changes=low),
        td("twophase"),
        td("twophase_lowmem", work_mem=SMALL_WORK_MEM, changes=low),
        td("twophase_streamed", stream_changes="1", work_mem=SMALL_WORK_MEM, changes=low),
    ]


def twophase_check(files: dict[str, list[dict[str, Any]]], v: int) -> None:
    kinds = pgo_types(files["twophase.pgoutput"])
    expect(kinds.count("b") == 5 and kinds.count("P") == 5 and kinds.count("K") == 2 and "r" in kinds, f"{kinds}")
    kinds = pgo_types(files["twophase_streamed.pgoutput"])
    # 17+: the big transaction prepared then rolled back is known aborted when decoded, so not streamed
    expect(kinds.count("p") == (1 if v >= 17 else 2) and "S" in kinds, f"stream prepare {kinds}")
    lines = td_data(files["twophase.test_decoding"])
    expect(any(ln.startswith("ROLLBACK PREPARED") for ln in lines), "td rollback prepared")


# --- case: origin -----------------------------------------------------------------------------------------


def origin_setup(s: Session, ctx: Ctx) -> None:
    s.script(
        """
        CREATE TABLE o_t (id int PRIMARY KEY, v text);
        CREATE PUBLICATION pub FOR ALL TABLES;
        SELECT pg_replication_origin_create('myorigin')
        """
    )


def origin_workload(ctx: Ctx) -> None:
    s, o = ctx.session(), ctx.session("with origin")
    s.run("INSERT INTO o_t VALUES (1, 'local')")
    o.run("SELECT pg_replication_origin_session_setup('myorigin')")
    o.run("BEGIN")
    o.run("SELECT pg_replication_origin_xact_setup('0/ABCDEF0', '2026-01-02 03:04:05.678+00')")
    o.run("INSERT INTO o_t VALUES (2, 'from origin')")
    o.run("UPDATE o_t SET v = 'changed by origin' WHERE id = 1")
    o.run("COMMIT")
    o.run("INSERT INTO o_t VALUES (3, 'origin, no xact setup')")
    o.run("SELECT pg_replication_origin_session_reset()")
    s.run("INSERT INTO o_t VALUES (4, 'local again')")


def origin_captures(v: int) -> list[Capture]:
    caps = [
        pgo("origin", v),
        td("origin", include_timestamp="1"),
        td("origin_local", only_local="1", changes="origin_local"),
    ]
    if v >= 16:
        caps.append(pgo("origin_local", v, origin="none", changes="origin_local"))
    return caps


def origin_check(files: dict[str, list[dict[str, Any]]], v: int) -> None:
    expect(pgo_types(files["origin.pgoutput"]).count("O") == 2, "two Origin messages")
    expect(len(td_data(files["origin_local.test_decoding"])) == 6, "only-local keeps two transactions")


# --- case: binary -----------------------------------------------------------------------------------------


def binary_setup(s: Session, ctx: Ctx) -> None:
    s.script(
        """
        CREATE TYPE mood AS ENUM ('sad', 'happy');
        CREATE TABLE bin_types (
            id int PRIMARY KEY, b bool, i2 int2, i4 int4, i8 int8, o oid, f4 float4, f8 float8, n numeric,
            t text, vc varchar(10), bc char(4), nm name, by bytea, u uuid, d date, tm time, ts timestamp,
            tstz timestamptz, iv interval, j json, jb jsonb,
            a_int int[], a_text text[], a_2d int[], a_lb int[], a_num numeric[], a_jsonb jsonb[], a_bool bool[],
            a_tstz timestamptz[], a_f8 float8[], a_uuid uuid[], a_date date[], a_bytea bytea[], a_i8 int8[],
            tz timetz, ip inet, e mood, r int4range);
        CREATE TABLE bin_numeric (id int PRIMARY KEY, n numeric, n2 numeric(10,4));
        CREATE TABLE bin_time (id int PRIMARY KEY, d date, tm time, ts timestamp, tstz timestamptz, iv interval);
        CREATE PUBLICATION pub FOR ALL TABLES
        """
    )


BIN_NUMERICS = [
    "0", "-0.0", "1", "-1", "0.0001", "0.00000000000000000001", "100000000000000000000", "123.4500",
    "-987654321.123456789", "12345678901234567890.123456789012345678901234567890", "9999", "10000", "0.5",
    "1e-130", "-1.5e300", "'NaN'", "'Infinity'", "'-Infinity'", "NULL",
]  # fmt: skip
BIN_TIMES = [
    ("'2026-01-02'", "'03:04:05.123456'", "'2026-01-02 03:04:05.123456'", "'2026-01-02 03:04:05.5+05:30'",
     "'1 year 2 mons 3 days 04:05:06.789'"),
    ("'2000-01-01'", "'00:00:00'", "'2000-01-01 00:00:00'", "'2000-01-01 00:00:00+00'", "'0'"),
    ("'1999-12-31'", "'23:59:59.999999'", "'1999-12-31 23:59:59.999999'", "'1999-12-31 23:59:59.000001+00'",
     "'-1 days +02:03:04'"),
    ("'0044-03-15 BC'", "'12:00:00'", "'0001-01-01 00:00:00 BC'", "'1900-06-15 12:34:56+00'", "'00:00:00.000001'"),
    ("'5874897-12-31'", "'24:00:00'", "'294276-12-31 23:59:59.999999'", "'1970-01-01 00:00:00+00'", "'1 mon -1 days'"),
    ("'-infinity'", "NULL", "'-infinity'", "'-infinity'", "'-178000000 years'"),
    ("'infinity'", "NULL", "'infinity'", "'infinity'", "'178000000 years 11 mons 30 days 23:59:59.999999'"),
]  # fmt: skip


def binary_workload(ctx: Ctx) -> None:
    s = ctx.session()
    s.script(
        r"""
        INSERT INTO bin_types VALUES (1, true, 1, 2, 3, 4, 1.5, -2.25, 3.14159, 'text', 'vc', 'bc', 'nm',
            '\xdeadbeef', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2026-01-02', '03:04:05.123456',
            '2026-01-02 03:04:05.123', '2026-01-02 03:04:05.123+05:30', '1 year 2 mons 3 days 04:05:06.789',
            '{"a": [1, 2.5, "x"], "b": {"c": null}}', '{"a": [1, 2.5, "x"], "b": {"c": null}}',
            '{1,2,3}', '{a,b}', '{{1,2},{3,4}}', '[0:1]={1,2}', '{1.5,NaN,-0.001}', ARRAY['{"k": 1}'::jsonb, 'null'],
            '{t,f,NULL}', '{"2026-01-02 03:04:05+00",infinity}', '{1.5,NaN,Infinity,-Infinity,-0}',
            '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}', '{2026-01-02,-infinity}', '{"\\x00ff",NULL,"\\x"}',
            '{-9223372036854775808,9223372036854775807}', '03:04:05+02', '192.168.1.5/24', 'happy', '[1,10)');
        INSERT INTO bin_types (id) VALUES (2);
        INSERT INTO bin_types VALUES (3, false, -32768, -2147483648, -9223372036854775808, 4294967295,
            '-Infinity', '-0', 'NaN', '', '', '', '', '\x', '00000000-0000-0000-0000-000000000000', '-infinity',
            '00:00:00', '-infinity', '-infinity', '-1 day -1 second', 'null', 'null',
            '{}', '{}', '{}', '[-2:-1]={-1,-2}', '{}', '{}', '{}', '{-infinity}', '{}', '{}', '{}', '{}', '{}',
            '23:59:59.999999-12', '::1', 'sad', 'empty');
        INSERT INTO bin_types VALUES (4, true, 32767, 2147483647, 9223372036854775807, 0, 'Infinity', 'NaN',
            'Infinity', E'unicode \u00e9 \U0001F600 quotes '' " \\ new\nline\ttab', 'ünïcödé', 'ñ😀', 'Ωmega',
            '\x00ff00', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 'infinity', '24:00:00', 'infinity', 'infinity',
            '178000000 years', E'{\n  "s": "line1\\nline2 \\u00e9 😀",\n  "n": [1e100, -0, 0.1]\r\n}',
            '{"s": "line1\\nline2", "e": "😀", "nested": {"a": [[], {}, null, true, false]}, "big": 1.5e300}',
            '{NULL,-1,2147483647}', ARRAY[NULL, '', 'NULL', 'a,b', '{braces}', 'quote"d', 'back\slash', 'é😀'],
            '{{1,NULL},{NULL,4}}', '[5:6][1:2]={{1,2},{3,4}}',
            '{Infinity,-Infinity,123456789012345678901234567890.1}',
            ARRAY['"str"'::jsonb, '[1,{"a":"b"}]', NULL], '{NULL}', '{"2026-06-30 23:59:59.999999+00",NULL}',
            '{1e308,5e-324,-1.5}', '{}', '{0044-03-15 BC,infinity}', '{}', '{0,NULL}', '24:00:00+15:59',
            '::ffff:1.2.3.4', 'sad', '(,5]');
        UPDATE bin_types SET t = 'updated', a_int = '{9}' WHERE id = 1;
        DELETE FROM bin_types WHERE id = 3
        """
    )
    for i, n in enumerate(BIN_NUMERICS, start=1):
        n2 = n if n in ("'NaN'", "NULL") or ("'" not in n and abs(float(n)) < 1e5) else "NULL"
        s.run(f"INSERT INTO bin_numeric VALUES ({i}, {n}, {n2})")
    for i, row in enumerate(BIN_TIMES, start=1):
        s.run(f"INSERT INTO bin_time VALUES ({i}, {', '.join(row)})")


def binary_captures(v: int) -> list[Capture]:
    return [pgo("binary", v, binary="true"), pgo("binary_text", v), td("binary")]


def binary_check(files: dict[str, list[dict[str, Any]]], v: int) -> None:
    expect(files["binary.pgoutput"] != files["binary_text.pgoutput"], "binary differs from text")
    expect(pgo_types(files["binary.pgoutput"]) == pgo_types(files["binary_text.pgoutput"]), "same message kinds")


CASES = [
    Case("types", types_setup, types_workload, types_captures, types_check),
    Case("replica_identity", ri_setup, ri_workload, ri_captures, ri_check,
         not_published={"public.ri_nothing": ["update", "delete"]}),
    Case("toast", toast_setup, toast_workload, toast_captures, toast_check),
    Case("truncate", truncate_setup, truncate_workload, truncate_captures, truncate_check),
    Case("messages", messages_setup, messages_workload, messages_captures, messages_check),
    Case("streaming", streaming_setup, streaming_workload, streaming_captures, streaming_check),
    Case("twophase", twophase_setup, twophase_workload, twophase_captures, twophase_check, two_phase=True,
         teardown=twophase_teardown),
    Case("origin", origin_setup, origin_workload, origin_captures, origin_check),
    Case("binary", binary_setup, binary_workload, binary_captures, binary_check),
]  # fmt: skip


# --- running -------------------------------------------------------------------------------------------


def wait_flushed(conn: psycopg.Connection[Any]) -> None:
    """The peek functions stop at the flushed WAL position; a non-transactional message has no
    commit to flush it, so wait for the WAL writer."""
    target = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
    deadline = time.monotonic() + 10
    while True:
        row = conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", target).fetchone()
        if row and row[0]:
            return
        if time.monotonic() > deadline:
            raise SystemExit("WAL was not flushed within 10 s")
        time.sleep(0.05)


def peek(dsn: str, cap: Capture) -> list[dict[str, Any]]:
    slot = "p" if cap.plugin == "pgoutput" else "t"
    args: list[str] = [x for kv in cap.options.items() for x in kv]
    placeholders = "".join(", %s" for _ in args)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if cap.work_mem:
            conn.execute(sql.SQL("SET logical_decoding_work_mem = {}").format(sql.Literal(cap.work_mem)))
        rows = conn.execute(
            f"SELECT lsn::text, xid::text::bigint, data "
            f"FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL{placeholders})",
            [slot, *args],
        ).fetchall()
    out: list[dict[str, Any]] = []
    for lsn, xid, data in rows:
        if cap.plugin == "pgoutput":
            out.append({"lsn": lsn, "xid": xid, "data": bytes(data).hex()})
        else:
            try:
                out.append({"lsn": lsn, "xid": xid, "data": bytes(data).decode()})
            except UnicodeDecodeError:
                out.append({"lsn": lsn, "xid": xid, "data_hex": bytes(data).hex()})
    return out


def table_contents(dsn: str) -> dict[str, list[dict[str, str | None]]]:
    """Every user table's rows, each value as the type's output function writes it (what a
    plugin sends as text; ``col::text`` differs for bool, char(n) and inet), through a connection
    that loads every column as a plain string."""
    result: dict[str, list[dict[str, str | None]]] = {}
    raw_text = AdaptersMap()
    raw_text.register_loader(0, TextLoader)  # no other loaders: every OID falls back to this one
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, context=raw_text) as raw:
        tables = conn.execute(
            """
            SELECT n.nspname, c.relname, array_agg(a.attname::text ORDER BY a.attnum)
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
            WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
              AND n.nspname NOT LIKE 'pg\\_%'
            GROUP BY 1, 2 ORDER BY 1, 2
            """
        ).fetchall()
        for schema, table, columns in tables:
            query = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in columns),
                sql.Identifier(schema, table),
                sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns),
            )
            rows = raw.execute(query).fetchall()
            result[f"{schema}.{table}"] = [dict(zip(columns, row, strict=True)) for row in rows]
    return result


@contextmanager
def case_database(server: TempServer, name: str) -> Iterator[str]:
    dsn = server.create_database(name)
    try:
        yield dsn
    finally:
        server.drop_database(name)


def run_case(server: TempServer, case: Case, out_dir: Path, log: Log) -> list[Path]:
    v = server.version
    log.case(case.name)
    with case_database(server, case.name) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            try:
                conn.execute("SELECT '<a/>'::xml")
                has_xml = True
            except psycopg.errors.FeatureNotSupported:
                has_xml = False
        ctx = Ctx(dsn, v, log, has_xml)
        setup = ctx.session("setup")
        case.setup(setup, ctx)
        two_phase = "true" if case.two_phase else "false"
        for slot, plugin in (("p", "pgoutput"), ("t", "test_decoding")):
            setup.run(f"SELECT pg_create_logical_replication_slot('{slot}', '{plugin}', false, {two_phase})")
        case.workload(ctx)
        wait_flushed(setup.conn)
        files: dict[str, list[dict[str, Any]]] = {}
        written: list[Path] = []
        for cap in case.captures(v):
            lines = peek(dsn, cap)
            meta: dict[str, Any] = {
                "case": case.name,
                "changes": cap.changes or case.name,
                "plugin": cap.plugin,
                "options": cap.options,
                "server_version": server.full_version,
                "slot_two_phase": case.two_phase,
                "logical_decoding_work_mem": cap.work_mem,
                "sql_function": "pg_logical_slot_peek_binary_changes",
            }
            if cap.plugin == "pgoutput":
                meta["proto_version"] = int(cap.options["proto_version"])
                meta["not_published"] = case.not_published
            path = out_dir / f"{cap.file}.{cap.plugin}.jsonl"
            path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in [{"meta": meta}, *lines]))
            files[f"{cap.file}.{cap.plugin}"] = lines
            written.append(path)
        case.check(files, v)
        tables_path = out_dir / f"{case.name}.tables.json"
        tables_path.write_bytes(orjson.dumps(table_contents(dsn), option=orjson.OPT_INDENT_2) + b"\n")
        written.append(tables_path)
        if case.teardown is not None:
            case.teardown(ctx)
        for s in ctx.sessions:
            s.close()
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", default="15,18", help="major versions, comma-separated (default 15,18)")
    ap.add_argument("--cases", default="", help="only these cases, comma-separated (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden")
    args = ap.parse_args(argv)
    wanted = [int(v) for v in args.versions.split(",") if v]
    cases = [c for c in CASES if not args.cases or c.name in args.cases.split(",")]
    installs: dict[int, PgInstall] = {}
    for inst in find_installations():
        installs.setdefault(inst.version, inst)
    missing = [v for v in wanted if v not in installs]
    if missing:
        print(f"no binaries for PostgreSQL {missing}; found {sorted(installs)}", file=sys.stderr)
        return 1
    log = Log()
    for v in wanted:
        out_dir = args.out / f"pg{v}"
        out_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with TempServer(installs[v]) as server:
            for case in cases:
                log_for_version = log if v == wanted[-1] else Log()
                paths = run_case(server, case, out_dir, log_for_version)
                size = sum(p.stat().st_size for p in paths)
                print(f"pg{v} {case.name}: {len(paths)} files, {size / 1024:.0f} kB")
        print(f"pg{v}: {time.monotonic() - started:.1f} s")
    if not args.cases:
        header = (
            "-- Workloads of the golden cases, as run by tools/capture_golden.py on the newest version\n"
            "-- (all_types has an xml column only where the server was built with libxml).\n"
        )
        (args.out / "cases.sql").write_text(header + "\n".join(log.lines).lstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
