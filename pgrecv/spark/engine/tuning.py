"""The session's settings for one run, sized from its input; each restored when the run ends."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from pgrecv.spark.sparkops import cores
from pgrecv.spark.stores import SourceFile

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pgrecv.spark.model import ApplyConfig


PUSHDOWN = "spark.sql.json.filterPushdown.enabled"
SHUFFLE_INPUT_BYTES = 64 << 20  # of JSONL input per shuffle partition


def size_shuffles(spark: SparkSession, config: ApplyConfig, files: list[SourceFile]) -> Callable[[], None]:
    """Sets this run's shuffle partitions from the input's size; returns what restores the old value.

    A fixed count makes each partition grow with the input: at 10M distinct keys (2.4 GB of
    JSONL) four partitions made tasks that sort and cache ~600 MB each, and local[2] with Spark's
    default 1 GB heap died of OutOfMemoryError. One partition per 64 MB of input (at least one per
    core) keeps a task's share constant; adaptive execution still merges the small ones."""
    key = "spark.sql.shuffle.partitions"
    parallel = cores(spark)
    return for_run(
        spark, config, key, max(_int_conf(spark, key), parallel, -(-input_bytes(files) // SHUFFLE_INPUT_BYTES))
    )


def size_reads(spark: SparkSession, config: ApplyConfig, inputs: list[SourceFile]) -> Callable[[], None]:
    """Reads of the input (the staged copy, or the JSON itself) split into as many partitions as
    the shuffles have; returns what restores the old split size.

    The staged Parquet is about 8x smaller than its JSONL, so Spark's default 128 MB splits put
    millions of rows in one task. A task that sorts its rows before the shuffle (the partial
    window of the last change per key) then needs more than local[2]'s default heap: 2M distinct
    keys under a 512 MB heap killed the JVM."""
    parts = max(1, _int_conf(spark, "spark.sql.shuffle.partitions"))
    size = input_bytes(inputs)
    return for_run(spark, config, "spark.sql.files.maxPartitionBytes", max(1 << 20, -(-size // parts)))


# Delta's connector rebuilds a table's state from its log in this many tasks (50 by default)
DELTA_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


def size_delta_snapshots(spark: SparkSession, config: ApplyConfig) -> Callable[[], None]:
    """Delta's connector rebuilds a table's state in 50 tasks by default, sized for clusters and
    logs of many files; a run sizes it to the session's cores, at most 50. Each MERGE or write
    rebuilds it several times: on local[2], four such jobs took 0.4-0.5 s each (bench/NOTES.md)."""
    n = cores(spark)
    return for_run(spark, config, DELTA_SNAPSHOT_PARTITIONS, max(1, min(50, n)))


def for_run(spark: SparkSession, config: ApplyConfig, key: str, value: int | str) -> Callable[[], None]:
    """Sets a session conf for this run unless the user gave it (``--conf`` wins); returns what
    restores the session's value."""
    if key in config.conf:
        return lambda: None
    old = spark.conf.get(key, None)  # None: not set (a conf without a default cannot be read otherwise)
    spark.conf.set(key, str(value))
    if old is None:
        return lambda: spark.conf.unset(key)
    return lambda: spark.conf.set(key, old)


def input_bytes(files: list[SourceFile]) -> int:
    size = 0
    for f in files:
        with contextlib.suppress(OSError):
            size += f.stat().st_size
    return size


def _int_conf(spark: SparkSession, key: str) -> int:
    """A count from the session's conf; a value that is not a plain integer (some platforms
    accept ``auto``) counts as one partition per core."""
    try:
        return int(spark.conf.get(key) or "")
    except (TypeError, ValueError):
        return cores(spark)
