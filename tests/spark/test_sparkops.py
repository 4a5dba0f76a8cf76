"""The SparkSession pgrecv starts: its private config directory (nothing another local user
prepared is used), and the settings it starts with."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.util import wait_for

pytest.importorskip("pyspark", reason="pip install 'pgrecv[spark]'")

_PROBE = """
import os, stat, sys
from pgrecv.spark.sparkops import start_session
spark = start_session("local[1]", {})
conf_dir = os.environ["SPARK_CONF_DIR"]
st = os.stat(conf_dir)
print(conf_dir)
print(oct(stat.S_IMODE(st.st_mode)), st.st_uid == os.getuid())
print(spark.range(3).count())
beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
print(" ".join(sorted(b.getName().replace(" ", "_") for b in beans)))
spark.stop()
"""


def test_a_planted_config_directory_is_never_used(tmp_path: Path) -> None:
    """Another user creates the name the old code predicted, with a spark-env.sh (which Spark's
    launcher sources) and a symlink where log4j2.properties goes: neither may take effect."""
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir(mode=0o1777)
    planted = shared_tmp / f"pgrecv-spark-conf-{os.getuid()}"
    planted.mkdir()
    marker = tmp_path / "PWNED"
    (planted / "spark-env.sh").write_text(f"id > {marker}\n")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (planted / "log4j2.properties").symlink_to(victim)
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
    env["TMPDIR"] = str(shared_tmp)

    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=180)

    assert done.returncode == 0, done.stderr[-2000:]
    conf_dir, mode_line, count, collectors = done.stdout.split("\n")[:4]
    assert not marker.exists(), "the planted spark-env.sh ran"
    assert victim.read_text() == "precious\n", "the planted symlink was written through"
    assert Path(conf_dir) != planted and Path(conf_dir).parent == shared_tmp
    assert mode_line == "0o700 True"
    assert count == "3"
    assert collectors == "PS_MarkSweep PS_Scavenge"  # sparkops.DRIVER_GC
    assert not Path(conf_dir).exists(), "the private config directory outlives the process"
    assert stat.S_ISDIR(planted.lstat().st_mode)  # the other user's directory is left alone


def test_no_call_site_round_trips_per_dataframe_call(spark: Any) -> None:
    """PySpark's DataFrame debugging (on by default) costs several py4j round trips for every
    function and DataFrame call; a table's plan makes some 1,700 of them (bench/NOTES.md)."""
    from pyspark.errors.utils import is_debugging_enabled
    from pyspark.sql import functions as F

    spark.range(1).select(F.lit(1)).collect()  # a call that would ask for the setting
    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert is_debugging_enabled() is False


def test_the_driver_forgets_finished_work(spark: Any) -> None:
    """The driver's status store keeps at most a few dozen finished jobs and SQL executions, not
    Spark's 1,000 of each: a run over many tables, or a session of many runs, would otherwise
    fill the driver's heap with plans' metrics that nothing reads."""
    from pgrecv.spark.sparkops import DEFAULT_CONF

    jobs, executions = int(DEFAULT_CONF["spark.ui.retainedJobs"]), int(DEFAULT_CONF["spark.sql.ui.retainedExecutions"])
    for _ in range(max(jobs, executions) + 10):
        spark.range(3).count()  # one SQL execution, one job
    store = spark._jsparkSession.sharedState().statusStore()
    tracker = spark.sparkContext.statusTracker()
    # the store drops the oldest on a worker thread of its own, a moment after the limit is passed
    wait_for(lambda: store.executionsCount() <= executions, what=f"at most {executions} SQL executions")
    wait_for(lambda: len(tracker.getJobIdsForGroup()) <= jobs, what=f"at most {jobs} jobs")
    assert store.executionsCount() > 0 and tracker.getJobIdsForGroup()  # the recent ones stay


def test_generated_code_is_compiled_once_per_session(spark: Any) -> None:
    """A JVM that pgrecv launches keeps more compiled classes than Spark's 100: a run of many
    tables compiles the same code for each table of a shape, and with 100 it had evicted it by
    the next (bench/NOTES.md, 2026-12-07). A plan is compiled, 150 other plans after it, then the
    first again: with Spark's cache the first is compiled a second time."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    compiled = metrics.METRIC_COMPILATION_TIME().getCount

    def run(expr: str) -> None:
        spark.range(3).selectExpr(expr).collect()

    run("id * 7919 + 104729")
    before = compiled()
    for i in range(150):  # a literal is part of the generated code: each a class of its own
        run(f"id * {i} + 3")
    assert compiled() - before >= 150, "the other plans were not compiled: the check below shows nothing"
    after_others = compiled()
    run("id * 7919 + 104729")
    assert compiled() == after_others, "the first plan's class was compiled again (evicted from the cache)"


def test_driver_memory_reaches_the_jvm_pgrecv_launches(spark: Any) -> None:
    """`--conf spark.driver.memory=...` (docs/spark-apply.md; the tests' session asks for more than
    Spark's 1 GB) sizes the heap of the JVM that start_session launches, as spark-submit's
    --driver-memory would."""
    asked = spark.sparkContext._jsc.sc().conf().getSizeAsBytes("spark.driver.memory")
    assert asked > 2**30
    # the collector keeps a survivor space out of maxMemory; Spark's default would give under 1 GB
    assert spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() > 0.8 * asked


def test_a_collector_chosen_elsewhere_is_left_alone(tmp_path: Path) -> None:
    """The parallel collector is pgrecv's default only: a JVM given two collectors refuses to
    start, so a choice in the JVM's environment wins (here the serial collector)."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
    env["JAVA_TOOL_OPTIONS"] = "-XX:+UseSerialGC"
    env["TMPDIR"] = str(tmp_path)

    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=180)

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[2:4] == ["3", "Copy MarkSweepCompact"]


@pytest.mark.parametrize(
    ("conf", "env", "added"),
    [
        ({}, {}, True),
        ({"spark.driver.extraJavaOptions": "-Dx=1 -Xss4m"}, {}, True),
        ({"spark.driver.extraJavaOptions": "-XX:+UseG1GC"}, {}, False),
        ({"spark.driver.defaultJavaOptions": "-Dx=1"}, {}, False),  # an administrator's defaults
        ({}, {"JAVA_TOOL_OPTIONS": "-XX:+UseZGC"}, False),
        ({}, {"JDK_JAVA_OPTIONS": "-XX:-UseParallelGC"}, False),
        ({}, {"PYSPARK_SUBMIT_ARGS": "--driver-java-options -XX:+UseShenandoahGC pyspark-shell"}, False),
        ({}, {"JAVA_TOOL_OPTIONS": "-XX:+UseStringDeduplication"}, True),
    ],
)
def test_driver_defaults_name_a_collector_only_where_nothing_else_does(
    conf: dict[str, str], env: dict[str, str], added: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgrecv.spark.sparkops import _JAVA_OPTION_VARS, DRIVER_GC, driver_defaults

    for var in _JAVA_OPTION_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert driver_defaults(conf) == ({"spark.driver.defaultJavaOptions": DRIVER_GC} if added else {})


def test_a_local_sessions_scratch_space_is_private_and_its_rpc_authenticated(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shuffle blocks hold row values: a local session keeps them in a 0700 directory of its own
    (Spark's default is /tmp, blockmgr-* 0755 with 0644 files), and its RPC needs a random secret
    (issue 54, M3). A cluster's settings are its own."""
    from pgrecv.spark.sparkops import private_defaults

    scratch = Path(spark.sparkContext.getConf().get("spark.local.dir"))
    assert scratch.name.startswith("pgrecv-spark-scratch-")
    st = scratch.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    spark.range(2000).selectExpr("id % 7 AS k").groupBy("k").count().collect()  # a shuffle
    assert any(p.name.startswith("blockmgr-") for p in scratch.iterdir()), "Spark's blocks are in it"
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.authenticate") == "true"
    assert len(conf.get("spark.authenticate.secret") or "") == 64
    assert private_defaults("spark://h:7077", {}) == {}
    given = private_defaults("local[2]", {"spark.local.dir": "/x", "spark.authenticate": "false"})
    assert given == {}
    # spark-submit's JVM with its own --master (a cluster's in tests/spark/test_cluster.py)
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    assert private_defaults(None, {}) == {}


def test_what_the_jvm_prints_on_stdout_stays_out_of_pgrecvs(tmp_path: Path) -> None:
    """The JVM writes its own warnings to its stdout (JDK 17's unified logging: a CI run's
    ``[12.3s][warning][codecache] CodeCache is full`` broke a --json summary). Here it logs its
    collector there from its first millisecond: pgrecv's stdout is still only the summary."""
    import orjson

    f = tmp_path / "0000000000000010-0000000000000020.jsonl"
    f.write_bytes(
        b'{"v":1,"op":"begin","xid":1,"lsn":"0/10","commit_lsn":"0/20"}\n{"v":1,"op":"commit","xid":1,"lsn":"0/20"}\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "pgrecv", "spark-apply", str(f), "--target", str(tmp_path / "lake"), "--json",
         "--format", "parquet", "--master", "local[1]", "--conf", "spark.driver.extraJavaOptions=-Xlog:gc:stdout"],
        capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1 and orjson.loads(lines[0])["files"] == 1, lines[:5]
