"""What a batch does to a table's current files: only the data files that hold a touched key
are rewritten, by Spark.

A batch is the table's final events (:func:`pgrecv.spark.replay.events.final_changes`): keys to
delete and rows to upsert, and whether the batch starts with a TRUNCATE. The current data files
that hold none of the batch's keys are kept as they are; the others are read, their touched rows
dropped, and written again with the upserts, clustered by key (so that changes to nearby keys
touch few files next time). Each table writer then makes the new files the table in one atomic
step (:mod:`pgrecv.spark.tables`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgrecv.spark.files import data_file_url, file_url, literal_read, local_path
from pgrecv.spark.schema import quoted
from pgrecv.spark.sparkops import shuffle_partitions, spark_schema
from pgrecv.spark.stores import StorePath, TargetPath, parquet_metadata
from pgrecv.spark.tables import DATA_SUFFIX, Batch

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


ROWS_PER_FILE = 250_000  # files this size keep a small batch's rewrite small (see bench/spark_apply.py)
ONE_PASS_FAILED = "pgrecv: the batch needs the step-by-step apply"  # raise_error's text, matched below


def one_pass_failed(exc: BaseException) -> bool:
    """Whether a write failed at a one-pass batch's check (a task's ``raise_error``), not for a
    reason of its own: the engine then applies the table step by step, which names the problem."""
    return ONE_PASS_FAILED in str(exc)


END_COLS = ("_end_lsn", "_end_change_lsn", "_end_time")  # what closing a history version sets


def key_condition(
    left: str, right: str, key_cols: list[str], null_safe: bool, right_cols: list[str] | None = None
) -> Column:
    """Rows of the aliases ``left`` and ``right`` with equal keys (NULL equal to NULL for REPLICA
    IDENTITY FULL, whose key is the whole row). ``right_cols``: the right side's names for the
    key columns, where they differ."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    for k, r in zip(key_cols, right_cols or key_cols, strict=True):
        a, b = F.col(f"{left}.{quoted(k)}"), F.col(f"{right}.{quoted(r)}")
        cond = cond & (a.eqNullSafe(b) if null_safe else a == b)
    return cond


def close_versions(
    old: DataFrame, closes: DataFrame, key_cols: list[str], null_safe: bool, names: list[str]
) -> DataFrame:
    """History mode: a table's rows ``old`` with the current version of each key in ``closes``
    (its key columns and :data:`END_COLS`) closed: those columns taken from ``closes``, ``_current``
    false. Versions are never dropped."""
    from pyspark.sql import functions as F

    flag = "_pgrecv_close"
    s = closes.select(*[F.col(quoted(c)) for c in (*key_cols, *END_COLS)]).withColumn(flag, F.lit(True)).alias("s")
    joined = old.alias("t").join(s, key_condition("t", "s", key_cols, null_safe) & F.col("t.`_current`"), "left")
    closed = F.col(f"s.{flag}").isNotNull()
    out = []
    for n in names:
        if n in END_COLS:
            out.append(F.when(closed, F.col(f"s.{quoted(n)}")).otherwise(F.col(f"t.{quoted(n)}")).alias(n))
        elif n == "_current":
            out.append(F.when(closed, F.lit(False)).otherwise(F.col("t.`_current`")).alias(n))
        else:
            out.append(F.col(f"t.{quoted(n)}").alias(n))
    return joined.select(*out)


class Rewrite:
    """What a batch does to a set of current files; :meth:`write` leaves new files in ``out``."""

    def __init__(self, spark: SparkSession, batch: Batch, files: list[str], current_schema: pa.Schema | None) -> None:
        self.spark = spark
        self.batch = batch
        self.files = files  # local paths of the current data files
        self.current_schema = current_schema

    def plan(self) -> tuple[list[str], Any]:
        """(files to drop, DataFrame of the rows to write)."""
        from pyspark.sql import functions as F

        b = self.batch
        names = b.schema.names
        if b.final is not None:
            return self._one_pass()
        cols = [F.col(quoted(n)) for n in names]
        assert b.upserts is not None  # a batch without final events has its upserts
        new_rows = b.upserts.select(*cols)
        if b.truncate or not self.files:
            return list(self.files), new_rows
        cur = self._read(self.files)
        if b.append_only:
            return [], new_rows
        assert b.keys is not None  # a keyed batch without final events has its keys
        grew = self.current_schema is None or set(names) != set(self.current_schema.names)
        if grew:
            touched = list(self.files)  # old files lack the new columns: rewrite them all
        else:
            hits = (
                cur.select(F.col("_metadata.file_path").alias("_f"), *[F.col(quoted(k)) for k in b.key_cols])
                .alias("t")
                .join(b.keys.alias("s"), key_condition("t", "s", b.key_cols, b.null_safe), "left_semi")
                .select("_f")
                .distinct()
                .collect()  # one row per data file of the table: bounded by the file count, not the rows
            )
            touched = sorted({local_path(r["_f"]) for r in hits})
        if not touched:
            return [], new_rows
        old = self._read(touched).alias("t")
        if b.history:  # versions are never dropped: the current one of a touched key is closed
            assert b.closes is not None
            return touched, close_versions(old, b.closes, b.key_cols, b.null_safe, names).unionByName(new_rows)
        kept = old.join(b.keys.alias("s"), key_condition("t", "s", b.key_cols, b.null_safe), "left_anti")
        return touched, kept.select(*cols).unionByName(new_rows)

    def _one_pass(self) -> tuple[list[str], Any]:
        """A batch that touches much of the table (``final``): every current file is replaced by
        the full outer join of its rows with the final events, in the one Spark job that also
        reads the input and replays it. No persisted copy of the events and no pass to find the
        touched files; the events' checks fail the job instead (:data:`ONE_PASS_FAILED`)."""
        from pyspark.sql import functions as F

        b = self.batch
        names = b.schema.names
        ev = b.final
        assert ev is not None
        if b.truncate or not self.files:
            return list(self.files), ev.where(F.col("_kind") == "U").select(*[F.col("_v")[n].alias(n) for n in names])
        j = self._read(self.files).alias("t").join(ev.alias("s"), self._final_key_condition(), "full_outer")
        untouched = F.col("s._kind").isNull()
        rows = j.where(untouched | (F.col("s._kind") == "U")).select(
            *[F.when(untouched, F.col(f"t.{quoted(n)}")).otherwise(F.col("s._v")[n]).alias(n) for n in names]
        )
        return list(self.files), rows

    def _final_key_condition(self) -> Column:
        b = self.batch
        if not b.flat_key:
            return key_condition("t", "s._k", b.key_cols, b.null_safe)
        return key_condition("t", "s", b.key_cols, b.null_safe, [f"_k{i}" for i in range(len(b.key_cols))])

    def _read(self, files: list[str]) -> DataFrame:
        # the batch's schema: columns a file lacks (added since it was written) read as NULL
        rows = (
            literal_read(self.spark).schema(spark_schema(self.batch.schema)).parquet(*[data_file_url(f) for f in files])
        )
        return rows.coalesce(1) if self.batch.single else rows

    def _key_ranges(self) -> Column | None:
        """For a one-pass write over current files with an integer first key column: which of the
        write's tasks takes a row, by range of that column (:func:`task_of_key`), instead of
        Spark's range partitioner, whose sample runs the replay and the join once more in a job
        of its own (0.3-0.5 s of a 1M-event run: bench/NOTES.md, 2026-12-03, night). None
        otherwise."""
        b = self.batch
        if b.final is None or not self.files or b.null_safe:
            return None
        first = b.key_cols[0]
        if not pa.types.is_integer(b.schema.field(first).type):
            return None
        span = key_span(self.files, first)
        if span is None:
            return None
        # the tasks of a repartition by column (the setting, or adaptive execution's initial number)
        tasks = shuffle_partitions(self.spark)
        return task_of_key(self.spark, first, span, tasks)

    def _one_file(self, dropped: list[str]) -> bool:
        """Whether the rows to write fit one file, by counts the driver has (the batch's upserts,
        the footers of the files it drops): a table with few rows is written by one task without
        the range partitioner, whose sample is a job of its own (bench/NOTES.md: many small tables)."""
        return fits_one_file(self.batch.upserts_at_most, dropped)

    def write(self, rows: DataFrame, out: TargetPath, dropped: list[str]) -> list[TargetPath]:
        """Rows clustered by key into files of at most ROWS_PER_FILE rows; the new files' paths.
        ``dropped``: the files :meth:`plan` replaces, whose rows are among ``rows``."""
        b = self.batch
        if b.key_cols:
            from pyspark.sql import functions as F

            keys = [F.col(quoted(k)) for k in b.key_cols]
            if self.batch.single:  # one partition already: no shuffle
                rows = rows.coalesce(1)
            elif self._one_file(dropped):
                rows = rows.repartition(1)
            elif (task := self._key_ranges()) is not None:
                rows = rows.repartition(task)
            else:
                rows = rows.repartitionByRange(*keys)
            rows = rows.sortWithinPartitions(*keys)
        rows.write.mode("error").option("maxRecordsPerFile", ROWS_PER_FILE).parquet(file_url(out))
        return sorted(
            (p for p in out.iterdir() if p.name.endswith(DATA_SUFFIX) and not p.name.startswith((".", "_"))), key=str
        )


class ArrowRewrite(Rewrite):
    """A batch whose rows the driver merged (``Batch.arrow``): every current file is replaced by
    one file of them, written by pyarrow without a Spark job."""

    def plan(self) -> tuple[list[str], Any]:
        assert self.batch.arrow is not None
        return list(self.files), self.batch.arrow

    def write(self, rows: Any, out: TargetPath, dropped: list[str]) -> list[TargetPath]:
        import uuid

        import pyarrow.parquet as pq

        out.mkdir()
        path = out / f"part-00000-{uuid.uuid4().hex}{DATA_SUFFIX}"
        if isinstance(path, StorePath):
            with path.fs.open_output_stream(f"{path.bucket}/{path.key}") as sink:
                pq.write_table(rows, sink)
        else:
            pq.write_table(rows, path)
        return [path]


def rewrite_for(spark: SparkSession, batch: Batch, files: list[str], current_schema: pa.Schema | None) -> Rewrite:
    """The rewrite of a batch: by Spark, or by pyarrow for a batch the driver merged."""
    cls = ArrowRewrite if batch.arrow is not None else Rewrite
    return cls(spark, batch, files, current_schema)


def key_span(files: list[str], column: str) -> tuple[int, int] | None:
    """The smallest and largest value of an integer column in ``files``, from their footers (each
    row group's statistics), read by the driver; None where a row group has none or a file lacks
    the column."""
    low = high = None
    for f in files:
        meta = parquet_metadata(f)
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        if column not in names:
            return None
        at = names.index(column)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            if group.num_rows == 0:
                continue
            stats = group.column(at).statistics
            if stats is None or not stats.has_min_max:
                return None
            low = stats.min if low is None else min(low, stats.min)
            high = stats.max if high is None else max(high, stats.max)
    return None if low is None or high is None else (int(low), int(high))


def task_of_key(spark: SparkSession, column: str, span: tuple[int, int], tasks: int) -> Column | None:
    """The partitioning expression that gives the write's ``tasks`` tasks contiguous ranges of an
    integer column: the values are cut into ranges of ``span``'s width over ``tasks`` (rounded
    toward zero, so that no subtraction can overflow), and range ``g`` goes to task ``g mod
    tasks``. Over the current keys each task takes one range (about its share of the rows where
    the keys are spread evenly); keys beyond them (new ones) take the following ranges in turn.
    A task sorts its rows by key before the write, so nearby keys share a file as with Spark's
    range partitioner, and adaptive execution only merges neighbouring tasks. Spark's hash
    partitioning sends a value to ``pmod(hash(value), tasks)``: each task's range number becomes
    a value that hashes to that task (:func:`_hashing_to`). None if none is found."""
    from pyspark.sql import functions as F

    reps = _hashing_to(spark, tasks)
    if reps is None:
        return None
    low, high = span
    width = min(MAX_RANGE, max(1, -(-(high - low + 1) // tasks)))
    # one SQL text: a Column per value would be two py4j round trips each, with 200 tasks 400
    values = ", ".join(f"{r}L" for r in reps)
    return F.expr(f"element_at(array({values}), CAST(pmod({quoted(column)} div {width}, {tasks}) AS INT) + 1)")


MAX_RANGE = 2**62  # a range's width stays a bigint literal
_REPS: dict[int, list[int]] = {}


def _hashing_to(spark: SparkSession, tasks: int) -> list[int] | None:
    """For each task ``t`` of a hash partitioning into ``tasks``, a bigint that Spark sends to it
    (the smallest of 0, 1, 2, ...), found by Spark's own hash on the driver (a local relation: no
    job). None if the first 64 values per task miss one (murmur3 being even, they do not)."""
    if tasks not in _REPS:
        from pyspark.sql import functions as F

        values = pa.table({"v": pa.array(range(64 * tasks), pa.int64())})  # Arrow: a local relation
        rows = spark.createDataFrame(values).select("v", F.pmod(F.hash("v"), F.lit(tasks)).alias("t")).collect()
        first: dict[int, int] = {}
        for r in rows:
            first.setdefault(r["t"], r["v"])
        if len(first) < tasks:
            return None
        _REPS[tasks] = [first[t] for t in range(tasks)]
    return _REPS[tasks]


def fits_one_file(most: int | None, files: list[str]) -> bool:
    """Whether ``most`` new rows (None: not known) and the rows of ``files`` fit one data file."""
    if most is None or most > ROWS_PER_FILE:
        return False
    return most + rows_in(files, above=ROWS_PER_FILE - most) <= ROWS_PER_FILE


def rows_in(files: list[str], above: int | None = None) -> int:
    """The rows of Parquet files, from their footers (read by the driver, one per file). With
    ``above``, the reading stops once the count passes it: a large table answers a small batch's
    question ("more than this?") from its first files."""
    n = 0
    for f in files:
        n += parquet_metadata(f).num_rows
        if above is not None and n > above:
            break
    return n


def missing_dirs(path: TargetPath) -> list[TargetPath]:
    """The directories down to ``path`` that do not exist yet (outermost first; none on a store,
    which has no directories)."""
    out: list[TargetPath] = []
    if isinstance(path, StorePath):
        return out
    while not path.exists():
        out.insert(0, path)
        path = path.parent
    return out


def unmake(made: list[TargetPath]) -> None:
    """Removes what a failed write made of a new table's directories (innermost first), so that a
    held-back new table leaves no directory behind; a directory with anything in it stays."""
    for d in reversed(made):
        with contextlib.suppress(OSError):
            (d / "_versions").rmdir()  # the Parquet writer's, empty after a failed write
        with contextlib.suppress(OSError):
            d.rmdir()


def fsync_files(paths: list[TargetPath]) -> None:
    for p in paths:
        assert isinstance(p, Path)
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
