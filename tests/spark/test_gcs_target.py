"""``spark-apply --target gs://BUCKET/PREFIX``: Parquet tables and the target's state written onto a
real Cloud Storage emulator on 127.0.0.1 (fake-gcs-server): Spark's tasks write the data files
through Google's Hadoop connector (jvm/gcs/pom.xml), the driver replaces a table's pointer object
in one upload, and the target's lock and record are objects under ``_pgrecv/``, the lock written
with ``ifGenerationMatch`` (pgrecv/spark/objects.py). The tables equal PostgreSQL's, and a local
run's. (The lock's rules alone, on both stores: tests/spark/test_targets.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.errors import ExitCode
from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, table_dir_name
from tests.conftest import GcsServer
from tests.spark.changegen import Gen
from tests.spark.test_cluster import assert_same_tables
from tests.spark.test_command import held_target
from tests.spark.test_differential import _files
from tests.spark.test_gcs_source import apply_gcs
from tests.spark.test_s3_source import changes_to_s3
from tests.util import err, pgrecv, sql

pytest.importorskip("pyspark")
SEED = 7373


def keys_under(gcs: GcsServer, bucket: str, prefix: str) -> list[str]:
    """Every object's key under ``prefix``, relative to it (not the empty markers of prefixes)."""
    from pyarrow import fs as pafs

    selector = pafs.FileSelector(f"{bucket}/{prefix}", recursive=True, allow_not_found=True)
    infos = gcs.filesystem().get_file_info(selector)
    base = f"{bucket}/{prefix}/"
    return sorted(i.path[len(base) :] for i in infos if i.type == pafs.FileType.File and i.size)


def download(gcs: GcsServer, bucket: str, prefix: str, to: Path) -> list[str]:
    """Every object under ``prefix`` as a local file under ``to``; each Parquet table's version as
    a reader takes it (the files its pointer names, under ``current/``). The keys."""
    fs = gcs.filesystem()
    keys = keys_under(gcs, bucket, prefix)
    for rel in keys:
        (to / rel).parent.mkdir(parents=True, exist_ok=True)
        with fs.open_input_stream(f"{bucket}/{prefix}/{rel}") as f:
            (to / rel).write_bytes(f.read())
    for pointer in to.glob("*/_pgrecv_table.json"):
        current = pointer.parent / "current"
        current.mkdir()
        for name in orjson.loads(pointer.read_bytes())["files"]:
            os.link(pointer.parent / name, current / Path(name).name)
    return keys


def read_parquet_on_gcs(gcs: GcsServer, bucket: str, table: str) -> list[dict[str, Any]]:
    """A Parquet table on the store as a reader reads it: the pointer object, then the files it
    names (docs/spark-apply.md), through pyarrow's Cloud Storage file system."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs = gcs.filesystem()
    with fs.open_input_stream(f"{bucket}/{table}/_pgrecv_table.json") as f:
        pointer = orjson.loads(f.read())
    parts = [pq.read_table(f"{bucket}/{table}/{name}", filesystem=fs) for name in pointer["files"]]
    return pa.concat_tables(parts).to_pylist() if parts else []


@pytest.mark.newest_server  # the subject is the store
def test_postgresql_to_parquet_tables_on_gcs(
    db_dsn: str, gcs_server: GcsServer, gcs_jars_conf: str, tmp_path: Path
) -> None:
    """Change files on Cloud Storage, applied to a target there (a prefix holding a space): a
    reader following the pointer object reads PostgreSQL's table. The lock is gone after the run,
    the record is on the store, and a second run skips every file by its name."""
    local = tmp_path / "cdc"
    changes_to_s3(db_dsn, None, str(local))
    bucket = gcs_server.bucket()
    gcs_server.upload(bucket, "cdc", sorted(p for p in local.iterdir() if p.is_file()))
    source, lake = f"gs://{bucket}/cdc", f"gs://{bucket}/lake one"
    first = apply_gcs(gcs_server, gcs_jars_conf, [source], lake, "--format", "parquet")
    assert first.returncode == 0, err(first)
    summary = orjson.loads(first.stdout)
    assert summary["files"] > 3 and summary["engine"] == "parquet/spark", summary
    got = read_parquet_on_gcs(gcs_server, bucket, f"lake one/{table_dir_name('public', 't')}")
    rows = sorted((r["id"], r["v"]) for r in got)
    assert rows == sorted(tuple(r) for r in sql(db_dsn, "SELECT id, v FROM t")), "the lake is not PostgreSQL's table"
    assert len(rows) > 20
    state = [k for k in keys_under(gcs_server, bucket, "lake one") if k.startswith("_pgrecv/")]
    assert state == ["_pgrecv/applied.json"], state  # the lock deleted, no staging left
    again = apply_gcs(gcs_server, gcs_jars_conf, [source], lake, "--format", "parquet")
    assert again.returncode == 0, err(again)
    assert orjson.loads(again.stdout)["files_skipped"] == summary["files"]


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Gen, list[Path]]:
    where = tmp_path_factory.mktemp("gcs-target-stream")
    gen = Gen(SEED)
    return gen, _files(gen.run(40), where, SEED)


def test_the_generated_stream_onto_gcs_equals_the_local_run(
    gcs_server: GcsServer, gcs_jars_conf: str, spark: Any, stream: tuple[Gen, list[Path]], tmp_path: Path
) -> None:
    """Every kind of change the generator makes (streamed and two-phase transactions, which take
    the staged read, staged under the target on the store; TOAST; many tables): the Parquet tables
    written onto Cloud Storage, read back, equal a local run's and the truth."""
    gen, files = stream
    bucket = gcs_server.bucket()
    proc = apply_gcs(gcs_server, gcs_jars_conf, list(map(str, files)), f"gs://{bucket}/lake", "--format", "parquet")
    assert proc.returncode == 0, err(proc)
    assert orjson.loads(proc.stdout)["input_read"] == "staged"
    local = tmp_path / "local"
    run_apply(ApplyConfig(tuple(str(f) for f in files), local, fmt="parquet"), spark=spark)
    copy = tmp_path / "copy"
    keys = download(gcs_server, bucket, "lake", copy)
    assert not [k for k in keys if "stage-" in k or ".tmp-" in k], keys  # the run's scratch is gone
    assert "_pgrecv/applied.json" in keys
    assert_same_tables(gen, copy, local, "parquet", "a run onto Cloud Storage")


def test_a_target_on_gcs_is_one_run_at_a_time(gcs_server: GcsServer, tmp_path: Path) -> None:
    """A run that finds the lock held by a live run is refused in one line (exit code 8), naming
    the holder, before any JVM; nothing is written."""
    bucket = gcs_server.bucket()
    lake = f"gs://{bucket}/lake"
    f = tmp_path / "0000000000000010-0000000000000020.jsonl"
    f.write_bytes(b'{"v":1,"op":"begin","xid":1,"lsn":"0/10","commit_lsn":"0/20"}\n')
    with held_target(lake, gcs_server.env) as holder:
        assert keys_under(gcs_server, bucket, "lake") == ["_pgrecv/lock"]
        proc = pgrecv("spark-apply", str(f), "--target", lake, "--format", "parquet", env=gcs_server.env)
    assert proc.returncode == ExitCode.OUTPUT, err(proc)
    lines = err(proc).strip().splitlines()
    assert len(lines) == 1 and f"{lake}: another spark-apply run is applying" in lines[0], lines
    assert f"process {holder}" in lines[0]
    assert keys_under(gcs_server, bucket, "lake") == []  # the holder deleted its lock; the refused run wrote nothing


@pytest.mark.newest_server  # the subject is the writer's atomicity on the store, not the server
def test_killed_runs_on_gcs_then_a_full_run_give_postgresqls_tables(
    db_dsn: str, gcs_server: GcsServer, gcs_jars_conf: str, spark: Any, tmp_path: Path
) -> None:
    """Runs SIGKILLed (the JVM too) at random moments after their first write under the target (a
    Parquet pointer is pgrecv's own protocol), then one run to the end: each table is
    PostgreSQL's. A killed run leaves its lock object behind; the next run on this machine takes
    it over at once (its process is gone). A table keeps only the versions its pointer and the
    one before name."""
    import random
    import signal
    import time

    from tests.spark.test_apply_server import _assert_equal
    from tests.spark.test_kill import make_workload_files

    first, second = make_workload_files(db_dsn, tmp_path)
    bucket = gcs_server.bucket()
    lake = f"gs://{bucket}/lake"
    base = apply_gcs(gcs_server, gcs_jars_conf, [str(first)], lake, "--format", "parquet")  # an existing state
    assert base.returncode == 0, err(base)
    rng = random.Random(f"gcs-kill-{db_dsn}")
    args = [sys.executable, "-m", "pgrecv", "spark-apply", str(first), str(second), "--target", lake]
    args += ["--format", "parquet", "--master", "local[1]", "--conf", f"spark.jars={gcs_jars_conf}"]
    kills = 0
    for _ in range(2):
        before = keys_under(gcs_server, bucket, "lake")
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
            env={**os.environ, **gcs_server.env},
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while proc.poll() is None and keys_under(gcs_server, bucket, "lake") == before and time.monotonic() < deadline:
            time.sleep(0.05)  # (its lock object is its first write)
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
    assert kills >= 1, "no run was killed: delays do not fit this machine"
    done = apply_gcs(gcs_server, gcs_jars_conf, [str(first), str(second)], lake, "--format", "parquet")
    assert done.returncode == 0, err(done)
    copy = tmp_path / "copy"
    download(gcs_server, bucket, "lake", copy)
    _assert_equal(db_dsn, copy, "parquet", spark)
    pointers = list(copy.glob("*/_pgrecv_table.json"))
    assert pointers
    for pointer in pointers:
        versions = {p.name for p in (pointer.parent / "_versions").iterdir()}
        assert 1 <= len(versions) <= 2, versions  # the current version and at most the one before


def test_a_target_on_gcs_without_credentials_is_one_line(tmp_path: Path) -> None:
    """No emulator and no Google credentials (none in the environment, no gcloud configuration, no
    metadata server looked for): one line naming the target and where credentials come from,
    before any JVM; nothing written."""
    f = tmp_path / "0000000000000010-0000000000000020.jsonl"
    f.write_bytes(b'{"v":1,"op":"begin","xid":1,"lsn":"0/10","commit_lsn":"0/20"}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR", "CLOUDSDK_"))}
    env |= {"CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud"), "NO_GCE_CHECK": "True"}
    args = [sys.executable, "-m", "pgrecv", "spark-apply", str(f), "--target", "gs://bucket/lake"]
    args += ["--format", "parquet"]
    proc = subprocess.run(args, capture_output=True, env=env, timeout=120, check=False)
    assert proc.returncode == ExitCode.OUTPUT, err(proc)
    lines = err(proc).strip().splitlines()
    assert len(lines) == 1 and "gs://bucket/lake: no Google credentials found" in lines[0], lines
