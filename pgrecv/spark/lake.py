"""Writers for DataFrames: only the data files that hold a touched key are rewritten, by Spark.

A batch is the table's final events (:func:`pgrecv.spark.replay.final_changes`): keys to delete and
rows to upsert, and whether the batch starts with a TRUNCATE. The current data files that hold
none of the batch's keys are kept as they are; the others are read, their touched rows dropped,
and written again with the upserts, clustered by key (so that changes to nearby keys touch few
files next time). One atomic step then switches the table and records the batch's position:

* Parquet: a new version directory (kept files hard-linked into it), then the pointer and the
  ``current`` link, as :class:`pgrecv.spark.writers.ParquetTarget` does;
* Delta (delta-rs commits what Spark wrote): one commit with the remove and add actions and the
  app transaction ``pgrecv:<schema>.<table>``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from pgrecv.errors import OutputError
from pgrecv.output.files import fsync_dir
from pgrecv.spark.source import file_url, literal_read
from pgrecv.spark.writers import DeltaRsTarget, ParquetTarget, close_versions, key_condition

ROWS_PER_FILE = 250_000  # files this size keep a small batch's rewrite small (see bench/spark_apply.py)
DATA_SUFFIX = ".parquet"


@dataclass
class FrameBatch:
    schema: pa.Schema  # the table's columns after the batch
    key_cols: list[str]
    null_safe: bool
    truncate: bool
    upserts: Any  # DataFrame of full rows (schema's columns)
    keys: Any  # DataFrame of every touched key (key columns)
    position: int
    append_only: bool = False
    # history mode: ``upserts`` are new version rows; ``closes`` ends the target's current version
    # of each of their keys (key columns and the _end_* of the key's first new version)
    history: bool = False
    closes: Any = None
    # one pass (see :class:`_Rewrite`): the final events (``_kind`` U or D, the key as the
    # struct ``_k``, the typed values as the struct ``_v``; other columns are ignored) instead of
    # ``upserts`` and ``keys``
    final: Any = None
    # ``final`` also has the key's columns as ``_k0``, ``_k1``, ... (replay.key_columns), by which
    # it is partitioned: the one-pass join compares those, and needs no shuffle of its own
    flat_key: bool = False
    # at most this many rows come from the batch (its inserts and updates; None: not known): with
    # the rows of the files it rewrites, what tells :meth:`_Rewrite.write` that one file holds all
    upserts_at_most: int | None = None
    # the batch's input and the table's current rows are small enough for one task: the input
    # arrives in one partition (:func:`pgrecv.spark.engine.single_task`), the current rows are read
    # into one, and nothing is shuffled between the replay and the write
    single: bool = False
    # called after the Spark job that writes the batch's files and before the commit (the lean
    # read's counts and position: pgrecv.spark.engine._lean_settle); what it raises undoes the write
    settle: Callable[[], None] | None = None


ONE_PASS_FAILED = "pgrecv: the batch needs the step-by-step apply"  # raise_error's text, matched below


def one_pass_failed(exc: BaseException) -> bool:
    """Whether a write failed at a one-pass batch's check (a task's ``raise_error``), not for a
    reason of its own: the engine then applies the table step by step, which names the problem."""
    return ONE_PASS_FAILED in str(exc)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _spark_schema(schema: pa.Schema) -> Any:
    from pgrecv.spark.sparkops import spark_schema

    return spark_schema(schema)


def _local(uri: str) -> str:
    from pgrecv.spark.source import local_path

    return local_path(uri)


class _Rewrite:
    """What a batch does to a set of current files; :meth:`write` leaves new files in ``out``."""

    def __init__(self, spark: Any, batch: FrameBatch, files: list[str], current_schema: pa.Schema | None) -> None:
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
        cols = [F.col(_q(n)) for n in names]
        new_rows = b.upserts.select(*cols)
        if b.truncate or not self.files:
            return list(self.files), new_rows
        cur = self._read(self.files)
        if b.append_only:
            return [], new_rows
        grew = self.current_schema is None or set(names) != set(self.current_schema.names)
        if grew:
            touched = list(self.files)  # old files lack the new columns: rewrite them all
        else:
            hits = (
                cur.select(F.col("_metadata.file_path").alias("_f"), *[F.col(_q(k)) for k in b.key_cols])
                .alias("t")
                .join(b.keys.alias("s"), key_condition("t", "s", b.key_cols, b.null_safe), "left_semi")
                .select("_f")
                .distinct()
                .collect()  # one row per data file of the table: bounded by the file count, not the rows
            )
            touched = sorted({_local(r["_f"]) for r in hits})
        if not touched:
            return [], new_rows
        old = self._read(touched).alias("t")
        if b.history:  # versions are never dropped: the current one of a touched key is closed
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
        if b.truncate or not self.files:
            return list(self.files), ev.where(F.col("_kind") == "U").select(*[F.col("_v")[n].alias(n) for n in names])
        j = self._read(self.files).alias("t").join(ev.alias("s"), self._final_key_condition(), "full_outer")
        untouched = F.col("s._kind").isNull()
        rows = j.where(untouched | (F.col("s._kind") == "U")).select(
            *[F.when(untouched, F.col(f"t.{_q(n)}")).otherwise(F.col("s._v")[n]).alias(n) for n in names]
        )
        return list(self.files), rows

    def _final_key_condition(self) -> Any:
        b = self.batch
        if not b.flat_key:
            return key_condition("t", "s._k", b.key_cols, b.null_safe)
        return key_condition("t", "s", b.key_cols, b.null_safe, [f"_k{i}" for i in range(len(b.key_cols))])

    def _read(self, files: list[str]) -> Any:
        # the batch's schema: columns a file lacks (added since it was written) read as NULL
        rows = (
            literal_read(self.spark)
            .schema(_spark_schema(self.batch.schema))
            .parquet(*[file_url(Path(f)) for f in files])
        )
        return rows.coalesce(1) if self.batch.single else rows

    def _key_ranges(self) -> Any:
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
        tasks = int(self.spark._jsparkSession.sessionState().conf().numShufflePartitions())
        return task_of_key(self.spark, first, span, tasks)

    def _one_file(self, dropped: list[str]) -> bool:
        """Whether the rows to write fit one file, by counts the driver has (the batch's upserts,
        the footers of the files it drops): a table with few rows is written by one task without
        the range partitioner, whose sample is a job of its own (bench/NOTES.md: many small tables)."""
        return fits_one_file(self.batch.upserts_at_most, dropped)

    def write(self, rows: Any, out: Path, dropped: list[str]) -> list[Path]:
        """Rows clustered by key into files of at most ROWS_PER_FILE rows; the new files' paths.
        ``dropped``: the files :meth:`plan` replaces, whose rows are among ``rows``."""
        b = self.batch
        if b.key_cols:
            from pyspark.sql import functions as F

            keys = [F.col(_q(k)) for k in b.key_cols]
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
        return sorted(p for p in out.iterdir() if p.name.endswith(DATA_SUFFIX) and not p.name.startswith((".", "_")))


def key_span(files: list[str], column: str) -> tuple[int, int] | None:
    """The smallest and largest value of an integer column in ``files``, from their footers (each
    row group's statistics), read by the driver; None where a row group has none or a file lacks
    the column."""
    import pyarrow.parquet as pq

    low = high = None
    for f in files:
        meta = pq.read_metadata(f)
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


def task_of_key(spark: Any, column: str, span: tuple[int, int], tasks: int) -> Any:
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
    return F.expr(f"element_at(array({values}), CAST(pmod({_q(column)} div {width}, {tasks}) AS INT) + 1)")


MAX_RANGE = 2**62  # a range's width stays a bigint literal
_REPS: dict[int, list[int]] = {}


def _hashing_to(spark: Any, tasks: int) -> list[int] | None:
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
    import pyarrow.parquet as pq

    n = 0
    for f in files:
        n += pq.read_metadata(f).num_rows
        if above is not None and n > above:
            break
    return n


def _missing(path: Path) -> list[Path]:
    """The directories down to ``path`` that do not exist yet (outermost first)."""
    out: list[Path] = []
    while not path.exists():
        out.insert(0, path)
        path = path.parent
    return out


def _unmake(made: list[Path]) -> None:
    """Removes what a failed write made of a new table's directories (innermost first), so that a
    held-back new table leaves no directory behind; a directory with anything in it stays."""
    for d in reversed(made):
        with contextlib.suppress(OSError):
            (d / "_versions").rmdir()  # the Parquet writer's, empty after a failed write
        with contextlib.suppress(OSError):
            d.rmdir()


def _fsync_files(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Frames:
    """The current rows as a DataFrame over :meth:`data_files` (for unchanged-TOAST lookups)."""

    spark: Any
    schema: pa.Schema | None

    def data_files(self) -> list[str]:
        raise NotImplementedError

    def row_count(self, above: int | None = None) -> int:
        """The current rows (see :func:`rows_in`)."""
        return rows_in(self.data_files(), above)

    def frame(self) -> Any:
        files = self.data_files()
        if not files or self.schema is None:
            return None
        return literal_read(self.spark).schema(_spark_schema(self.schema)).parquet(*[file_url(Path(f)) for f in files])


class FrameParquetTarget(_Frames, ParquetTarget):
    """:class:`ParquetTarget` with a batch of DataFrames; kept files are hard links."""

    def data_files(self) -> list[str]:
        if self.version is None:
            return []
        d = self._dir(self.version)
        return sorted(str(p) for p in d.iterdir() if p.name.endswith(DATA_SUFFIX) and not p.name.startswith((".", "_")))

    def write_frames(self, batch: FrameBatch) -> int:
        """Writes the batch; returns the bytes of the files written."""
        import pyarrow.parquet as pq

        current = self.data_files()
        rw = _Rewrite(self.spark, batch, current, self.schema)
        dropped, rows = rw.plan()
        version = (self.version or 0) + 1
        base = self.path / "_versions"
        made = _missing(self.path)
        base.mkdir(parents=True, exist_ok=True)
        final = self._dir(version)
        if final.exists():  # left by a run killed after the rename and before the pointer switch
            shutil.rmtree(final)
        tmp = base / f".tmp-v{version:06d}-{uuid.uuid4().hex}"
        try:
            written = rw.write(rows, tmp, dropped)
            if batch.settle is not None:
                batch.settle()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # what the failed job left
            _unmake(made)
            raise
        size = sum(p.stat().st_size for p in written)
        for p in tmp.iterdir():
            if not p.name.endswith(DATA_SUFFIX) or p.name.startswith(("_", ".")):
                p.unlink()  # Spark's _SUCCESS and .crc files
        gone = set(dropped)
        for kept in current:
            if kept not in gone:
                dest = tmp / os.path.basename(kept)
                try:
                    os.link(kept, dest)
                except OSError:
                    shutil.copy2(kept, dest)
        pq.write_metadata(batch.schema, tmp / "_schema.parquet")  # the schema even when empty
        _fsync_files(list(tmp.iterdir()))
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(base)
        self._switch(version, "history" if batch.history else "latest", batch.position, batch.key_cols)
        return size


class FrameDeltaRsTarget(_Frames, DeltaRsTarget):
    """Spark writes the data files into the table's directory; delta-rs commits them (with the
    removal of the files they replace and the app transaction) in one atomic commit."""

    def __init__(self, path: Path, app_id: str, spark: Any) -> None:
        super().__init__(path, app_id)
        self.spark = spark
        self._files: dict[str, int] = {}  # path relative to the table → size, as in the log

    def open(self) -> None:
        super().open()
        if self.version is None:
            return
        from deltalake import DeltaTable

        actions = DeltaTable(str(self.path)).get_add_actions(flatten=True)
        table = pa.table(actions) if not isinstance(actions, pa.Table) else actions
        paths = table.column("path").to_pylist()
        sizes = table.column("size_bytes").to_pylist()
        self._files = dict(zip(paths, sizes, strict=True))

    def data_files(self) -> list[str]:
        from urllib.parse import unquote

        return [str(self.path / unquote(p)) for p in sorted(self._files)]

    def write_frames(self, batch: FrameBatch) -> int:
        import pyarrow.parquet as pq
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

        current = self.data_files()
        rw = _Rewrite(self.spark, batch, current, self.schema)
        dropped, rows = rw.plan()
        sub = f"pgrecv-{uuid.uuid4().hex}"
        made = _missing(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            written = rw.write(rows, self.path / sub, dropped)
            if batch.settle is not None:
                batch.settle()
        except BaseException:
            shutil.rmtree(self.path / sub, ignore_errors=True)  # no commit names these files
            _unmake(made)
            raise
        for f in (self.path / sub).iterdir():
            if f not in written:
                f.unlink()
        _fsync_files(written)
        now = int(time.time() * 1000)
        adds = []
        for f in written:
            meta = pq.read_metadata(f)
            adds.append(
                AddAction(
                    path=f"{sub}/{f.name}",
                    size=f.stat().st_size,
                    partition_values={},
                    modification_time=now,
                    data_change=True,
                    stats=orjson.dumps({"numRecords": meta.num_rows}).decode(),
                )
            )
        by_local = {str(self.path / _unq(p)): p for p in self._files}
        removes = [
            RemoveAction(path=by_local[f], data_change=True, deletion_timestamp=now, size=self._files[by_local[f]])
            for f in dropped
        ]
        commit = CommitProperties(app_transactions=[Transaction(self.app_id, batch.position)])
        try:
            if self.version is None:
                create_table_with_add_actions(
                    str(self.path), _delta_schema(batch.schema), adds, mode="error", commit_properties=commit
                )
            else:
                DeltaTable(str(self.path)).create_write_transaction(
                    [*adds, *removes], mode="append", schema=batch.schema, commit_properties=commit
                )
        except Exception as exc:
            from deltalake.exceptions import CommitFailedError

            if isinstance(exc, CommitFailedError):
                raise OutputError(
                    f"{self.path}: another writer committed to this Delta table meanwhile ({exc}): "
                    "run spark-apply again (one run per target at a time)"
                ) from None
            raise
        self.version = DeltaTable(str(self.path)).version()
        return sum(f.stat().st_size for f in written)


def _unq(p: str) -> str:
    from urllib.parse import unquote

    return unquote(p)


def _delta_schema(schema: pa.Schema) -> Any:
    from deltalake import Schema

    return Schema.from_arrow(schema)
