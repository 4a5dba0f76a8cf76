"""The table protocol: what the replay needs of a table, whatever its format.

A :class:`Table` is one PostgreSQL table under the target path. :meth:`Table.open` reads what the
table is before the batch: the position applied to it (``applied``: the end commit LSN of the last
batch it committed, or None), its schema and version, and its current data files. A
:class:`Batch` says what one run does to it, as Spark DataFrames; :meth:`Table.write_frames`
applies it in ONE atomic step that also records the batch's position, so a run killed at any
moment leaves each table either before or after the batch, and a re-run skips what is applied.

Writers (one module each): :mod:`.parquet` (a new version directory, then an atomic pointer
switch), :mod:`.delta` (Spark writes the data files, delta-rs commits them with the app
transaction ``pgrecv:<schema>.<table>``), :mod:`.delta_spark` (Delta's Spark connector commits)
and :mod:`.iceberg` (Iceberg's Spark runtime commits, the position in the snapshot's summary). A
new format is a subclass of :class:`Table` with ``open``, ``data_files`` and ``write_frames``;
:mod:`.rewrite` decides which current files a batch replaces and writes the new ones (the first
two), :mod:`.frames` what a batch gives a writer that commits through Spark (the last two).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pyarrow as pa

from pgrecv.errors import UsageError
from pgrecv.spark.files import data_file_url, literal_read
from pgrecv.spark.model import app_id
from pgrecv.spark.stores import StorePath, TargetPath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


POINTER = "_pgrecv_table.json"  # the Parquet table's pointer (tables/parquet.py)
DATA_SUFFIX = ".parquet"


@dataclass
class Batch:
    """One table's batch: the rows to upsert and the keys to delete, or the final events of a
    one-pass batch, with what the write needs to know of them."""

    schema: pa.Schema  # the table's columns after the batch
    key_cols: list[str]
    null_safe: bool  # keys may hold NULLs (REPLICA IDENTITY FULL): compare with IS NOT DISTINCT FROM
    truncate: bool
    upserts: DataFrame | None  # DataFrame of full rows (schema's columns)
    keys: DataFrame | None  # DataFrame of every touched key (key columns)
    position: int  # the batch's end commit LSN: recorded with its commit
    append_only: bool = False
    # history mode: ``upserts`` are new version rows; ``closes`` ends the target's current version
    # of each of their keys (key columns and the _end_* of the key's first new version)
    history: bool = False
    closes: DataFrame | None = None
    # one pass (see :class:`pgrecv.spark.tables.rewrite.Rewrite`): the final events (``_kind`` U
    # or D, the key as the struct ``_k``, the typed values as the struct ``_v``; other columns are
    # ignored) instead of ``upserts`` and ``keys``
    final: DataFrame | None = None
    # ``final`` also has the key's columns as ``_k0``, ``_k1``, ... (replay.events.key_columns), by
    # which it is partitioned: the one-pass join compares those, and needs no shuffle of its own
    flat_key: bool = False
    # at most this many rows come from the batch (its inserts and updates; None: not known): with
    # the rows of the files it rewrites, what tells the rewrite that one file holds all
    upserts_at_most: int | None = None
    # the batch's input and the table's current rows are small enough for one task: the input
    # arrives in one partition (:func:`pgrecv.spark.engine.facts.single_task`), the current rows
    # are read into one, and nothing is shuffled between the replay and the write
    single: bool = False
    # called after the Spark job that writes the batch's files and before the commit (the lean
    # read's counts and position: pgrecv.spark.engine.facts.lean_settle); what it raises undoes the write
    settle: Callable[[], None] | None = None
    # the table's whole content after the batch, merged by the driver (a small table of a group:
    # pgrecv.spark.engine.together); every current file is replaced by one file of these rows
    arrow: pa.Table | None = None
    # each column's PostgreSQL type, where a format has a type of its own for it (Iceberg's uuid)
    pg_types: dict[str, str] = field(default_factory=dict)


# how a Delta table records the --mode it was made with: an app transaction of this id and the
# mode (version 1) in the commit that made it (delta-rs takes no table property it does not know;
# an id without "." never meets a table's "pgrecv:<schema>.<table>"); the Parquet pointer has a
# field "mode"
MODE_APP_ID = "pgrecv:mode:"


def mode_of(table: Table) -> str | None:
    """The table's --mode: as recorded, else (a table made before it was recorded) "history" when
    it has every history column, else "latest"; None for no table yet."""
    from pgrecv.spark.schema import HISTORY_NAMES

    if table.mode is not None or table.schema is None:
        return table.mode
    return "history" if set(HISTORY_NAMES) <= set(table.schema.names) else "latest"


def applied_position(path: TargetPath, fmt: str, table: str) -> int | None:
    """The position applied to the table ``schema.table`` at ``path``, read without Spark (None:
    no such table): for the record of what a target has applied (pgrecv/spark/ledger.py)."""
    if fmt == "parquet":
        try:
            return int(orjson.loads((path / POINTER).read_bytes())["applied_lsn_int"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    if fmt == "iceberg":
        from pgrecv.spark.tables.iceberg import current_snapshot, position_of

        assert isinstance(path, Path)  # (a target on a store takes Delta only: targets.check_store)
        return position_of(current_snapshot(path))
    from pgrecv.spark.tables.delta import delta_table

    dt = delta_table(path)
    if dt is None:
        return None
    version = dt.transaction_version(app_id(table))
    return int(version) if version is not None else None


# what marks a table directory as one format's: Delta's log, spark-apply's Parquet pointer
_MARKS = {
    "delta": ("_delta_log", "a Delta table"),
    "parquet": (POINTER, "a Parquet table of spark-apply's"),
    "iceberg": ("metadata/version-hint.text", "an Iceberg table"),
}


def refuse_other_format(path: TargetPath, fmt: str) -> None:
    """A table directory of the other format is refused before anything is written: writing
    into it would leave one directory that holds two tables, each reader seeing only its own."""
    for other, (mark, name) in _MARKS.items():
        if other != fmt and (path / mark).exists():
            raise UsageError(f"{path} is {name}: use --format {other} with this target, or another --target")


def _nothing() -> None:
    pass


class Table(ABC):
    """A table under the target path; ``applied``/``schema``/``version`` describe it before the batch."""

    def __init__(self, path: TargetPath, app_id: str, spark: SparkSession) -> None:
        self.path = path
        self.app_id = app_id
        self.spark = spark
        self.applied: int | None = None
        self.schema: pa.Schema | None = None
        self.version: int | None = None
        # "latest" or "history", as recorded when the table was made (MODE_PROPERTY; None: not
        # recorded, by a version before it was, or no table yet): never guessed from its columns
        self.mode: str | None = None
        # the PostgreSQL (schema, table): a catalog's name for it (Iceberg's --iceberg-catalog)
        self.names: tuple[str, str] | None = None
        # called just before the commit: raises when the run may commit no more (a lock on a store
        # whose lease was lost: pgrecv/spark/targets.py)
        self.guard: Callable[[], None] = _nothing

    def exists(self) -> bool:
        """Whether the table exists before the batch (to be opened)."""
        return self.path.exists()

    @abstractmethod
    def open(self) -> None:
        """Reads the table's state (nothing when it does not exist yet)."""

    @abstractmethod
    def data_files(self) -> list[str]:
        """The local paths of the current version's data files."""

    @abstractmethod
    def write_frames(self, batch: Batch) -> int:
        """Applies the batch in one atomic step with its position; returns the bytes written."""

    def row_count(self, above: int | None = None) -> int:
        """The current rows (see :func:`pgrecv.spark.tables.rewrite.rows_in`)."""
        from pgrecv.spark.tables.rewrite import rows_in

        return rows_in(self.data_files(), above)

    def frame(self) -> DataFrame | None:
        """The current rows as a DataFrame (None: no table yet), for unchanged-TOAST lookups."""
        from pgrecv.spark.sparkops import spark_schema

        files = self.data_files()
        if not files or self.schema is None:
            return None
        return literal_read(self.spark).schema(spark_schema(self.schema)).parquet(*[data_file_url(f) for f in files])


def writer_of(
    spark: SparkSession | None, target: TargetPath, fmt: str, engine: str, catalog: str | None
) -> type[Table]:
    """The writer of ``target``'s tables in ``fmt``: spark-apply's choice, by which verify opens the
    same lake. On a store, Delta is delta-rs's unless the connector is asked for by name (delta-rs
    commits with the store's conditional writes; the connector through its single-driver log store)."""
    if fmt == "iceberg":
        from pgrecv.spark.tables.iceberg import iceberg_writer

        return iceberg_writer(catalog)
    from pgrecv.spark.tables.delta_spark import delta_writer
    from pgrecv.spark.tables.parquet import ParquetStoreTable, ParquetTable

    on_store = isinstance(target, StorePath)
    if fmt == "parquet":
        return ParquetStoreTable if on_store else ParquetTable
    return delta_writer(spark, "delta-rs" if on_store and engine == "auto" else engine)
