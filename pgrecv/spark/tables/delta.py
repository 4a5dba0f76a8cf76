"""Delta tables through delta-rs: Spark writes the data files into the table's directory, and
delta-rs commits them (with the removal of the files they replace and the app transaction
``pgrecv:<schema>.<table>`` recording the position) in one atomic commit."""

from __future__ import annotations

import re
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from pgrecv.errors import OutputError, UsageError
from pgrecv.spark.stores import StorePath, TargetPath, delta_location, parquet_metadata, remove_tree
from pgrecv.spark.tables import MODE_APP_ID, Batch, Table, refuse_other_format
from pgrecv.spark.tables.rewrite import fsync_files, missing_dirs, rewrite_for, unmake

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession


def read_log(table: Table, dt: DeltaTable) -> pa.Table:
    """Sets ``table``'s applied position, schema, version and recorded mode from the current version
    of its Delta log (both Delta writers keep them there alike); returns the version's add actions
    (``path``, ``size_bytes``, ...)."""
    table.applied = dt.transaction_version(table.app_id)
    table.schema = pa.schema(dt.schema().to_arrow())
    table.version = dt.version()
    table.mode = next((m for m in ("latest", "history") if dt.transaction_version(MODE_APP_ID + m)), None)
    actions = dt.get_add_actions(flatten=True)
    return pa.table(actions) if not isinstance(actions, pa.Table) else actions


def delta_table(path: TargetPath) -> DeltaTable | None:
    """The Delta table at ``path`` (a local directory or a key prefix of a store); None: none there."""
    from deltalake import DeltaTable

    where, options = delta_location(path)
    if not DeltaTable.is_deltatable(where, storage_options=options):
        return None
    return DeltaTable(where, storage_options=options)


class DeltaRsTable(Table):
    """A Delta table written by Spark and committed by delta-rs."""

    def __init__(self, path: TargetPath, app_id: str, spark: SparkSession) -> None:
        super().__init__(path, app_id, spark)
        self._files: dict[str, int] = {}  # path relative to the table → size, as in the log
        escape = re.search(r"%[0-9A-Fa-f]{2}", str(path))
        if escape:
            # delta-rs takes it for an escaped character in every form of the path (measured with
            # deltalake 1.6: the data files land under the literal path, the log is read from the
            # decoded one, and a symlink is resolved first)
            raise UsageError(
                f"{path}: delta-rs reads {escape.group()!r} in a path as an escaped character: "
                "choose a --target without it for --format delta, or use --format parquet"
            )

    def open(self) -> None:
        refuse_other_format(self.path, "delta")
        dt = delta_table(self.path)
        if dt is None:
            return
        if "deletionVectors" in (dt.protocol().reader_features or []):
            # its files hold rows deleted by deletion vectors, which this writer would read back
            raise UsageError(
                f"{self.path} has deletion vectors (written by Delta Lake's Spark connector): apply it with "
                "--delta-engine spark and the connector's jars"
            )
        table = read_log(self, dt)
        paths = table.column("path").to_pylist()
        sizes = table.column("size_bytes").to_pylist()
        self._files = dict(zip(paths, sizes, strict=True))

    def data_files(self) -> list[str]:
        return [self._name(p) for p in sorted(self._files)]

    def _name(self, rel: str) -> str:
        """A data file's name, from its path in the log: a local path, or its ``s3a://`` URL
        (as Spark's ``_metadata.file_path`` gives it back)."""
        if isinstance(self.path, StorePath):
            return f"{self.path.spark_url}/{_unq(rel)}"
        return str(self.path / _unq(rel))

    def write_frames(self, batch: Batch) -> int:
        from deltalake import CommitProperties, Transaction
        from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

        current = self.data_files()
        rw = rewrite_for(self.spark, batch, current, self.schema)
        dropped, rows = rw.plan()
        sub = f"pgrecv-{uuid.uuid4().hex}"
        made = missing_dirs(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            written = rw.write(rows, self.path / sub, dropped)
            if batch.settle is not None:
                batch.settle()
        except BaseException:
            remove_tree(self.path / sub)  # no commit names these files
            unmake(made)
            raise
        for f in (self.path / sub).iterdir():
            if f not in written:
                f.unlink()
        sizes = {f: f.stat().st_size for f in written}
        if not isinstance(self.path, StorePath):
            fsync_files(written)  # (an object is durable once its PUT returned)
        now = int(time.time() * 1000)
        adds = []
        for f in written:
            meta = parquet_metadata(self._name(f"{sub}/{f.name}"))
            adds.append(
                AddAction(
                    path=f"{sub}/{f.name}",
                    size=sizes[f],
                    partition_values={},
                    modification_time=now,
                    data_change=True,
                    stats=orjson.dumps({"numRecords": meta.num_rows}).decode(),
                )
            )
        by_local = {self._name(p): p for p in self._files}
        removes = [
            RemoveAction(path=by_local[f], data_change=True, deletion_timestamp=now, size=self._files[by_local[f]])
            for f in dropped
        ]
        applied = Transaction(self.app_id, batch.position)
        commit = CommitProperties(app_transactions=[applied])
        where, options = delta_location(self.path)
        try:
            self.guard()
        except BaseException:
            remove_tree(self.path / sub)
            raise
        try:
            if self.version is None:
                create_table_with_add_actions(
                    where,
                    _delta_schema(batch.schema),
                    adds,
                    mode="error",
                    # the mode it is made with, in the same commit (MODE_APP_ID)
                    commit_properties=CommitProperties(
                        app_transactions=[
                            applied,
                            Transaction(MODE_APP_ID + ("history" if batch.history else "latest"), 1),
                        ]
                    ),
                    storage_options=options,
                )
            else:
                self._add_columns(batch.schema)
                _existing(self.path).create_write_transaction(
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
        self.version = _existing(self.path).version()
        return sum(sizes.values())

    def _add_columns(self, schema: pa.Schema) -> None:
        """Columns the batch adds (a relation record with a new column) join the table's schema
        first, in a commit of their own: delta-rs commits added files under the schema the log
        has, and a reader would not see a column the log does not name (the values were in the
        files, invisible). A run stopped between the two commits leaves the column in the schema,
        NULL in every row, and the position where it was: the next run applies the batch again."""
        have = set(self.schema.names) if self.schema is not None else set()
        added = [f for f in schema if f.name not in have]
        if added:
            _existing(self.path).alter.add_columns(list(_delta_schema(pa.schema(added)).fields))


def _existing(path: TargetPath) -> DeltaTable:
    dt = delta_table(path)
    assert dt is not None  # (a table this run opened, or just made)
    return dt


def _unq(p: str) -> str:
    from urllib.parse import unquote

    return unquote(p)


def _delta_schema(schema: pa.Schema) -> Any:
    from deltalake import Schema

    return Schema.from_arrow(schema)
