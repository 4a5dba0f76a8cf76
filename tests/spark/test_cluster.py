"""``spark-apply --replay spark`` on a real Spark standalone cluster (issue 10, point 7).

The `spark_cluster` fixture (tests/conftest.py) starts a master and a worker, each its own JVM,
from the pyspark wheel on 127.0.0.1. The command line runs against it with ``--master spark://…``
and must give the same tables as the same replay in local mode (and as the generator's truth);
the master's status and the worker's work directory show that the tasks ran in the cluster's
executor, not in the driver.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig
from tests.conftest import SHORT_JVM
from tests.spark.changegen import Gen
from tests.spark.test_differential import _expected, _files, _got
from tests.util import err, pgrecv

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")

SEED = 1010
# the driver on loopback too; 2 shuffle partitions as in the local `spark` fixture
LOOPBACK = ("--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1")
CONF = ("--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.default.parallelism=2")
# the executor serves one run: C1 only, as the tests' drivers (-16% of the file's CPU, 2026-12-07)
CONF += ("--conf", f"spark.executor.extraJavaOptions={SHORT_JVM}")
NO_CALL_SITES = ("--conf", "spark.python.sql.dataFrameDebugging.enabled=false")


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Gen, list[Path]]:
    where = tmp_path_factory.mktemp("cluster-stream")
    gen = Gen(SEED)
    lines = gen.run(40)
    return gen, _files(lines, where, SEED)


def _app_ids(status: dict[str, Any]) -> set[str]:
    return {a["id"] for a in status.get("activeapps", []) + status.get("completedapps", [])}


def _finished_app(cluster: Any, before: set[str]) -> dict[str, Any]:
    """The one application that appeared since ``before``, once the master has it as FINISHED
    (the master learns of the end a moment after the driver exits)."""
    deadline = time.monotonic() + 60
    while True:
        status = cluster.status()
        new = [a for a in status.get("completedapps", []) if a["id"] not in before]
        active = [a for a in status.get("activeapps", []) if a["id"] not in before]
        if new and not active:
            assert len(new) == 1, new
            return dict(new[0])
        assert time.monotonic() < deadline, f"no finished application on the master: {status}"
        time.sleep(1)


def assert_same_tables(gen: Gen, got_at: Path, local: Path, fmt: str, what: str) -> int:
    """Every table under ``got_at`` (applied by ``what``) equals the local run's and the truth;
    the number of rows compared (not 0: an empty comparison proves nothing)."""
    truth = gen.truth()
    rows = 0
    for t in gen.tables:
        got = _got(t, got_at, fmt)
        assert got == _got(t, local, fmt), f"{t.schema}.{t.name} ({t.kind}): {what} and local differ"
        assert got == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name} ({t.kind}): not the truth"
        rows += len(got)
    assert rows > 0, "the stream left no rows: the comparison proves nothing"
    return rows


def _counts(tables: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    keys = ("status", "inserts", "updates", "deletes", "truncates", "version", "applied_lsn")
    return {t["table"]: tuple(t[k] for k in keys) for t in tables}


def test_cluster_reads_source_from_s3_and_writes_onto_it(
    spark_cluster: Any, spark: Any, s3_server: Any, s3a_jars_conf: str, stream: tuple[Gen, list[Path]], tmp_path: Path
) -> None:
    """Every path on the S3 server: the executors read the objects and write the Delta tables'
    files through S3A (its jars on the cluster's class path, as a cluster image has them;
    credentials of their own, here through spark.executorEnv), the driver lists the prefix and
    commits through delta-rs; the same tables as the local run. (Delta only: the writers share
    their Spark writes, pgrecv/spark/tables/rewrite.py, which is what runs in the executors. The
    same test with local paths took 108 s of CI and showed nothing this one does not, 2026-12-06.)"""
    from tests.spark.test_s3_target import download

    gen, files = stream
    bucket = s3_server.bucket()
    urls = s3_server.upload(bucket, "cdc", files)
    local = tmp_path / "local"
    before = _app_ids(spark_cluster.status())
    class_path = s3a_jars_conf.replace(",", ":")
    executor_env = [("--conf", f"spark.executorEnv.{k}={v}") for k, v in s3_server.env.items() if k.startswith("AWS_")]
    proc = pgrecv(
        "spark-apply", *urls, "--target", f"s3://{bucket}/lake",
        "--format", "delta", "--master", spark_cluster.url, *LOOPBACK, *CONF, "--json",
        "--conf", f"spark.driver.extraClassPath={class_path}", "--conf", f"spark.executor.extraClassPath={class_path}",
        *(a for pair in executor_env for a in pair),
        env={"SPARK_LOCAL_IP": "127.0.0.1", **s3_server.env},
        timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, f"{err(proc)}\n{spark_cluster.logs()}"
    summary = orjson.loads(proc.stdout)
    assert not summary["warnings"], summary["warnings"]
    # the work ran in the cluster: one finished application, whose executor (a JVM the worker
    # started, with its own Python workers) ran tasks and logged them in the worker's directory
    app = _finished_app(spark_cluster, before)
    assert app["name"] == "pgrecv spark-apply" and app["state"] == "FINISHED", app
    executor_logs = sorted((spark_cluster.work_dir / app["id"]).glob("*/stderr"))
    assert executor_logs, f"no executor ran for {app['id']}\n{spark_cluster.logs()}"
    log = "\n".join(p.read_text(errors="replace") for p in executor_logs)
    assert "Finished task" in log and "CoarseGrainedExecutorBackend" in log, log[-3000:]
    config = ApplyConfig(tuple(str(f) for f in files), local, fmt="delta", engine="delta-rs")
    local_summary = run_apply(config, spark=spark)
    assert _counts(summary["tables"]) == _counts([asdict(t) for t in local_summary.tables])
    on_cluster = tmp_path / "cluster"
    download(s3_server, bucket, "lake", on_cluster)
    assert_same_tables(gen, on_cluster, local, "delta", "the cluster on S3")


def test_spark_submit_uses_its_master(spark_cluster: Any, stream: tuple[Gen, list[Path]], tmp_path: Path) -> None:
    """``spark-submit --master spark://… pgrecv/__main__.py spark-apply …`` (no pgrecv --master):
    the run goes to spark-submit's master, and gives the truth."""
    import pyspark

    import pgrecv

    gen, files = stream
    target = tmp_path / "lake"
    before = _app_ids(spark_cluster.status())
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    main = os.path.join(os.path.dirname(pgrecv.__file__), "__main__.py")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    args = ["spark-apply", *map(str, files), "--target", str(target), "--format", "parquet"]
    proc = subprocess.run(
        # the README's command: PySpark's call-site capture is a static conf, set at launch
        [submit, "--master", spark_cluster.url, *LOOPBACK, *CONF, *NO_CALL_SITES, main, *args, "-q"],
        env=env,
        capture_output=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, f"{proc.stderr.decode(errors='replace')[-5000:]}\n{spark_cluster.logs()}"
    app = _finished_app(spark_cluster, before)
    assert list((spark_cluster.work_dir / app["id"]).glob("*/stderr")), app
    truth = gen.truth()
    for t in gen.tables:
        assert _got(t, target, "parquet") == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name}"
