"""``spark-apply gs://BUCKET/PREFIX``: change files on Google Cloud Storage, read from a real
emulator on 127.0.0.1 (fake-gcs-server): the driver lists and reads heads through pyarrow's Cloud
Storage file system, Spark's tasks read the objects through Google's Hadoop connector
(jvm/gcs/pom.xml). The emulator is named the way Google's SDKs take one (STORAGE_EMULATOR_HOST);
pgrecv hands it to the connector. The tables equal PostgreSQL's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import deltalake
import orjson
import pytest

from pgrecv.errors import ExitCode
from pgrecv.spark.model import table_dir_name
from tests.conftest import GcsServer
from tests.spark.test_s3_source import FAST, changes_to_s3
from tests.util import err, pgrecv, pgrecv_here, sql

pytest.importorskip("pyspark")


def apply_gcs(
    gcs: GcsServer, jars: str, sources: list[str], target: Path | str, *extra: str
) -> subprocess.CompletedProcess[bytes]:
    return pgrecv(
        "spark-apply", *sources, "--target", str(target), *FAST, "--conf", f"spark.jars={jars}", "--json", *extra,
        env=gcs.env, timeout=900,
    )  # fmt: skip


@pytest.mark.newest_server  # the subject is the store
def test_postgresql_changes_on_gcs_give_postgresqls_table(
    db_dsn: str, gcs_server: GcsServer, gcs_jars_conf: str, tmp_path: Path
) -> None:
    """`snapshot` and `start` write change files, which are put on Cloud Storage under a prefix
    holding a space; spark-apply reads them there and its Delta table is PostgreSQL's. A second
    run skips every file by its name (the record keeps the prefix's gs:// position), and
    --list-applied names them as gs:// URLs."""
    local = tmp_path / "cdc"
    changes_to_s3(db_dsn, None, str(local))
    files = sorted(p for p in local.iterdir() if p.is_file())
    bucket = gcs_server.bucket()
    gcs_server.upload(bucket, "cdc/db 1", files)
    source = f"gs://{bucket}/cdc/db 1"
    lake = tmp_path / "lake"
    first = apply_gcs(gcs_server, gcs_jars_conf, [source], lake, "--format", "delta")
    assert first.returncode == 0, err(first)
    summary = orjson.loads(first.stdout)
    assert summary["files"] == len([f for f in files if f.suffix == ".jsonl"]) > 3, summary
    got = deltalake.DeltaTable(str(lake / table_dir_name("public", "t"))).to_pyarrow_table().to_pylist()
    rows = sorted((r["id"], r["v"]) for r in got)
    assert rows == sorted(tuple(r) for r in sql(db_dsn, "SELECT id, v FROM t")), "the lake is not PostgreSQL's table"
    assert len(rows) > 20
    again = apply_gcs(gcs_server, gcs_jars_conf, [source + "/"], lake, "--format", "delta")
    assert again.returncode == 0, err(again)
    assert orjson.loads(again.stdout)["files_skipped"] == summary["files"]
    listed = pgrecv(
        "spark-apply", source, "--target", str(lake), "--format", "delta", "--list-applied", env=gcs_server.env
    )
    assert listed.returncode == 0, err(listed)
    names = listed.stdout.decode().splitlines()
    assert len(names) == summary["files"] and all(n.startswith(f"{source}/") for n in names), names


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("case", ["no-bucket", "no-prefix", "no-connector", "delta-on-gcs"])
def test_what_cannot_be_read_from_gcs_is_one_line(
    gcs_server: GcsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """In the test process's session, which has no Cloud Storage connector: a missing bucket or
    prefix is exit 3 naming the URL; a SOURCE on gs:// without the connector is exit 2 naming
    the pom that fetches it; a Delta --target on gs:// is refused (delta-rs, which reads the
    tables' logs for the record, does not list an emulator's bucket: untested)."""
    for k, v in gcs_server.env.items():
        monkeypatch.setenv(k, v)
    bucket = gcs_server.bucket()
    f = tmp_path / "0000000000000010-0000000000000020.jsonl"
    f.write_bytes(
        b'{"v":1,"op":"begin","xid":1,"lsn":"0/10","commit_lsn":"0/20"}\n{"v":1,"op":"commit","xid":1,"lsn":"0/20"}\n'
    )
    gcs_server.upload(bucket, "p", [f])
    source = {"no-bucket": "gs://pgrecv-no-such-bucket/p", "no-prefix": f"gs://{bucket}/nothing-here"}.get(
        case, f"gs://{bucket}/p"
    )
    target = f"gs://{bucket}/lake" if case == "delta-on-gcs" else str(tmp_path / "lake")
    fmt = "delta" if case == "delta-on-gcs" else "parquet"
    proc = pgrecv_here("spark-apply", source, "--target", target, "--format", fmt)
    expected = ExitCode.INPUT if case in ("no-bucket", "no-prefix") else ExitCode.USAGE
    assert proc.returncode == expected, err(proc)
    text = err(proc)
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text, text
    says = {
        "no-bucket": source,
        "no-prefix": source,
        "no-connector": "jvm/gcs/pom.xml",
        "delta-on-gcs": f"--target {target}: --format delta is not supported on Cloud Storage yet",
    }[case]
    assert says in text, text


def test_an_unreachable_store_is_one_line_within_the_retry_limit(tmp_path: Path) -> None:
    """A Cloud Storage endpoint that does not answer (a closed port on 127.0.0.1): the listing
    fails in one line naming the endpoint within the retry limit, before any JVM. Google's client
    retried for minutes before: a gs:// SOURCE outlived a test's 2 minutes in stop 75's CI. The
    limit is PGRECV_GCS_RETRY_SECONDS here (its default, 30 s, cost CI that much)."""
    import socket
    import time

    limit = 4
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed again when the block ends: nothing listens there)
    started = time.monotonic()
    proc = pgrecv(
        "spark-apply", "gs://bucket/cdc", "--target", str(tmp_path / "lake"), "--format", "parquet",
        env={"STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}", "PGRECV_GCS_RETRY_SECONDS": str(limit)}, timeout=120,
    )  # fmt: skip
    took = time.monotonic() - started
    # retried until the limit (not refused at once), and not for minutes (11.6 s beside other tests)
    assert limit <= took < limit + 25, took
    assert proc.returncode == ExitCode.INPUT, err(proc)
    assert err(proc).count("\n") == 1 and "gs://bucket/cdc: cannot read it from the store" in err(proc), err(proc)
    assert "the store's endpoint" in err(proc) and "Traceback" not in err(proc)
    assert not [p for p in (tmp_path / "lake").rglob("*") if p.is_file() and p.suffix in (".parquet", ".json")]
