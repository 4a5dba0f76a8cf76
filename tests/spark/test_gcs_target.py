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


@pytest.mark.newest_server  # the subject is the store
def test_postgresql_to_parquet_on_gcs_through_killed_runs(
    db_dsn: str, gcs_server: GcsServer, gcs_jars_conf: str, tmp_path: Path
) -> None:
    """Change files of the real tool on Cloud Storage, applied onto a target there (a prefix holding
    a space): a run after the snapshot makes the table; runs SIGKILLed (the JVM too) at random
    moments after their first write under the target, then one run to the end, apply the stream
    onto it. A reader following the pointer object reads PostgreSQL's table. A killed run leaves
    its lock object behind, which the next run on this machine takes over at once (its process is
    gone); the last run's lock is gone with it, the record is on the store, the table keeps only
    the versions its pointer and the one before name, and a further run skips every file by its
    name, without Spark."""
    import random

    from tests.spark.test_s3_target import kill_runs

    local = tmp_path / "cdc"
    bucket = gcs_server.bucket()
    source, lake = f"gs://{bucket}/cdc", f"gs://{bucket}/lake one"

    def upload() -> None:
        gcs_server.upload(bucket, "cdc", sorted(p for p in local.iterdir() if p.is_file()))

    def base() -> None:
        upload()
        proc = apply_gcs(gcs_server, gcs_jars_conf, [source], lake, "--format", "parquet")
        assert proc.returncode == 0, err(proc)

    changes_to_s3(db_dsn, None, str(local), after_snapshot=base)
    upload()
    rng = random.Random(f"gcs-kill-{db_dsn}")
    args = [sys.executable, "-m", "pgrecv", "spark-apply", source, "--target", lake, "--format", "parquet"]
    args += ["--master", "local[1]", "--conf", f"spark.jars={gcs_jars_conf}"]
    kills = kill_runs(args, gcs_server.env, lambda: keys_under(gcs_server, bucket, "lake one"), 2, rng)
    assert kills >= 1, "no run was killed: delays do not fit this machine"
    done = apply_gcs(gcs_server, gcs_jars_conf, [source], lake, "--format", "parquet")
    assert done.returncode == 0, err(done)
    summary = orjson.loads(done.stdout)
    assert summary["engine"] == "parquet/spark", summary
    table = f"lake one/{table_dir_name('public', 't')}"
    rows = sorted((r["id"], r["v"]) for r in read_parquet_on_gcs(gcs_server, bucket, table))
    assert rows == sorted(tuple(r) for r in sql(db_dsn, "SELECT id, v FROM t")), "the lake is not PostgreSQL's table"
    assert len(rows) > 20
    keys = keys_under(gcs_server, bucket, "lake one")
    assert [k for k in keys if k.startswith("_pgrecv/")] == ["_pgrecv/applied.json"], keys  # no lock, no staging
    versions = {k.split("/")[2] for k in keys if k.startswith(f"{table_dir_name('public', 't')}/_versions/")}
    assert 1 <= len(versions) <= 2, versions  # the current version and at most the one before
    again = apply_gcs(gcs_server, gcs_jars_conf, [source], lake, "--format", "parquet")
    assert again.returncode == 0, err(again)
    assert orjson.loads(again.stdout)["files_skipped"] == summary["files"] + summary["files_skipped"] > 3


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


def test_a_prefix_lists_the_prefixes_under_it(gcs_server: GcsServer) -> None:
    """A table's version prefixes have no marker objects (Spark's commit leaves none): listing
    ``_versions`` must name them all, or a killed run's version is never removed. pyarrow's own
    listing of a Cloud Storage prefix named only the objects directly under it. (And the copy a
    carried transaction is put into place with.)"""
    from pgrecv.spark.stores import StorePath

    bucket = gcs_server.bucket()
    fs = gcs_server.filesystem()
    for key in ("t/_versions/v1/a.parquet", "t/_versions/v2-x/_temporary/0/part.parquet", "t/_versions/top"):
        with fs.open_output_stream(f"{bucket}/{key}") as out:
            out.write(b"x")
    versions = StorePath(bucket, "t/_versions", fs, "gs")
    assert [p.name for p in versions.iterdir()] == ["top", "v1", "v2-x"]
    (versions / "v2-x").remove_tree()
    assert [p.name for p in versions.iterdir()] == ["top", "v1"]
    assert StorePath(bucket, "nothing", fs, "gs").iterdir() == []
    # a carried prepared transaction is put into place by a copy of Spark's part file
    (versions / "v1" / "a.parquet").copy_to(versions / "carried.jsonl")
    carried = versions / "carried.jsonl"
    assert carried.read_bytes() == b"x" and versions.glob("*.jsonl") == [carried]
