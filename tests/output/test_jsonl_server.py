"""JSONL from real servers: both plugins' output, decoded and encoded, checked against the schema
and against the server's own rendering of the same values (``::text``, ``to_json``)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import psycopg
import pytest

from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.decode.test_decoding import TestDecodingParser
from pgrecv.lsn import LSN
from pgrecv.output.jsonl import JsonlEncoder
from pgrecv.pg.conn import server_major

SCHEMA = json.loads(resources.files("pgrecv").joinpath("schema/event-v1.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
GOLDEN = Path(__file__).parent.parent / "golden"

Record = dict[str, Any]

# column -> (type, how to compare: "text" = the server's ::text, "json" = to_json(), "bytea", "float")
TYPES: dict[str, tuple[str, str]] = {
    "i2": ("smallint", "json"),
    "i8": ("bigint", "json"),
    "num": ("numeric(14,4)", "text"),
    "f8": ("double precision", "float"),
    "f4": ("real", "float"),
    "b": ("boolean", "json"),
    "t": ("text", "text"),
    "vc": ("varchar(20)", "text"),
    "js": ("json", "json"),
    "jb": ("jsonb", "json"),
    "ia": ("integer[]", "json"),
    "ta": ("text[]", "json"),
    "ba": ("bytea", "bytea"),
    "ts": ("timestamptz", "text"),
    "tsn": ("timestamp", "text"),
    "d": ("date", "text"),
    "u": ("uuid", "text"),
    "iv": ("interval", "text"),
}
ROWS = [
    # id, then the values in TYPES order, as SQL literals
    r"""1, 1, 9007199254740993, 12.5, 0.1, 1.5, true, 'plain', 'vc', '{"a": [1, 2.5, "x"]}',
    '{"b": {"c": null}}', '{1,2,3}', '{a,b}', '\x00ff10', '2026-01-02 03:04:05.123456+00',
    '2026-01-02 03:04:05', '2026-01-02', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '1 day 02:03:04'""",
    "2" + ", NULL" * len(TYPES),
    r"""3, -32768, -9223372036854775808, -0.0001, 'NaN', '-Infinity', false, E'it''s\n"q" \\ tab\t',
    'ünïcødé', 'null', 'null', '{{1,2},{3,NULL}}', '{"a b","c,d",NULL,"\"q\"","NULL"}', '\x',
    'infinity', '1999-12-31 23:59:59.999999', '0001-01-01 BC', '00000000-0000-0000-0000-000000000000', '-1 mons'""",
    r"""4, 0, 0, 'NaN', 1e300, 0, true, '', '', '[]', '{}', '{}', '{}', 'abc', '2000-01-01 00:00:00+00',
    '2000-01-01', 'infinity', 'ffffffff-ffff-ffff-ffff-ffffffffffff', '0'""",
]


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def lsn_of(value: object) -> int:
    return int(LSN.parse(str(value)))


def encode_all(events: Iterator[Any]) -> list[Record]:
    """Encode, check the line framing, validate every record against the schema."""
    out: list[bytes] = []
    enc = JsonlEncoder(out.append)
    for event in events:
        if event is not None:
            enc.feed(event)
    assert enc.close() == 0, "the input ended inside a transaction"
    records = []
    for line in out:
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        rec = orjson.loads(line)
        VALIDATOR.validate(rec)
        records.append(rec)
    return records


def max_proto(conn: psycopg.Connection[Any]) -> int:
    major = server_major(conn)
    return 4 if major >= 16 else 3 if major == 15 else 2


def peek_pgoutput(conn: psycopg.Connection[Any], slot: str, proto: int, **options: str) -> list[Record]:
    args: list[str] = ["proto_version", str(proto), "publication_names", "pub", "messages", "true"]
    for k, v in options.items():
        args += [k, v]
    placeholders = ", ".join(["%s"] * len(args))
    cur = conn.execute(
        f"SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, {placeholders})",
        [slot, *args],
    )
    decoder = PgOutputDecoder(proto)
    return encode_all(decoder.decode(bytes(data), lsn_of(lsn)) for lsn, data in cur)


def peek_test_decoding(conn: psycopg.Connection[Any], slot: str, *options: str) -> list[Record]:
    """Read as bytes (force-binary), as the replication stream gives them: a message's content
    need not be valid UTF-8, which the text interface could not hand over."""
    options = ("force-binary", "1", "skip-empty-xacts", "1", *options)
    placeholders = "".join(", %s" for _ in options)
    cur = conn.execute(
        f"SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL{placeholders})",
        [slot, *options],
    )
    parser = TestDecodingParser()
    return encode_all(parser.decode(bytes(data), lsn_of(lsn)) for lsn, data in cur)


def rows(records: list[Record], table: str | None = None) -> list[Record]:
    ops = ("insert", "update", "delete")
    return [r for r in records if r["op"] in ops and (table is None or r["table"] == table)]


@pytest.fixture
def workload(db_dsn: str) -> Iterator[tuple[psycopg.Connection[Any], dict[int, dict[str, tuple[str | None, Any]]]]]:
    """Tables, a publication, a pgoutput and a test_decoding slot, and a workload. Yields the
    connection and, for each row of ``types``, the server's rendering of each column as it was
    inserted: (``::text``, ``to_json()`` parsed)."""
    conn = connect(db_dsn)
    columns = ", ".join(f"{name} {typ}" for name, (typ, _) in TYPES.items())
    conn.execute(f"CREATE TABLE types (id int PRIMARY KEY, {columns})")
    conn.execute("CREATE TABLE toasty (id int PRIMARY KEY, big text, n int)")
    conn.execute("CREATE TABLE full_t (id int, v text)")
    conn.execute("ALTER TABLE full_t REPLICA IDENTITY FULL")
    conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    slot = f"jsonl_{conn.info.dbname}"
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot + "_p"])
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot + "_t"])
    try:
        with conn.transaction():
            for values in ROWS:
                conn.execute(f"INSERT INTO types VALUES ({values})")
            rendered: dict[int, dict[str, tuple[str | None, Any]]] = {}
            names = list(TYPES)
            select = ", ".join(f"{n}::text, to_json({n})::text" for n in names)
            for row in conn.execute(f"SELECT id, {select} FROM types ORDER BY id"):
                rendered[row[0]] = {
                    n: (row[1 + 2 * i], None if row[2 + 2 * i] is None else orjson.loads(row[2 + 2 * i]))
                    for i, n in enumerate(names)
                }
            raw_bytea = dict(conn.execute("SELECT id, ba FROM types").fetchall())
            for rid, value in raw_bytea.items():
                rendered[rid]["ba_raw"] = (None, value)
        conn.execute("INSERT INTO toasty SELECT 1, string_agg(md5(i::text), '') FROM generate_series(1, 3000) i")
        conn.execute("UPDATE toasty SET n = 1")  # big is stored out of line and unchanged: not sent
        with conn.transaction():
            conn.execute("INSERT INTO full_t VALUES (1, 'a'), (2, 'b')")
            conn.execute("UPDATE full_t SET v = 'c' WHERE id = 1")
            conn.execute("DELETE FROM full_t WHERE id = 2")
            conn.execute("SELECT pg_logical_emit_message(true, 'pfx', 'in a transaction')")
        conn.execute("SELECT pg_logical_emit_message(false, 'pfx', '\\xff00'::bytea)")
        with conn.transaction():
            conn.execute("UPDATE types SET id = 10 WHERE id = 1")
            conn.execute("DELETE FROM types WHERE id = 2")
        conn.execute("TRUNCATE full_t")
        try:
            with conn.transaction():
                conn.execute("INSERT INTO full_t VALUES (99, 'rolled back')")
                raise RuntimeError
        except RuntimeError:
            pass
        yield conn, rendered
    finally:
        for suffix in ("_p", "_t"):
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot + suffix])
        conn.close()


def check_value(column: str, value: Any, text: str | None, as_json: Any, raw: Any) -> None:
    how = TYPES[column][1]
    if text is None:
        assert value is None, column
    elif how == "text":
        assert value == text, column
    elif how == "json":
        assert value == as_json, column
    elif how == "float":
        if text in ("NaN", "Infinity", "-Infinity"):
            assert value == text, column
        else:
            assert isinstance(value, float | int) and not isinstance(value, bool), column
            assert math.isclose(value, float(text), rel_tol=1e-6), column
    else:
        assert base64.b64decode(value) == bytes(raw), column


def check_types_rows(records: list[Record], rendered: dict[int, dict[str, tuple[str | None, Any]]]) -> None:
    inserts = [r for r in rows(records, "types") if r["op"] == "insert"]
    assert [r["new"]["id"] for r in inserts] == sorted(rendered)
    for rec in inserts:
        server = rendered[rec["new"]["id"]]
        assert list(rec["new"]) == ["id", *TYPES]
        for column in TYPES:
            text, as_json = server[column]
            check_value(column, rec["new"][column], text, as_json, server["ba_raw"][1])
        # JSON null and SQL NULL stay apart
        jnulls = {c for c in ("js", "jb") if server[c][0] == "null"}
        assert set(rec.get("json_nulls", [])) == jnulls


def check_common(records: list[Record], plugin: str) -> None:
    """What both plugins must agree on, whatever they send. (test_decoding does not say whether an
    old image is a key or a whole row: its old images are all "key", see the parser.)"""
    by_table = {t: rows(records, t) for t in ("types", "toasty", "full_t")}
    assert [r["op"] for r in by_table["types"]] == ["insert"] * 4 + ["update", "delete"]
    upd, dele = by_table["types"][4:]
    assert upd["new"]["id"] == 10 and upd["old"] is not None and upd["old"]["id"] == 1 and upd["old_kind"] == "key"
    assert dele["old"] is not None and dele["old"]["id"] == 2
    toast_ins, toast_upd = by_table["toasty"]
    assert len(toast_ins["new"]["big"]) == 96000 and toast_ins["unchanged_toast"] == []
    assert toast_upd["new"] == {"id": 1, "n": 1} and toast_upd["unchanged_toast"] == ["big"]
    full = by_table["full_t"]
    assert [r["op"] for r in full] == ["insert", "insert", "update", "delete"]
    assert full[2]["old"] == {"id": 1, "v": "a"}
    assert full[2]["old_kind"] == ("full" if plugin == "pgoutput" else "key")
    assert full[3]["old"] == {"id": 2, "v": "b"}
    assert all(r["new"]["v"] != "rolled back" for r in full if "new" in r)
    messages = [r for r in records if r["op"] == "message"]
    assert [(m["transactional"], m["content"], m["content_encoding"]) for m in messages] == [
        (True, "in a transaction", "utf8"),
        (False, "/wA=", "base64"),
    ]
    truncates = [r for r in records if r["op"] == "truncate"]
    assert len(truncates) == 1 and truncates[0]["tables"] == [{"schema": "public", "table": "full_t"}]
    # every change sits between its begin and commit and carries that transaction's commit LSN
    current: Record | None = None
    for rec in records:
        if rec["op"] == "begin":
            current = rec
        elif rec["op"] == "commit":
            assert current is not None and rec["commit_lsn"] == current["commit_lsn"]
            current = None
        elif rec["op"] in ("insert", "update", "delete", "truncate") or (
            rec["op"] == "message" and rec["transactional"]
        ):
            assert current is not None
            assert rec["commit_lsn"] == current["commit_lsn"] and rec["xid"] == current["xid"]
    commits = [LSN.parse(r["commit_lsn"]) for r in records if r["op"] == "commit"]
    assert commits == sorted(commits) and len(commits) == 6


def test_pgoutput_text(workload: tuple[psycopg.Connection[Any], Any]) -> None:
    conn, rendered = workload
    records = peek_pgoutput(conn, f"jsonl_{conn.info.dbname}_p", max_proto(conn))
    check_types_rows(records, rendered)
    check_common(records, "pgoutput")
    relations = {r["table"]: r for r in records if r["op"] == "relation"}
    assert relations["types"]["key"] == ["id"] and relations["full_t"]["replica_identity"] == "full"
    assert [c["type_oid"] for c in relations["types"]["columns"]][:3] == [23, 21, 20]


def test_pgoutput_binary_gives_the_same_values(workload: tuple[psycopg.Connection[Any], Any]) -> None:
    conn, rendered = workload
    slot = f"jsonl_{conn.info.dbname}_p"
    text = peek_pgoutput(conn, slot, max_proto(conn))
    binary = peek_pgoutput(conn, slot, max_proto(conn), binary="true")
    check_types_rows(binary, rendered)
    assert [r.get("new") for r in rows(binary)] == [r.get("new") for r in rows(text)]


def test_test_decoding(workload: tuple[psycopg.Connection[Any], Any]) -> None:
    conn, rendered = workload
    slot = f"jsonl_{conn.info.dbname}_t"
    records = peek_test_decoding(conn, slot, "include-timestamp", "1")
    check_types_rows(records, rendered)
    check_common(records, "test_decoding")
    assert all(r["commit_time"] is not None for r in rows(records))
    # the same rows as pgoutput gives, value for value
    pg = peek_pgoutput(conn, f"jsonl_{conn.info.dbname}_p", max_proto(conn))
    assert [(r["op"], r["table"], r.get("new")) for r in rows(records)] == [
        (r["op"], r["table"], r.get("new")) for r in rows(pg)
    ]
    assert [r["xid"] for r in rows(records)] == [r["xid"] for r in rows(pg)]
    # test_decoding's commit LSN is the position reported with its COMMIT line: the end of the
    # commit record, which pgoutput calls end_lsn
    td_commits = [r["commit_lsn"] for r in records if r["op"] == "commit"]
    assert td_commits == [r["end_lsn"] for r in pg if r["op"] == "commit"]


def test_two_phase_and_streaming(db_dsn: str) -> None:
    conn = connect(db_dsn)
    if max_proto(conn) < 3:
        pytest.skip("two-phase decoding needs PostgreSQL 15")
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    slot = f"jsonl2_{conn.info.dbname}"
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", [slot + "_p"])
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding', false, true)", [slot + "_t"])
    try:
        for gid, outcome in (("g1", "COMMIT"), ("g2", "ROLLBACK")):
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (%s, %s)", [1 if gid == "g1" else 2, gid])
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
            conn.execute(f"{outcome} PREPARED '{gid}'")
        with conn.transaction():
            conn.execute("INSERT INTO t SELECT i, repeat('x', 100) FROM generate_series(100, 3100) i")
        conn.execute("SET logical_decoding_work_mem = '64kB'")
        records = peek_pgoutput(conn, slot + "_p", max_proto(conn), two_phase="on", streaming="on")
        ops = [r["op"] for r in records]
        assert ops[:4] == ["begin_prepare", "relation", "insert", "prepare"]
        assert ops[4:8] == ["commit_prepared", "begin_prepare", "insert", "prepare"]
        assert ops[8] == "rollback_prepared"
        first, second = records[2], records[6]
        assert (
            first["gid"] == "g1" and first["commit_lsn"] is None and first["prepare_lsn"] == records[0]["prepare_lsn"]
        )
        assert second["gid"] == "g2" and records[8]["gid"] == "g2"
        assert "stream_start" in ops and ops[-1] == "stream_commit"
        streamed = [r for r in records[9:] if r["op"] == "insert"]
        assert len(streamed) == 3001 and all(r["commit_lsn"] is None and r["xid"] is not None for r in streamed)

        td = peek_test_decoding(conn, slot + "_t")
        td_ops = [r["op"] for r in td]
        assert "begin_prepare" in td_ops and "commit_prepared" in td_ops and "rollback_prepared" in td_ops
        prepared_rows = [r for r in rows(td) if "gid" in r]
        assert [r["new"]["v"] for r in prepared_rows] == ["g1", "g2"]
    finally:
        conn.execute("RESET logical_decoding_work_mem")
        for suffix in ("_p", "_t"):
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot + suffix])
        conn.close()


def _golden_files() -> list[Path]:
    return sorted(GOLDEN.glob("pg*/*.jsonl")) if GOLDEN.is_dir() else []


@pytest.mark.skipif(not _golden_files(), reason="no golden files captured yet")
@pytest.mark.parametrize("path", _golden_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_files_encode_to_valid_records(path: Path) -> None:
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    meta = lines[0].get("meta", {}) if lines else {}
    messages = [m for m in lines if "data" in m]
    events: Iterator[Any]
    if path.name.endswith(".pgoutput.jsonl"):
        decoder = PgOutputDecoder(int(meta.get("proto_version", 1)))
        events = (decoder.decode(bytes.fromhex(m["data"]), lsn_of(m["lsn"])) for m in messages)
    else:
        parser = TestDecodingParser()
        events = (parser.decode(m["data"], lsn_of(m["lsn"])) for m in messages)
    out: list[bytes] = []
    enc = JsonlEncoder(out.append)
    for event in events:
        if event is not None:
            enc.feed(event)
    assert enc.close() == 0, "a captured case ended inside a transaction"
    records = [orjson.loads(line) for line in out]
    for rec in records:
        VALIDATOR.validate(rec)
    if messages:
        assert records, "a golden file with messages gave no records"
    # every table a row names was described by a relation record before it
    described: set[tuple[str, str]] = set()
    for rec in records:
        if rec["op"] == "relation":
            described.add((rec["schema"], rec["table"]))
        elif rec["op"] in ("insert", "update", "delete"):
            assert (rec["schema"], rec["table"]) in described
