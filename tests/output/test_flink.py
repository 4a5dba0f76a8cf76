"""A real Debezium consumer: Flink SQL (``'format' = 'debezium-json'``) reads `pgrecv start --format
debezium` output and its replayed changelog is exactly the source tables.

Flink comes from the test extra's ``apache-flink-libraries`` (Flink's own jars: the filesystem
connector and flink-json are in its lib/); tests/flink/Replay.java runs the SQL on a local
MiniCluster with the machine's Java 17 and prints every changelog row (+I/-U/+U/-D) as JSON.
(The ``apache-flink`` Python package itself pins pyarrow < 17 through apache-beam, which
breaks Spark's ``toArrow`` in the same environment.)

Flink's filesystem source reads every file under its path as rows of one table and offers no
metadata to tell tables apart, so each table goes to its own directory (``--table``, one slot each).
"""

from __future__ import annotations

import base64
import importlib.util
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from pgrecv.output.debezium_values import UNAVAILABLE
from tests.conftest import SHORT_JVM
from tests.util import err, pgrecv

REPLAY = Path(__file__).parent.parent / "flink" / "Replay.java"
JAVA_OPENS = ["--add-opens", "java.base/java.util=ALL-UNNAMED", "--add-opens", "java.base/java.lang=ALL-UNNAMED"]

SETUP = """
CREATE TABLE t_full (
    id int PRIMARY KEY, i2 smallint, i8 bigint, num numeric, num_p numeric(20,5), txt text, flag boolean,
    ts timestamp, ts3 timestamp(3), tstz timestamptz, d date, j jsonb, js json, b bytea, ia int[], ta text[], u uuid
);
ALTER TABLE t_full REPLICA IDENTITY FULL;
CREATE TABLE t_toast (id int PRIMARY KEY, n int, big text, bb bytea);
ALTER TABLE t_toast ALTER COLUMN big SET STORAGE EXTERNAL;
ALTER TABLE t_toast ALTER COLUMN bb SET STORAGE EXTERNAL;
ALTER TABLE t_toast REPLICA IDENTITY FULL;
CREATE TABLE t_dflt (id int PRIMARY KEY, v text);
CREATE TABLE t_dflt_upd (id int PRIMARY KEY, v text);
CREATE PUBLICATION pub FOR ALL TABLES;
"""
SLOTS = {"t_full": "s_full", "t_toast": "s_toast", "t_dflt": "s_dflt", "t_dflt_upd": "s_upd"}

WORKLOAD = [
    """INSERT INTO t_full VALUES
        (1, 12, 5678901234, 3.14159, 12345.6789, 'hello', true, '2026-01-02 03:04:05.123456',
         '2026-01-02 03:04:05.123', '2026-01-02 03:04:05.123+05:30', '2026-01-02', '{"a": [1, 2.5, "x"]}',
         '{"k":  "v"}', '\\xdeadbeef', '{1,NULL,3}', ARRAY['a', NULL, 'é "q"'], 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'),
        (2, -32768, -9223372036854775808, -99999999999999999999999.000000000000001, -0.00001, E'line\\nbreak',
         false, '1969-12-31 23:59:59.999999', '0044-03-15 12:00:00 BC', '1999-12-31 23:59:59.5+00',
         '1900-02-28', '[]', 'null', '\\x', '{}', '{}', '00000000-0000-0000-0000-000000000000'),
        (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
    """UPDATE t_full SET txt = 'updated', num = 'NaN', ia = '{9}' WHERE id = 1;
       UPDATE t_full SET id = 30, i2 = 7 WHERE id = 3""",
    """INSERT INTO t_full (id, txt) VALUES (4, 'short-lived'), (5, 'stays');
       DELETE FROM t_full WHERE id = 4;
       UPDATE t_full SET b = '\\x00ff', tstz = '2026-06-30 23:59:59.999999+00', j = '{"z": null}' WHERE id = 2""",
    # TOASTed values (incompressible, stored out of line), then updates that leave them unchanged
    """INSERT INTO t_toast SELECT i, 0, (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300)),
              convert_to((SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 100)), 'UTF8')
       FROM generate_series(1, 3) i""",
    "UPDATE t_toast SET n = 1",
    "UPDATE t_toast SET big = 'now short' WHERE id = 2",
    "UPDATE t_toast SET n = n + 1 WHERE id <> 2; UPDATE t_toast SET id = 30 WHERE id = 3",
    "INSERT INTO t_dflt VALUES (1, 'a'), (2, 'b'), (3, 'c'); DELETE FROM t_dflt WHERE id = 2",
    "INSERT INTO t_dflt_upd VALUES (1, 'a'); UPDATE t_dflt_upd SET v = 'b' WHERE id = 1",
]

# Flink columns for each table, and the PostgreSQL expressions giving what Flink prints for them
FLINK = {
    "t_full": [
        ("id", "INT", "id"),
        ("i2", "SMALLINT", "i2"),
        ("i8", "BIGINT", "i8"),
        ("num", "STRING", "num::text"),  # decimal.handling.mode=string: any numeric, exactly
        ("num_p", "DECIMAL(20, 5)", "num_p::text"),
        ("txt", "STRING", "txt"),
        ("flag", "BOOLEAN", "flag"),
        ("ts", "BIGINT", "(extract(epoch FROM ts) * 1000000)::bigint"),  # MicroTimestamp
        ("ts3", "BIGINT", "(extract(epoch FROM ts3) * 1000)::bigint"),  # Timestamp (ms)
        ("tstz", "TIMESTAMP_LTZ(6)", "tstz"),  # ZonedTimestamp, ISO 8601 in UTC
        ("d", "INT", "d - date '1970-01-01'"),  # Date (days)
        ("j", "STRING", "j::text"),
        ("js", "STRING", "js::text"),
        ("b", "BYTES", "b"),
        ("ia", "ARRAY<INT>", "ia"),
        ("ta", "ARRAY<STRING>", "ta"),
        ("u", "STRING", "u::text"),
    ],
    "t_toast": [("id", "INT", "id"), ("n", "INT", "n"), ("big", "STRING", "big"), ("bb", "BYTES", "bb")],
    "t_dflt": [("id", "INT", "id"), ("v", "STRING", "v")],
    "t_dflt_upd": [("id", "INT", "id"), ("v", "STRING", "v")],
}


def _flink_lib() -> Path:
    spec = importlib.util.find_spec("pyflink")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("Flink's jars are missing: pip install -e '.[test]' (apache-flink-libraries)")
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    assert (lib / "flink-json-2.3.0.jar").exists() or any(lib.glob("flink-json-*.jar")), lib
    return lib


def _instant(value: datetime) -> str:
    """java.time.Instant.toString(): what Flink prints for TIMESTAMP_LTZ."""
    utc = value.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    us = utc.microsecond
    if us:
        text += f".{us // 1000:03d}" if us % 1000 == 0 else f".{us:06d}"
    return text + "Z"


def _flink_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return _instant(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def _expected(conn: psycopg.Connection[Any], table: str) -> dict[int, list[Any]]:
    exprs = ", ".join(expr for _, _, expr in FLINK[table])
    rows = conn.execute(f"SELECT {exprs} FROM {table}").fetchall()
    return {row[0]: [_flink_value(v) for v in row] for row in rows}


def _script(dirs: dict[str, Path]) -> str:
    parts = []
    for table, cols in FLINK.items():
        columns = ", ".join(f"`{name}` {kind}" for name, kind, _ in cols)
        options = {
            "connector": "filesystem",
            "path": str(dirs[table]),
            "format": "debezium-json",
            "debezium-json.timestamp-format.standard": "ISO-8601",
        }
        if table == "t_full":
            options["debezium-json.schema-include"] = "true"
        with_ = ", ".join(f"'{k}' = '{v}'" for k, v in options.items())
        parts.append(f"CREATE TABLE {table} ({columns}) WITH ({with_})")
    parts += [f"-- query {table}\nSELECT * FROM {table}" for table in FLINK]
    return "\n;\n".join(parts) + "\n;\n"


def _replay(rows: list[dict[str, Any]], strict: bool) -> dict[int, list[Any]]:
    """Materialise a changelog by key, as a Flink sink with a primary key would. ``strict``: every
    retraction (-U/-D) must carry the exact row it retracts (REPLICA IDENTITY FULL)."""
    state: dict[int, list[Any]] = {}
    for r in rows:
        row, key = r["row"], r["row"][0]
        if r["kind"] == "+I":
            assert key not in state, r
            state[key] = row
        elif r["kind"] in ("-U", "-D"):
            assert key in state, r
            if strict:
                assert state[key] == row, r
            del state[key]
        else:
            assert r["kind"] == "+U", r
            state[key] = row
    return state


def test_flink_reads_debezium_output(db_dsn: str, db_conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    lib = _flink_lib()
    java = shutil.which("java")
    if java is None or shutil.which("javac") is None:  # java runs Replay.java from source: a JDK
        pytest.fail("Flink's test needs a Java 17 JDK (java and javac): apt-get install openjdk-17-jdk-headless")
    db_conn.execute(SETUP)
    for slot in SLOTS.values():
        db_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    for statement in WORKLOAD:
        with db_conn.transaction():
            db_conn.execute(statement)
    dirs = {table: tmp_path / table for table in FLINK}
    for table, slot in SLOTS.items():
        fmt = "debezium-schema" if table == "t_full" else "debezium"
        proc = pgrecv(
            "start", "-d", db_dsn, "-S", slot, "--output-dir", str(dirs[table]), "--format", fmt,
            "--until-caught-up", "--table", f"public.{table}",
        )  # fmt: skip
        assert proc.returncode == 0, err(proc)
        assert list(dirs[table].glob("*.debezium.jsonl")), f"no output for {table}"
    script = tmp_path / "replay.sql"
    script.write_text(_script(dirs))
    started = time.monotonic()
    run = subprocess.run(
        [java, *SHORT_JVM.split(), *JAVA_OPENS, "-cp", f"{lib}/*", str(REPLAY), str(script)],
        capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    flink_seconds = time.monotonic() - started
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in FLINK}
    errors: dict[str, str] = {}
    for line in run.stdout.splitlines():
        if not line.startswith(b'{"query":'):
            continue  # Flink's own log lines
        rec = orjson.loads(line)
        if "error" in rec:
            errors[rec["query"]] = rec["error"]
        else:
            results[rec["query"]].append(rec)
    print(f"Flink ran 4 queries in {flink_seconds:.1f} s")

    # inserts, updates, deletes and a key change, many types: exactly SELECT * (FULL identity)
    assert "t_full" not in errors, errors.get("t_full")
    kinds = [r["kind"] for r in results["t_full"]]
    assert kinds.count("-U") == 3 and kinds.count("-D") == 1, kinds
    assert _replay(results["t_full"], strict=True) == _expected(db_conn, "t_full")

    # unchanged TOAST under REPLICA IDENTITY FULL: the server sent the value in the old row, and
    # pgrecv's after carries it (issue 60): every retraction is the row Flink holds, no placeholder
    assert "t_toast" not in errors, errors.get("t_toast")
    toast = _replay(results["t_toast"], strict=True)
    expected = _expected(db_conn, "t_toast")
    assert toast == expected and sorted(expected) == [1, 2, 30]
    assert len(expected[1][2]) == 9600 and expected[2][:3] == [2, 1, "now short"] and expected[30][1] == 2
    assert [r["kind"] for r in results["t_toast"]].count("+U") == 7
    marks = (UNAVAILABLE, base64.b64encode(UNAVAILABLE.encode()).decode())  # text, bytea
    placeholders = [v for r in results["t_toast"] for v in r["row"] if isinstance(v, str) and v.startswith(marks)]
    assert placeholders == [], len(placeholders)

    # default identity: deletes carry only the key (the rest null); replayed by key they are right
    assert "t_dflt" not in errors, errors.get("t_dflt")
    deletes = [r["row"] for r in results["t_dflt"] if r["kind"] == "-D"]
    assert deletes == [[2, None]]
    assert _replay(results["t_dflt"], strict=False) == _expected(db_conn, "t_dflt")

    # default identity and an UPDATE: no "before", which Flink refuses (it needs REPLICA IDENTITY FULL)
    assert "REPLICA IDENTITY" in errors.get("t_dflt_upd", ""), (errors, results["t_dflt_upd"])
