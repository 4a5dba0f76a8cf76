"""``spark-apply --target s3://BUCKET/PREFIX``: Delta and Parquet tables written onto a real
S3-compatible server (moto's, on 127.0.0.1): Spark's tasks write the data files through Hadoop's
S3A connector; delta-rs commits with S3's conditional writes, a Parquet table's pointer object is
replaced in one PUT; the target's lock and record are objects under ``_pgrecv/``
(pgrecv/spark/targets.py). The tables equal PostgreSQL's, and a local run's."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import orjson
import pytest

from pgrecv.errors import ExitCode
from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, table_dir_name
from tests.conftest import ApplyHere, S3Server, s3a_settings
from tests.spark.changegen import Gen
from tests.spark.test_cluster import assert_same_tables
from tests.spark.test_command import held_target
from tests.spark.test_differential import _files
from tests.spark.test_s3_source import apply_s3, changes_to_s3
from tests.util import err, pgrecv, sql

pytest.importorskip("pyspark")
SEED = 6262


def download(s3: S3Server, bucket: str, prefix: str, to: Path) -> list[str]:
    """Every object under ``prefix`` as a local file under ``to`` (what a reader of the store sees);
    the keys, relative to the prefix."""
    client = s3.client()
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) + 1 :]
            if rel.endswith("/") or not rel:
                continue  # the empty marker of a prefix (Hadoop's S3A and pyarrow make them)
            keys.append(rel)
            (to / rel).parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, obj["Key"], str(to / rel))
    for pointer in to.glob("*/_pgrecv_table.json"):  # a Parquet table: its version as readers take it
        current = pointer.parent / "current"
        current.mkdir()
        for f in orjson.loads(pointer.read_bytes())["files"]:
            os.link(pointer.parent / f, current / Path(f).name)
    return sorted(keys)


def read_parquet_on_s3(s3: S3Server, bucket: str, table: str) -> list[dict[str, Any]]:
    """A Parquet table on the store as a reader reads it: the pointer object, then the files it
    names (docs/spark-apply.md), through pyarrow's S3 file system."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    e = s3.env
    fs = pafs.S3FileSystem(
        endpoint_override=e["AWS_ENDPOINT_URL"].split("://")[1],
        scheme="http",
        access_key=e["AWS_ACCESS_KEY_ID"],
        secret_key=e["AWS_SECRET_ACCESS_KEY"],
        region=e["AWS_REGION"],
    )
    with fs.open_input_stream(f"{bucket}/{table}/_pgrecv_table.json") as f:
        pointer = orjson.loads(f.read())
    parts = [pq.read_table(f"{bucket}/{table}/{name}", filesystem=fs) for name in pointer["files"]]
    return pa.concat_tables(parts).to_pylist() if parts else []


def _storage(s3: S3Server) -> dict[str, str]:
    e = s3.env
    return {
        "AWS_ENDPOINT_URL": e["AWS_ENDPOINT_URL"],
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": e["AWS_REGION"],
        "AWS_ACCESS_KEY_ID": e["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": e["AWS_SECRET_ACCESS_KEY"],
    }


@pytest.mark.newest_server  # the subject is the store
@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_postgresql_to_tables_on_s3(db_dsn: str, s3_server: S3Server, s3a_jars_conf: str, fmt: str) -> None:
    """The whole path on the store: `snapshot` and `start` write change files to S3, spark-apply
    reads them and writes the table to S3; delta-rs (or a reader following the Parquet pointer)
    reads it there as PostgreSQL's table. The lock is gone after the run, the record is on the
    store, a second run skips every file by its name (the record keeps the prefix's position) and
    --list-applied names them as s3:// URLs."""
    bucket = s3_server.bucket()
    changes = f"s3://{bucket}/cdc/db 1"  # a space: Spark's spelling of the object must match pgrecv's
    changes_to_s3(db_dsn, s3_server, changes)
    lake = f"s3://{bucket}/lake one"  # a space: Spark's spelling of the objects must match delta-rs's log
    first = apply_s3(s3_server, s3a_jars_conf, [changes], lake, "--format", fmt)
    assert first.returncode == 0, err(first)
    summary = orjson.loads(first.stdout)
    assert (
        summary["files"] > 3 and summary["engine"] == {"delta": "delta/delta-rs+spark", "parquet": "parquet/spark"}[fmt]
    )
    if fmt == "delta":
        table = f"{lake}/{table_dir_name('public', 't')}"
        got = deltalake.DeltaTable(table, storage_options=_storage(s3_server)).to_pyarrow_table().to_pylist()
    else:
        got = read_parquet_on_s3(s3_server, bucket, f"lake one/{table_dir_name('public', 't')}")
    rows = sorted((r["id"], r["v"]) for r in got)
    assert rows == sorted(tuple(r) for r in sql(db_dsn, "SELECT id, v FROM t")), "the lake is not PostgreSQL's table"
    assert len(rows) > 20
    client = s3_server.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix="lake one/_pgrecv/").get("Contents", [])
    keys = [o["Key"] for o in listed if not o["Key"].endswith("/")]  # (not the empty markers of prefixes)
    assert keys == ["lake one/_pgrecv/applied.json"], keys  # the lock deleted, no staging left
    # again: every file applied before is skipped unopened (the record on the store holds)
    again = apply_s3(s3_server, s3a_jars_conf, [changes.replace("s3://", "s3a://") + "/"], lake, "--format", fmt)
    assert again.returncode == 0, err(again)
    assert orjson.loads(again.stdout)["files_skipped"] == summary["files"]
    listed = pgrecv("spark-apply", changes, "--target", lake, "--format", fmt, "--list-applied", env=s3_server.env)
    assert listed.returncode == 0, err(listed)
    names = listed.stdout.decode().splitlines()
    assert len(names) == summary["files"] and all(n.startswith(f"{changes}/") for n in names), names


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Gen, list[Path]]:
    where = tmp_path_factory.mktemp("s3-target-stream")
    gen = Gen(SEED)
    return gen, _files(gen.run(40), where, SEED)


# Parquet: Delta's case is the cluster's and Spark Connect's tests with every path on S3 (the same stream)
@pytest.mark.parametrize("fmt", ["parquet"])
def test_the_generated_stream_from_s3_onto_s3_equals_the_local_run(
    s3_server: S3Server, s3_here: ApplyHere, spark: Any, stream: tuple[Gen, list[Path]], tmp_path: Path, fmt: str
) -> None:
    """Every kind of change the generator makes (streamed and two-phase transactions, which take
    the staged read, staged on the store; TOAST; many tables), read from objects whose keys hold
    characters URIs quote: the tables written onto S3, read back, equal a local run's and the truth."""
    gen, files = stream
    bucket = s3_server.bucket()
    urls = s3_server.upload(bucket, "a b/%20/ü", files)
    proc = s3_here(urls, f"s3://{bucket}/lake", "--format", fmt)
    assert proc.returncode == 0, err(proc)
    assert orjson.loads(proc.stdout)["input_read"] == "staged"
    local = tmp_path / "local"
    run_apply(ApplyConfig(tuple(str(f) for f in files), local, fmt=fmt, engine="delta-rs"), spark=spark)
    copy = tmp_path / "copy"
    keys = download(s3_server, bucket, "lake", copy)
    assert not [k for k in keys if "stage-" in k or ".tmp-" in k], keys  # the run's scratch is gone
    assert "_pgrecv/applied.json" in keys
    assert_same_tables(gen, copy, local, fmt, "a run onto S3")


@pytest.mark.parametrize("fmt", ["delta", "parquet"])  # (Iceberg's: test_iceberg's S3 kill test)
def test_a_target_on_s3_is_one_run_at_a_time(s3_server: S3Server, s3a_jars_conf: str, tmp_path: Path, fmt: str) -> None:
    """A run that finds the lock held by a live run is refused in one line (exit code 8: the target
    cannot be written), naming the holder; nothing is written."""
    bucket = s3_server.bucket()
    lake = f"s3://{bucket}/lake"
    f = tmp_path / "0000000000000010-0000000000000020.jsonl"
    f.write_bytes(b'{"v":1,"op":"begin","xid":1,"lsn":"0/10","commit_lsn":"0/20"}\n')
    with held_target(lake, s3_server.env) as holder:
        proc = apply_s3(s3_server, s3a_jars_conf, [str(f)], lake, "--format", fmt)
    assert proc.returncode == ExitCode.OUTPUT, err(proc)
    lines = err(proc).strip().splitlines()
    assert len(lines) == 1 and f"{lake}: another spark-apply run is applying" in lines[0], lines
    assert f"process {holder}" in lines[0]
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == [], keys  # the holder deleted its lock; the refused run wrote nothing


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--format", "iceberg"], "Iceberg's Hadoop catalog cannot be on an object store (it commits by renaming"),
    ],
)
def test_what_a_target_on_s3_does_not_take_is_one_line(
    s3_server: S3Server, tmp_path: Path, args: list[str], says: str
) -> None:
    f = tmp_path / "0000000000000010-0000000000000020.jsonl"
    f.write_bytes(b'{"v":1,"op":"begin","xid":1,"lsn":"0/10","commit_lsn":"0/20"}\n')
    bucket = s3_server.bucket()
    proc = pgrecv("spark-apply", str(f), "--target", f"s3://{bucket}/lake", *args, env=s3_server.env)
    assert proc.returncode == ExitCode.USAGE, err(proc)
    lines = err(proc).strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert json.dumps(s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])) == "[]"


def test_a_prepared_transaction_waits_on_the_store_for_its_outcome(
    s3_server: S3Server, s3a_jars_conf: str, s3_here: ApplyHere, tmp_path: Path
) -> None:
    """A prepared transaction whose outcome is not in the input is carried over as an object under
    ``_pgrecv/prepared/``; the next run, given only the outcome, applies it and removes the object.
    The first run names the store only by Hadoop's settings (``--conf spark.hadoop.fs.s3a.*``, no
    AWS_* in its environment): its lock, record, carried object and table all go there, and it
    prints no key."""
    from tests.spark.test_engine import _insert, _prepared, _rel, _txn, _write

    t = _rel("t", [("id", "integer")])
    held = {"op": "insert", "schema": "public", "table": "t", "lsn": "0/1F8", "key": ["id"], "new": {"id": 2}}
    held["unchanged_toast"] = []
    committed = _txn("0/100", [_insert("t", "0/100", "0/90", '{"id":1}')])
    first = _write(tmp_path / "a.jsonl", [orjson.dumps(t).decode(), *committed, *_prepared("g", "0/200", [held])])
    bucket = s3_server.bucket()
    lake = f"s3://{bucket}/lake"
    storage = _storage(s3_server)
    e = s3_server.env
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent"}
    env["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent"
    confs = [a for k, v in s3a_settings(s3_server).items() for a in ("--conf", f"spark.hadoop.fs.s3a.{k}={v}")]
    run = subprocess.run(
        [sys.executable, "-m", "pgrecv", "spark-apply", str(first), "--target", lake, "--format", "delta",
         "--master", "local[1]", "--conf", f"spark.jars={s3a_jars_conf}", *confs, "--json"],
        capture_output=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()
    assert e["AWS_SECRET_ACCESS_KEY"] not in (run.stdout + run.stderr).decode()
    assert orjson.loads(run.stdout)["pending_prepared"] == 1
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="lake/_pgrecv/applied.json").get("Contents", [])
    assert len(listed) == 1  # the record, on that store
    table = f"{lake}/{table_dir_name('public', 't')}"
    assert deltalake.DeltaTable(table, storage_options=storage).to_pyarrow_table().to_pylist() == [{"id": 1}]
    client = s3_server.client()

    def carried() -> list[str]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix="lake/_pgrecv/prepared/").get("Contents", [])
        return [o["Key"] for o in listed if not o["Key"].endswith("/")]

    assert len(carried()) == 1 and carried()[0].endswith(".jsonl"), carried()
    outcome = {"op": "commit_prepared", "xid": 2, "gid": "g", "commit_lsn": "0/300", "end_lsn": "0/301"}
    second = _write(tmp_path / "b.jsonl", [orjson.dumps({"v": 1, **outcome, "commit_time": None}).decode()])
    proc = s3_here([str(second)], lake, "--format", "delta")
    assert proc.returncode == 0, err(proc)
    assert orjson.loads(proc.stdout)["pending_prepared"] == 0
    got = deltalake.DeltaTable(table, storage_options=storage).to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in got) == [1, 2]
    assert carried() == []


def kill_runs(
    args: list[str], env: dict[str, str], state: Callable[[], object], rounds: int, rng: random.Random
) -> int:
    """``rounds`` runs of ``args``, each SIGKILLed (with its JVM: its process group) at a random
    moment once ``state()`` (what is under the target) changed: its lock object is its first
    write. A run that ends first must end well. The number killed."""
    kills = 0
    for _ in range(rounds):
        before = state()
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
            env={**os.environ, **env},
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while proc.poll() is None and state() == before:
            assert time.monotonic() < deadline, "the run wrote nothing under the target"
            time.sleep(0.05)
        try:
            proc.wait(timeout=rng.uniform(0.0, 4.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
        proc.stderr.close()
        assert proc.returncode in (0, -signal.SIGKILL), stderr
    return kills


# Parquet's pointer protocol is pgrecv's own; Delta's commit is delta-rs's conditional write (its
# refusal to overwrite is also shown alone below), or Delta's connector's commit through its
# single-driver S3 log store, with the app transaction in the commit; Iceberg's is test_iceberg's
# S3 kill test
@pytest.mark.newest_server  # the subject is the writer's atomicity on the store, not the server
@pytest.mark.parametrize(
    ("fmt", "engine", "rounds"), [("delta", "delta-rs", 1), ("parquet", "", 2), ("delta", "spark", 1)]
)
def test_killed_runs_on_s3_then_a_full_run_give_postgresqls_tables(
    db_dsn: str,
    s3_server: S3Server,
    s3a_jars_conf: str,
    spark_jars_conf: str,
    spark: Any,
    s3_here: ApplyHere,
    tmp_path: Path,
    fmt: str,
    engine: str,
    rounds: int,
    request: pytest.FixtureRequest,
) -> None:
    """Runs SIGKILLed (the JVM too) at random moments after their first write under the target,
    then one run to the end: each table is PostgreSQL's. A killed run leaves its lock object
    behind; the next run on this machine takes it over at once (its process is gone). A Parquet
    table keeps only the versions its pointer and the one before name. Delta's connector's
    tables (deletion vectors on: the second file's updates merge into files the first wrote)
    record the applied position in their commits, and a run after the full one changes nothing."""
    from tests.spark.test_apply_server import _assert_equal
    from tests.spark.test_kill import make_workload_files

    first, second = make_workload_files(db_dsn, tmp_path)
    bucket = s3_server.bucket()
    lake = f"s3://{bucket}/lake"
    jars = f"{s3a_jars_conf},{spark_jars_conf}" if engine == "spark" else s3a_jars_conf
    writer = ["--format", fmt] + (["--delta-engine", engine] if engine else [])

    def apply(*sources: Path) -> subprocess.CompletedProcess[bytes]:
        """A run to the end: in this session, or Delta's connector's in the connectors' runner."""
        if engine != "spark":
            return s3_here(list(map(str, sources)), lake, *writer)
        cmd = ["spark-apply", *map(str, sources), "--target", lake, "--json", *writer]
        return request.getfixturevalue("connector").run(cmd, 900, env=s3_server.env)  # type: ignore[no-any-return]

    base = apply(first)  # an existing state
    assert base.returncode == 0, err(base)
    assert orjson.loads(base.stdout)["engine"] == {"spark": "delta/spark", "delta-rs": "delta/delta-rs+spark"}.get(
        engine, "parquet/spark"
    )
    client = s3_server.client()

    def objects() -> int:
        return sum(p.get("KeyCount", 0) for p in client.get_paginator("list_objects_v2").paginate(Bucket=bucket))

    rng = random.Random(f"s3-kill-{fmt}-{db_dsn}")
    args = [sys.executable, "-m", "pgrecv", "spark-apply", str(first), str(second), "--target", lake]
    args += [*writer, "--master", "local[1]", "--conf", f"spark.jars={jars}"]
    # (each round's moment is random, and so is the seed, with the server's port: 3 rounds of each
    # writer took 201 s of CI; the Parquet pointer, pgrecv's own protocol, keeps 2)
    kills = kill_runs(args, s3_server.env, objects, rounds, rng)
    assert kills >= 1, "no run was killed: delays do not fit this machine"
    done = apply(first, second)
    assert done.returncode == 0, err(done)
    copy = tmp_path / "copy"
    download(s3_server, bucket, "lake", copy)
    _assert_equal(db_dsn, copy, fmt, spark)
    if engine == "spark":
        from pgrecv.lsn import LSN
        from pgrecv.spark.model import app_id

        tables = orjson.loads(done.stdout)["tables"]
        for t in tables:
            dt = deltalake.DeltaTable(str(copy / Path(t["path"]).name))
            assert "deletionVectors" in (dt.protocol().reader_features or []), t
            assert dt.transaction_version(app_id(t["table"])) == int(LSN.parse(t["applied_lsn"])), t
    for pointer in copy.glob("*/_pgrecv_table.json"):
        versions = {p.name for p in (pointer.parent / "_versions").iterdir()}
        assert 1 <= len(versions) <= 2, versions  # the current version and at most the one before


def test_delta_rs_commits_on_the_store_conflict_instead_of_overwriting(s3_server: S3Server) -> None:
    """What the Delta writer relies on, shown on the server: two writers that both read version 1
    and both remove the same file: the first commits version 2, the second fails (delta-rs creates
    the log entry with a conditional write); neither overwrites the other's entry."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    url = f"s3://{s3_server.bucket()}/t"
    storage = _storage(s3_server)
    write_deltalake(url, pa.table({"a": [1]}), storage_options=storage)
    write_deltalake(url, pa.table({"a": [2]}), storage_options=storage, mode="append")
    one, two = DeltaTable(url, storage_options=storage), DeltaTable(url, storage_options=storage)
    one.delete("a = 1")
    with pytest.raises(CommitFailedError):
        two.delete("a = 1")
    final = DeltaTable(url, storage_options=storage)
    assert final.version() == 2
    assert final.to_pyarrow_table().to_pylist() == [{"a": 2}]


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_many_small_tables_onto_s3(s3_server: S3Server, s3_here: ApplyHere, tmp_path: Path, fmt: str) -> None:
    """Small batches onto several existing tables (the shape of a whole database's OLTP stream) are
    merged in one group by the driver (pgrecv/spark/engine/together.py), on a store as on a local
    disk: their current files read through pyarrow's S3 file system, each table's new file
    written there and committed by its writer; every table holds its rows. (The group's merge
    once read the current files as local ones: bench/spark_apply.py --tables 50 --target-s3
    stopped on it.)"""
    from tests.spark.test_engine import _insert, _rel, _txn, _write

    names = [f"t{i}" for i in range(3)]
    rels = [orjson.dumps(_rel(n, [("id", "integer")])).decode() for n in names]
    first = _write(
        tmp_path / "a.jsonl", [*rels, *_txn("0/100", [_insert(n, "0/100", "0/90", '{"id":1}') for n in names])]
    )
    second = _write(
        tmp_path / "b.jsonl", [*rels, *_txn("0/200", [_insert(n, "0/200", "0/190", '{"id":2}') for n in names])]
    )
    bucket = s3_server.bucket()
    lake = f"s3://{bucket}/lake"
    for f in (first, second):
        proc = s3_here([str(f)], lake, "--format", fmt)
        assert proc.returncode == 0, err(proc)
    assert orjson.loads(proc.stdout)["tables_grouped"] == len(names)  # (the second run: onto existing tables)
    copy = tmp_path / "copy"
    download(s3_server, bucket, "lake", copy)
    for n in names:
        path = copy / table_dir_name("public", n)
        if fmt == "delta":
            got = deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        else:
            got = read_parquet_on_s3(s3_server, bucket, f"lake/{table_dir_name('public', n)}")
        assert sorted(r["id"] for r in got) == [1, 2], n
