"""`--format debezium` through the real command line: snapshot, start (files, resume), peek, refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from pgrecv.errors import ExitCode, InputError
from tests.util import err, pgrecv


def _envelopes(directory: Path) -> list[dict[str, Any]]:
    """Every envelope of the finished files, in name (= stream) order; the manifest is not one."""
    out = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or path.name.endswith(".manifest.json"):
            continue
        assert path.name.endswith(".debezium.jsonl") or ".snapshot-" in path.name, path.name
        out += [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return out


def _apply(envelopes: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    state: dict[int, dict[str, Any]] = {}
    for e in envelopes:
        if e["op"] in ("r", "c", "u"):
            if e["op"] == "u" and e["before"] is not None:
                state.pop(e["before"]["id"], None)
            state[e["after"]["id"]] = e["after"]
        elif e["op"] == "d":
            del state[e["before"]["id"]]
    return state


def test_snapshot_then_start_and_resume(db_dsn: str, db_conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    db_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text, at timestamptz, n numeric)")
    db_conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    db_conn.execute("INSERT INTO t SELECT i, 'old ' || i, '2026-01-01 00:00+00', i / 3.0 FROM generate_series(1, 50) i")
    out = tmp_path / "out"
    proc = pgrecv("snapshot", "-d", db_dsn, "-S", "s", "--output-dir", str(out), "--format", "debezium")
    assert proc.returncode == 0, err(proc)
    snap = _envelopes(out)
    assert len(snap) == 50 and {e["op"] for e in snap} == {"r"}
    assert snap[0]["source"]["snapshot"] == "true" and snap[0]["source"]["db"] == db_conn.info.dbname
    assert snap[0]["after"]["at"] == "2026-01-01T00:00:00Z" and snap[2]["after"]["n"] == "1.00000000000000000000"
    # with worker processes (--jobs 2) the same rows
    other = tmp_path / "jobs"
    proc = pgrecv("snapshot", "-d", db_dsn, "-S", "s2", "--output-dir", str(other), "--format", "debezium", "-j", "2")
    assert proc.returncode == 0, err(proc)
    assert sorted(e["after"]["id"] for e in _envelopes(other)) == sorted(e["after"]["id"] for e in snap)
    db_conn.execute("SELECT pg_drop_replication_slot('s2')")

    def run() -> None:
        proc = pgrecv(
            "start", "-d", db_dsn, "-S", "s", "--output-dir", str(out), "--format", "debezium", "--until-caught-up"
        )
        assert proc.returncode == 0, err(proc)

    db_conn.execute("UPDATE t SET v = 'new' WHERE id <= 10")
    db_conn.execute("DELETE FROM t WHERE id > 45")
    run()
    first = _envelopes(out)
    db_conn.execute("INSERT INTO t VALUES (100, 'later', NULL, NULL)")
    db_conn.execute("UPDATE t SET id = 101 WHERE id = 1")
    run()  # resumes from the directory's own state: nothing is written twice
    everything = _envelopes(out)
    assert everything[: len(first)] == first
    changes = [e for e in everything if e["op"] != "r"]
    positions = [(e["source"]["sequence"], e["source"]["lsn"], e["op"]) for e in changes]
    assert len(positions) == len(set(positions)) == 10 + 5 + 1 + 2
    # the key change, under default identity: a delete of the old key (the rest null), a create
    assert [e["op"] for e in changes[-3:]] == ["c", "d", "c"]
    assert changes[-2]["before"] == {"id": 1, "v": None, "at": None, "n": None}
    assert changes[-1]["after"]["id"] == 101
    rows = db_conn.execute("SELECT id, v FROM t").fetchall()
    assert {k: v["v"] for k, v in _apply(everything).items()} == dict(rows)


def test_peek_writes_envelopes_with_schemas_to_stdout(db_dsn: str, db_conn: psycopg.Connection[Any]) -> None:
    db_conn.execute("CREATE TABLE p (id bigint PRIMARY KEY, d date)")
    db_conn.execute("CREATE PUBLICATION pub FOR TABLE p")
    db_conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    db_conn.execute("INSERT INTO p VALUES (1, '1970-01-11')")
    db_conn.execute("SELECT pg_logical_emit_message(false, 'pfx', 'hello')")
    # a commit flushes the WAL: the SQL interface reads only up to the flush, and a
    # non-transactional message alone waits for the WAL writer (a peek right after it can miss it)
    db_conn.execute("CREATE TABLE flush_wal ()")
    proc = pgrecv("peek", "-d", db_dsn, "-S", "s", "--format", "debezium-schema")
    assert proc.returncode == 0, err(proc)
    docs = [orjson.loads(line) for line in proc.stdout.splitlines()]
    assert [d["payload"]["op"] for d in docs] == ["c", "m"]
    assert docs[0]["payload"]["after"] == {"id": 1, "d": 10}
    fields = next(f for f in docs[0]["schema"]["fields"] if f["field"] == "after")["fields"]
    assert fields[1] == {"type": "int32", "name": "io.debezium.time.Date", "version": 1, "optional": True, "field": "d"}
    assert docs[1]["payload"]["message"] == {"prefix": "pfx", "content": "aGVsbG8="}


def test_two_phase_is_refused(db_dsn: str) -> None:
    proc = pgrecv("start", "-d", db_dsn, "-S", "s", "--format", "debezium", "--two-phase")
    assert proc.returncode == ExitCode.USAGE
    assert err(proc).strip().splitlines() == [
        "pgrecv: error: --format debezium writes committed rows only: it cannot go with --two-phase"
    ]


def test_spark_apply_refuses_debezium_files(tmp_path: Path, spark: Any) -> None:
    """spark-apply reads pgrecv's JSONL only; a directory of envelopes is refused, not half-applied."""
    pytest.importorskip("pyarrow")
    from pgrecv.spark.apply import run_apply
    from pgrecv.spark.inputs import expand_sources
    from pgrecv.spark.model import ApplyConfig

    name = "0000000001000000-0000000001000000.debezium.jsonl"
    line = b'{"before":null,"after":{"id":1},"source":{"connector":"postgresql"},"op":"c","ts_ms":1}\n'
    (tmp_path / name).write_bytes(line)
    files = expand_sources([str(tmp_path)])
    assert [f.name for f in files] == [name]  # it is not skipped silently
    with pytest.raises(InputError, match=f"{name}:1: "):
        run_apply(ApplyConfig((str(tmp_path),), tmp_path / "lake", fmt="delta"), spark=spark)
    assert not (tmp_path / "lake" / "s.t").exists()


def test_peek_consume_stops_before_a_prepared_transaction(db_dsn: str, db_conn: psycopg.Connection[Any]) -> None:
    """Debezium output holds prepared rows until COMMIT PREPARED; consuming past the PREPARE would
    lose them, so the slot stays where it was."""
    db_conn.execute("CREATE TABLE q (id int PRIMARY KEY)")
    db_conn.execute("CREATE PUBLICATION pub FOR TABLE q")
    db_conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, true)")  # two-phase
    db_conn.execute("INSERT INTO q VALUES (1)")
    db_conn.execute("BEGIN")
    db_conn.execute("INSERT INTO q VALUES (2)")
    db_conn.execute("PREPARE TRANSACTION 'g'")
    before = db_conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 's'").fetchone()
    proc = pgrecv("peek", "-d", db_dsn, "-S", "s", "--format", "debezium", "--consume")
    assert proc.returncode == ExitCode.USAGE, err(proc)
    assert "prepared but not yet committed" in err(proc)
    after = db_conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 's'").fetchone()
    assert after == before
    db_conn.execute("COMMIT PREPARED 'g'")
    proc = pgrecv("peek", "-d", db_dsn, "-S", "s", "--format", "debezium", "--consume")
    assert proc.returncode == 0, err(proc)
    assert [orjson.loads(x)["after"]["id"] for x in proc.stdout.splitlines()] == [1, 2]
