"""The oracle's writes: an Arrow batch applied in the driver through the product's tables.

Each writer applies a :class:`Batch` in ONE atomic step that also records the batch's end
commit LSN, as the product's do: Delta through delta-rs ``MERGE`` fed with Arrow (its app
transaction committed with the data), Parquet by Spark writing a new version directory and the
product's pointer switch.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgrecv.output.files import fsync_dir
from pgrecv.spark.files import literal_read
from pgrecv.spark.schema import quoted as _q
from pgrecv.spark.schema import spark_ddl
from pgrecv.spark.sparkops import empty_frame, frame
from pgrecv.spark.tables.delta import DeltaRsTable
from pgrecv.spark.tables.parquet import ParquetTable
from pgrecv.spark.tables.rewrite import close_versions, key_condition

OP_COL = "_pgrecv_op"  # U upsert, D delete, C close (history), N new version (history)


@dataclass
class Batch:
    """What one table's batch does, as Arrow: ``source`` has every column plus ``_pgrecv_op``."""

    schema: pa.Schema  # the target's columns after this batch (without _pgrecv_op)
    key_cols: list[str]
    null_safe: bool  # keys may hold NULLs (REPLICA IDENTITY FULL): compare with IS NOT DISTINCT FROM
    truncate: bool
    source: pa.Table
    history: bool
    append_only: bool
    position: int  # end commit LSN of the batch


def hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    return value


def _scan(
    ds: Any, columns: list[str], key_cols: list[str], keys: list[tuple[Any, ...]] | None, current: bool
) -> pa.Table:
    """``columns`` of the rows whose key may be in ``keys`` (the caller matches them exactly), the
    key filter pushed down to the files where Arrow can. Arrow cannot always compare the filter
    with the file statistics of a delta-rs table (seen on a string key: "Function 'greater_equal'
    has no kernel matching input types (string, string_view)"): then the rows are filtered after
    the read."""
    cur = pc.field("_current") == True if current else None  # noqa: E712 - an Arrow expression
    filt = _key_filter(key_cols, keys) if keys is not None else None
    if filt is None:
        return ds.to_table(columns=columns, filter=cur)
    try:
        return ds.to_table(columns=columns, filter=filt if cur is None else filt & cur)
    except pa.ArrowNotImplementedError:
        table = ds.to_table(columns=list(dict.fromkeys([*columns, key_cols[0]])), filter=cur)
        return table.filter(filt).select(columns)


def _key_filter(key_cols: list[str], keys: list[tuple[Any, ...]]) -> Any:
    first = [k[0] for k in keys if k[0] is not None]
    if not first or len(first) != len(keys):
        return None
    try:
        return pc.field(key_cols[0]).isin(first)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


class _Lookup:
    """Rows of the table by key (unchanged-TOAST values the batch cannot supply)."""

    schema: pa.Schema | None

    def scan(
        self, columns: list[str], key_cols: list[str], keys: list[tuple[Any, ...]] | None, current: bool
    ) -> pa.Table:
        """Rows (only ``columns``) whose key is in ``keys`` (all rows if None); history: current only."""
        raise NotImplementedError

    def lookup(
        self, key_cols: list[str], keys: list[tuple[Any, ...]], columns: list[str], history: bool
    ) -> dict[tuple[Any, ...], dict[str, Any]]:
        if self.schema is None or not keys:
            return {}
        have = set(self.schema.names)
        cols = [c for c in dict.fromkeys(key_cols + columns) if c in have]
        table = self.scan(cols, key_cols, keys, history)
        wanted = set(keys)
        out: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in table.to_pylist():
            k = tuple(hashable(row.get(c)) for c in key_cols)
            if k in wanted:
                out[k] = row
        return out


class OracleDelta(_Lookup, DeltaRsTable):
    """The product's Delta table, written by delta-rs MERGE from Arrow."""

    def scan(
        self, columns: list[str], key_cols: list[str], keys: list[tuple[Any, ...]] | None, current: bool
    ) -> pa.Table:
        from deltalake import DeltaTable

        ds = DeltaTable(str(self.path)).to_pyarrow_dataset()
        return _scan(ds, columns, key_cols, keys, current)

    def write(self, batch: Batch) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        commit = CommitProperties(app_transactions=[Transaction(self.app_id, batch.position)])
        path = str(self.path)
        if not DeltaTable.is_deltatable(path):
            DeltaTable.create(path, schema=batch.schema)
        dt = DeltaTable(path)
        names = batch.schema.names
        src = batch.source
        if batch.append_only:
            data = src.filter(pc.equal(src[OP_COL], "U")).select(names)
            write_deltalake(
                dt,
                data,
                mode="overwrite" if batch.truncate else "append",
                schema_mode="merge",
                commit_properties=commit,
            )
        else:
            eq = " IS NOT DISTINCT FROM " if batch.null_safe else " = "
            pred = " AND ".join(f"(t.{_q(c)}{eq}s.{_q(c)})" for c in batch.key_cols)
            if batch.history:
                pred += " AND t.`_current` = true AND s.`_pgrecv_op` = 'C'"
            merger = dt.merge(
                src, pred, source_alias="s", target_alias="t", merge_schema=True, commit_properties=commit
            )
            every = {_q(c): f"s.{_q(c)}" for c in names}
            if batch.history:
                ends = ["_end_lsn", "_end_change_lsn", "_end_time"]
                closing = {_q(c): f"s.{_q(c)}" for c in ends} | {"`_current`": "false"}
                merger = merger.when_matched_update(closing).when_not_matched_insert(
                    every, predicate="s.`_pgrecv_op` = 'N'"
                )
            else:
                merger = (
                    merger.when_matched_delete(predicate="s.`_pgrecv_op` = 'D'")
                    .when_matched_update(every, predicate="s.`_pgrecv_op` = 'U'")
                    .when_not_matched_insert(every, predicate="s.`_pgrecv_op` = 'U'")
                )
                if batch.truncate:
                    merger = merger.when_not_matched_by_source_delete()
            merger.execute()
        self.version = DeltaTable(path).version()


class OracleParquet(_Lookup, ParquetTable):
    """The product's Parquet table, a new version written by Spark from Arrow."""

    def scan(
        self, columns: list[str], key_cols: list[str], keys: list[tuple[Any, ...]] | None, current: bool
    ) -> pa.Table:
        import pyarrow.dataset as pads

        assert self.version is not None
        ds = pads.dataset(str(self._dir(self.version)), format="parquet", schema=self.schema)
        return _scan(ds, columns, key_cols, keys, current)

    def write(self, batch: Batch) -> None:
        import pyarrow.parquet as pq
        from pyspark.sql import functions as F

        spark = self.spark
        names = batch.schema.names
        src = frame(spark, batch.source)
        if self.version is None or (batch.truncate and not batch.history):
            cur = empty_frame(spark, batch.schema)
        else:
            assert self.schema is not None
            cur = (
                literal_read(spark)
                .schema(frame(spark, self.schema.empty_table()).schema)
                .parquet(str(self._dir(self.version)))
            )
            for field in batch.schema:
                if field.name not in cur.columns:
                    cur = cur.withColumn(field.name, F.lit(None).cast(spark_ddl(field.type)))
        cond = key_condition("t", "s", batch.key_cols, batch.null_safe)
        if batch.append_only:
            new = cur.select(*names).unionByName(src.where(F.col(OP_COL) == "U").select(*names))
        elif batch.history:
            closes = src.where(F.col(OP_COL) == "C")
            new = close_versions(cur, closes, batch.key_cols, batch.null_safe, names)
            new = new.unionByName(src.where(F.col(OP_COL) == "N").select(*names))
        else:
            keys = src.select(*[F.col(_q(k)) for k in batch.key_cols]).alias("s")
            kept = cur.alias("t").join(keys, cond, "left_anti").select(*names)
            new = kept.unionByName(src.where(F.col(OP_COL) == "U").select(*names))
        version = (self.version or 0) + 1
        final = self._dir(version)
        tmp = self.path / "_versions" / f".tmp-v{version:06d}-{uuid.uuid4().hex[:8]}"
        self.path.joinpath("_versions").mkdir(parents=True, exist_ok=True)
        if final.exists():  # left by a run killed after the rename and before the pointer switch
            shutil.rmtree(final)
        new.write.mode("error").parquet(str(tmp))
        pq.write_metadata(batch.schema, tmp / "_schema.parquet")  # the schema even when empty
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        os.rename(tmp, final)
        fsync_dir(final.parent)
        self._switch(version, "history" if batch.history else "latest", batch.position, batch.key_cols)
