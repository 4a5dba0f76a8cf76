"""``pgrecv verify`` against real servers and real lakes: an exact lake is equal, also while a
workload writes to the source, and values spark-apply stored as NULL (``--bad-values null``)
compare as NULL; rows deleted, changed and added behind pgrecv's back, a table removed, and
changes not yet applied are each reported by key."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pgrecv.errors import ExitCode
from pgrecv.spark.model import table_dir_name
from tests.conftest import ApplyHere, S3Server
from tests.spark.connector_runner import Runner
from tests.util import err, pgrecv, pgrecv_here, sql

pytest.importorskip("pyspark")
# verify and spark-apply run in this process on the session's SparkSession; one run is a process of its own
pytestmark = pytest.mark.usefixtures("spark")
FAST = ("--conf", "spark.sql.shuffle.partitions=2", "--master", "local[2]")

SCHEMA = """
CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10,2), nu numeric, f float8, r real, ts timestamptz,
                tn timestamp, d date, flag bool, raw bytea, tags text[], ids int[], j jsonb, c char(4), u uuid);
CREATE TABLE b (id bigint PRIMARY KEY, v text);
CREATE TABLE "odd name" (k1 text, k2 int, v numeric(6,1), PRIMARY KEY (k1, k2));
CREATE TABLE p (id int PRIMARY KEY, n numeric(5,2), d date);
CREATE PUBLICATION pub FOR ALL TABLES;
"""
ROW = (
    "INSERT INTO a SELECT i, 'v' || i, i * 1.25, round(i / 7.0, 6), i / 3.0, i / 9.0, "
    "timestamptz '2024-02-29 12:00:00+02' + i * interval '1 second', timestamp '2020-01-01' - i * interval '1 day', "
    "date '2000-01-01' + i, i %% 2 = 0, decode(lpad(to_hex(i), 8, '0'), 'hex'), ARRAY['x', NULL, 'y' || i], "
    "ARRAY[i, -i], jsonb_build_object('k', i, 'l', ARRAY[1, 2]), 'c' || (i %% 10), gen_random_uuid() "
    "FROM generate_series(%s::int, %s::int) i"
)


def _verify(dsn: str, src: Path, lake: Path | str, fmt: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    """``pgrecv verify ... --json`` in this process, on the test session's SparkSession (no JVM start per run)."""
    proc = pgrecv_here(
        "verify", "-d", dsn, "--slot", "s", "--target", str(lake), "--format", fmt, "--source", str(src),
        "--json", *FAST, *extra,
    )  # fmt: skip
    doc = orjson.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, doc, err(proc)


def _tables(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["table"]: t for t in doc["tables"]}


def _tamper_parquet(path: Path, change: Callable[[pa.Table], pa.Table]) -> None:
    """Rewrites the current version's files behind pgrecv's back (a new inode: its files are hard links)."""
    for f in sorted((path / "current").glob("part-*.parquet")):
        before = pq.read_table(f)
        after = change(before)
        if after.equals(before):
            continue
        tmp = f.with_name(f".tamper-{f.name}")
        pq.write_table(after, tmp)
        os.replace(tmp, f)
        return


def _tamper(lake: Path, fmt: str, table: str, what: str) -> None:
    path = lake / table_dir_name("public", table)
    if fmt == "delta":
        import deltalake

        dt = deltalake.DeltaTable(str(path))
        if what == "delete 5":
            dt.delete("id = 5")
        elif what == "change 77":
            dt.update({"v": "'tampered'"}, predicate="id = 77")
        else:
            whole = pa.schema(dt.schema().to_arrow())  # (deltalake 1.x gives arro3's schema)
            schema = pa.schema([whole.field(n) for n in ("id", "v")])
            deltalake.write_deltalake(str(path), pa.table({"id": [9999], "v": ["extra"]}, schema=schema), mode="append")
        return
    if what == "delete 5":
        _tamper_parquet(path, lambda t: t.filter(pc.not_equal(t["id"], 5)))
    elif what == "change 77":

        def change(t: pa.Table) -> pa.Table:
            i = t.schema.get_field_index("v")
            return t.set_column(i, "v", pc.if_else(pc.equal(t["id"], 77), pa.scalar("tampered"), t["v"]))

        _tamper_parquet(path, change)
    else:

        def add(t: pa.Table) -> pa.Table:
            extra = pa.table({"id": [9999], "v": ["extra"]}).cast(t.schema)
            return pa.concat_tables([t, extra])

        _tamper_parquet(path, add)


def _writer(dsn: str, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            i = 0
            while not stop.wait(0.005):  # a steady OLTP trickle, not a flood
                i += 1
                conn.execute("UPDATE b SET v = %s WHERE id = %s", (f"w{i}", i % 50 + 1))
                upsert = "INSERT INTO b VALUES (%s, 'new') ON CONFLICT (id) DO UPDATE SET v = 'again'"
                conn.execute(upsert, (10000 + i,))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_verify_finds_each_difference_by_key(db_dsn: str, tmp_path: Path, server_fmt: str) -> None:
    sql(db_dsn, SCHEMA)
    sql(db_dsn, ROW, (1, 200))
    sql(db_dsn, "INSERT INTO b SELECT i, 'b' || i FROM generate_series(1, 300) i")
    sql(db_dsn, """INSERT INTO "odd name" SELECT 'k' || (i % 7), i, i / 10.0 FROM generate_series(1, 50) i""")
    sql(db_dsn, "INSERT INTO p VALUES (1, 'NaN', 'infinity'), (2, 1.5, '2020-01-01')")  # the lake cannot hold row 1's
    src, lake = tmp_path / "cdc", tmp_path / "lake"
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "s", "--output-dir", str(src))
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, ROW.replace("INSERT INTO a", "INSERT INTO a") + " ON CONFLICT (id) DO NOTHING", (201, 220))
    sql(db_dsn, "UPDATE a SET v = NULL, nu = 1e-12, f = 'NaN', ts = 'infinity' WHERE id = 2")
    sql(db_dsn, "DELETE FROM b WHERE id > 290")

    code, doc, text = _verify(db_dsn, src, lake, server_fmt)  # a --target that is not there: one line
    assert code == ExitCode.USAGE and text.count("\n") == 1 and "--target" in text, text
    proc = pgrecv("start", "-d", db_dsn, "--slot", "s", "--output-dir", str(src), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    null = ("--bad-values", "null")  # p's NaN and infinity are stored as NULL
    proc = pgrecv_here("spark-apply", str(src), "--target", str(lake), "--format", server_fmt, *null, *FAST)
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, "UPDATE a SET v = 'later' WHERE id = 3")
    sql(db_dsn, "DELETE FROM a WHERE id = 4")
    sql(db_dsn, ROW, (1000, 1000))
    # the lake as it is, with changes it has not applied: each named by key, the lag said
    code, doc, text = _verify(db_dsn, src, lake, server_fmt, "--no-catch-up")
    assert code == ExitCode.DIFFERENT, text
    a = _tables(doc)["public.a"]
    assert (a["status"], a["missing_keys"], a["extra_keys"]) == ("different", ["id=1000"], ["id=4"]), a
    assert a["changed_rows"] == [{"key": "id=3", "columns": ["v"]}], a
    assert a["not_compared"] == [] and "lag" in a["note"], a
    assert _tables(doc)["public.b"]["status"] == "equal" and _tables(doc)["public.odd name"]["status"] == "equal"
    # without the apply's --bad-values, the values it stored as NULL are differences, by key and column
    assert _tables(doc)["public.p"]["changed_rows"] == [{"key": "id=1", "columns": ["n", "d"]}], doc

    # caught up to the snapshot while a workload writes on: exact, so equal
    stop = threading.Event()
    writer = _writer(db_dsn, stop)
    try:
        code, doc, text = _verify(db_dsn, src, lake, server_fmt, *null)
    finally:
        stop.set()
        writer.join()
    assert code == 0, (text, doc)
    assert doc["equal"] and doc["caught_up"] and len(doc["tables"]) == 4, doc
    assert _tables(doc)["public.a"]["rows_postgres"] == 220

    # behind pgrecv's back: a row deleted, a value changed, a row added; caught up to the writer's
    # last changes, exactly those are found
    _tamper(lake, server_fmt, "a", "delete 5")
    _tamper(lake, server_fmt, "b", "change 77")
    _tamper(lake, server_fmt, "b", "extra")
    code, doc, text = _verify(db_dsn, src, lake, server_fmt, *null)
    assert code == ExitCode.DIFFERENT, text
    tables = _tables(doc)
    a, b, odd = tables["public.a"], tables["public.b"], tables["public.odd name"]
    assert (a["missing"], a["extra"], a["changed"], a["missing_keys"]) == (1, 0, 0, ["id=5"]), a
    assert (b["missing"], b["extra"], b["changed"]) == (0, 1, 1), b
    assert b["extra_keys"] == ["id=9999"] and b["changed_rows"] == [{"key": "id=77", "columns": ["v"]}], b
    assert odd["status"] == "equal" and tables["public.p"]["status"] == "equal", tables
    # a table removed: missing (the lake as it is: a catch-up's apply would rebuild it from the files)
    shutil.rmtree(lake / table_dir_name("public", "odd name"))
    sql(db_dsn, "DROP TABLE p")  # the lake keeps it: listed, no difference
    plain = pgrecv(
        "verify", "-d", db_dsn, "--slot", "s", "--target", str(lake), "--format", server_fmt, *null, *FAST, timeout=600
    )  # fmt: skip
    assert plain.returncode == ExitCode.DIFFERENT
    out = plain.stdout.decode()
    assert "public.a" in out and "1 missing (id=5)" in out and "1 changed (id=77: v)" in out, out
    assert "public.odd name  MISSING    no such table in the lake (50 rows in PostgreSQL)" in out, out
    assert any(
        line.startswith("public.p ") and "lake only  no such table in PostgreSQL" in line for line in out.splitlines()
    ), out
    assert err(plain).strip().splitlines()[-1].startswith("pgrecv: error: 3 of 4 tables differ"), err(plain)


def test_a_test_decoding_slot_with_key_given(db_dsn: str, tmp_path: Path, server_fmt: str) -> None:
    """A test_decoding slot's tables are all tables (no publication); a table whose changes name
    no key is applied, and compared, by the --key given to verify, as spark-apply's would be."""
    sql(db_dsn, "CREATE TABLE t (id int NOT NULL, v text)")  # no key: test_decoding names none
    sql(db_dsn, "INSERT INTO t SELECT i, 'v' || i FROM generate_series(1, 40) i")
    src, lake = tmp_path / "cdc", tmp_path / "lake"
    lake.mkdir()
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "s", "-P", "test_decoding", "--output-dir", str(src))
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, "UPDATE t SET v = 'x' WHERE id = 7")
    sql(db_dsn, "INSERT INTO t VALUES (41, 'new')")  # (a delete without a key cannot be applied at all)
    key = ("--key", "public.t=id")
    code, doc, text = _verify(db_dsn, src, lake, server_fmt, *key)
    assert code == 0, (text, doc)
    (t,) = doc["tables"]
    assert (t["table"], t["key"], t["rows_postgres"], t["rows_lake"]) == ("public.t", ["id"], 41, 41), t
    # without --key the catch-up's apply holds the update back, and verify says why, by whole rows
    sql(db_dsn, "UPDATE t SET v = 'y' WHERE id = 9")
    code, doc, text = _verify(db_dsn, src, lake, server_fmt)
    assert code == ExitCode.DIFFERENT, text
    (t,) = doc["tables"]
    assert (t["missing"], t["extra"]) == (1, 1) and "held back" in t["note"] and "--key" in t["note"], t
    assert t["missing_keys"] == ["(id=9, v=y)"] and t["extra_keys"] == ["(id=9, v=v9)"], t


@pytest.mark.newest_server  # the subject is the Iceberg lake; the servers' cases are the tests above
def test_an_iceberg_lake_in_each_kind_of_catalog(
    db_dsn: str, newest_tcp_dsn: str, tmp_path: Path, connector: Runner
) -> None:
    """--format iceberg, through a session with Iceberg's runtime (the connectors' runner): the
    target's Hadoop catalog, and a JDBC catalog named with --iceberg-catalog. Changes the lake has
    not applied are found by key in both, the other tables equal (Iceberg's uuid and timestamptz
    columns compare as PostgreSQL's values); caught up to the snapshot, the lake is equal."""
    from tests.spark.test_iceberg import jdbc_catalog

    sql(db_dsn, SCHEMA)
    sql(db_dsn, ROW, (1, 60))
    sql(db_dsn, "INSERT INTO b SELECT i, 'b' || i FROM generate_series(1, 80) i")
    sql(db_dsn, """INSERT INTO "odd name" SELECT 'k' || (i % 7), i, i / 10.0 FROM generate_series(1, 30) i""")
    sql(db_dsn, "INSERT INTO p VALUES (2, 1.5, '2020-01-01')")
    src, lake, other = tmp_path / "cdc", tmp_path / "lake", tmp_path / "other"
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "s", "--output-dir", str(src))
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, "UPDATE a SET v = NULL, ts = 'infinity' WHERE id = 2")
    sql(db_dsn, "DELETE FROM b WHERE id > 70")
    proc = pgrecv("start", "-d", db_dsn, "--slot", "s", "--output-dir", str(src), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    name, catalog_conf = jdbc_catalog(newest_tcp_dsn, f"file://{tmp_path / 'warehouse'}")
    in_catalog = ("--iceberg-catalog", name, *catalog_conf)
    for target, extra in ((lake, ()), (other, in_catalog)):
        proc = connector.run(["spark-apply", str(src), "--target", str(target), "--format", "iceberg", *extra], 600)
        assert proc.returncode == 0, err(proc)
    sql(db_dsn, "UPDATE a SET v = 'later' WHERE id = 3")
    sql(db_dsn, "DELETE FROM a WHERE id = 4")
    sql(db_dsn, ROW, (1000, 1000))

    def verify(target: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
        args = ["verify", "-d", db_dsn, "--slot", "s", "--target", str(target), "--format", "iceberg"]
        proc = connector.run([*args, "--source", str(src), "--json", *extra], 600)
        return proc.returncode, orjson.loads(proc.stdout) if proc.stdout.strip() else {}, err(proc)

    for target, extra in ((lake, ()), (other, in_catalog)):
        code, doc, text = verify(target, "--no-catch-up", *extra)
        assert code == ExitCode.DIFFERENT, text
        a = _tables(doc)["public.a"]
        assert (a["missing_keys"], a["extra_keys"]) == (["id=1000"], ["id=4"]), a
        assert a["changed_rows"] == [{"key": "id=3", "columns": ["v"]}] and a["not_compared"] == [], a
        assert _tables(doc)["public.b"]["status"] == "equal" and len(doc["tables"]) == 4, doc
    code, doc, text = verify(lake)  # streamed up to the snapshot, applied, compared: equal
    assert code == 0, (text, doc)
    assert doc["caught_up"] and _tables(doc)["public.a"]["rows_lake"] == 60, doc
    assert [t["status"] for t in doc["tables"]] == ["equal"] * 4, doc


@pytest.mark.newest_server  # the subject is the store; the servers' cases are the tests above
@pytest.mark.parametrize("store_fmt", ["delta", "parquet"])
def test_a_lake_on_s3(db_dsn: str, tmp_path: Path, s3_server: S3Server, s3_here: ApplyHere, store_fmt: str) -> None:
    """The change directory and the lake on the S3 server (--source and --target s3://): changes
    not applied are found by key; caught up (the slot streamed onto the store up to the snapshot,
    applied there), the lake is equal; a table whose objects were deleted behind pgrecv's back is
    missing; a prefix with nothing under it is one line."""
    sql(db_dsn, "CREATE TABLE b (id bigint PRIMARY KEY, v text); CREATE TABLE c (id int PRIMARY KEY, n numeric(6,1))")
    sql(db_dsn, "CREATE PUBLICATION pub FOR ALL TABLES")
    sql(db_dsn, "INSERT INTO b SELECT i, 'b' || i FROM generate_series(1, 90) i")
    sql(db_dsn, "INSERT INTO c SELECT i, i / 10.0 FROM generate_series(1, 30) i")
    bucket = s3_server.bucket()
    src, lake = f"s3://{bucket}/cdc", f"s3://{bucket}/lake"
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "s", "--output-dir", src, env=s3_server.env)
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, "UPDATE b SET v = NULL WHERE id = 2")
    proc = pgrecv("start", "-d", db_dsn, "--slot", "s", "--output-dir", src, "--until-caught-up", env=s3_server.env)
    assert proc.returncode == 0, err(proc)
    proc = s3_here([src], lake, "--format", store_fmt)
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, "UPDATE b SET v = 'later' WHERE id = 3")
    sql(db_dsn, "DELETE FROM b WHERE id = 4")
    sql(db_dsn, "INSERT INTO b VALUES (1000, 'new')")

    def verify(target: str, *extra: str) -> tuple[int, dict[str, Any], str]:
        args = ["verify", "-d", db_dsn, "--slot", "s", "--target", target, "--format", store_fmt, "--json"]
        proc = pgrecv_here(*args, "--source", src, *extra, env=s3_server.env)
        return proc.returncode, orjson.loads(proc.stdout) if proc.stdout.strip() else {}, err(proc)

    code, doc, text = verify(lake, "--no-catch-up")
    assert code == ExitCode.DIFFERENT, text
    b = _tables(doc)["public.b"]
    assert (b["missing_keys"], b["extra_keys"]) == (["id=1000"], ["id=4"]), b
    assert b["changed_rows"] == [{"key": "id=3", "columns": ["v"]}], b
    assert _tables(doc)["public.c"]["status"] == "equal", doc
    code, doc, text = verify(lake)  # streamed onto the store up to the snapshot, applied there
    assert code == 0, (text, doc)
    assert doc["caught_up"] and [t["status"] for t in doc["tables"]] == ["equal", "equal"], doc
    assert _tables(doc)["public.b"]["rows_lake"] == 90, doc
    client = s3_server.client()
    gone = client.list_objects_v2(Bucket=bucket, Prefix=f"lake/{table_dir_name('public', 'c')}/")["Contents"]
    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": o["Key"]} for o in gone]})
    code, doc, text = verify(lake, "--no-catch-up")
    assert code == ExitCode.DIFFERENT, text
    assert (_tables(doc)["public.c"]["status"], _tables(doc)["public.b"]["status"]) == ("missing", "equal"), doc
    code, doc, text = verify(f"s3://{bucket}/nothing", "--no-catch-up")
    assert code == ExitCode.USAGE and text.count("\n") == 1 and "nothing under that prefix" in text, text


def test_a_lake_on_gcs_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """spark-apply writes Parquet tables onto gs://, but verify does not read them yet: one line
    (exit 2) before it connects to anything (the DSN names no server)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    code, _, text = _verify("host=/nonexistent", tmp_path, "gs://bucket/lake", "parquet")
    assert code == ExitCode.USAGE and text.count("\n") == 1, text
    assert "--target gs://bucket/lake: verify does not read a lake on gs:// yet" in text, text
