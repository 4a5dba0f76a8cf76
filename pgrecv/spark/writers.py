"""Targets: one table per PostgreSQL table, each remembering the position applied to it.

Every writer applies a :class:`Batch` in ONE atomic step that also records the batch's end commit
LSN, so a run killed at any moment leaves each table either before or after the batch, and a
re-run skips what is applied:

* :class:`DeltaRsTarget` — delta-rs ``MERGE`` fed with Arrow; the position is the Delta app
  transaction ``pgrecv:<schema>.<table>`` committed with the data.
* :class:`DeltaSparkTarget` — Delta Lake's Spark connector ``MERGE`` (clusters with the jars);
  the same app transaction, through Delta's ``txnAppId``/``txnVersion`` write options.
* :class:`ParquetTarget` — Spark writes a new version directory beside the current one; a
  pointer file (with the position) is replaced atomically, then the ``current`` symlink.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pgrecv.errors import OutputError, UsageError
from pgrecv.output.files import fsync_dir

OP_COL = "_pgrecv_op"  # U upsert, D delete, C close (history), N new version (history)
HISTORY_COLS: list[tuple[str, pa.DataType]] = [
    ("_start_lsn", pa.int64()),
    ("_start_change_lsn", pa.int64()),
    ("_end_lsn", pa.int64()),
    ("_end_change_lsn", pa.int64()),
    ("_start_time", pa.timestamp("us", tz="UTC")),
    ("_end_time", pa.timestamp("us", tz="UTC")),
    ("_current", pa.bool_()),
    ("_deleted", pa.bool_()),
]
HISTORY_NAMES = [n for n, _ in HISTORY_COLS]
POINTER = "_pgrecv_table.json"


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


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


END_COLS = ("_end_lsn", "_end_change_lsn", "_end_time")  # what closing a history version sets


def key_condition(
    left: str, right: str, key_cols: list[str], null_safe: bool, right_cols: list[str] | None = None
) -> Any:
    """Rows of the aliases ``left`` and ``right`` with equal keys (NULL equal to NULL for REPLICA
    IDENTITY FULL, whose key is the whole row). ``right_cols``: the right side's names for the
    key columns, where they differ."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    for k, r in zip(key_cols, right_cols or key_cols, strict=True):
        a, b = F.col(f"{left}.{_q(k)}"), F.col(f"{right}.{_q(r)}")
        cond = cond & (a.eqNullSafe(b) if null_safe else a == b)
    return cond


def close_versions(old: Any, closes: Any, key_cols: list[str], null_safe: bool, names: list[str]) -> Any:
    """History mode: a table's rows ``old`` with the current version of each key in ``closes``
    (its key columns and :data:`END_COLS`) closed: those columns taken from ``closes``, ``_current``
    false. Versions are never dropped. One rule for both writers (the driver's and Spark's)."""
    from pyspark.sql import functions as F

    flag = "_pgrecv_close"
    s = closes.select(*[F.col(_q(c)) for c in (*key_cols, *END_COLS)]).withColumn(flag, F.lit(True)).alias("s")
    joined = old.alias("t").join(s, key_condition("t", "s", key_cols, null_safe) & F.col("t.`_current`"), "left")
    closed = F.col(f"s.{flag}").isNotNull()
    out = []
    for n in names:
        if n in END_COLS:
            out.append(F.when(closed, F.col(f"s.{_q(n)}")).otherwise(F.col(f"t.{_q(n)}")).alias(n))
        elif n == "_current":
            out.append(F.when(closed, F.lit(False)).otherwise(F.col("t.`_current`")).alias(n))
        else:
            out.append(F.col(f"t.{_q(n)}").alias(n))
    return joined.select(*out)


# what marks a table directory as one format's: Delta's log, spark-apply's Parquet pointer
_MARKS = {"delta": ("_delta_log", "a Delta table"), "parquet": (POINTER, "a Parquet table of spark-apply's")}


def refuse_other_format(path: Path, fmt: str) -> None:
    """A table directory of the other format is refused before anything is written: writing
    into it would leave one directory that holds two tables, each reader seeing only its own."""
    for other, (mark, name) in _MARKS.items():
        if other != fmt and (path / mark).exists():
            raise UsageError(f"{path} is {name}: use --format {other} with this target, or another --target")


class Target(ABC):
    """A table under the target path; ``applied``/``schema`` describe it before the batch."""

    def __init__(self, path: Path, app_id: str) -> None:
        self.path = path
        self.app_id = app_id
        self.applied: int | None = None
        self.schema: pa.Schema | None = None
        self.version: int | None = None

    @abstractmethod
    def open(self) -> None: ...

    @abstractmethod
    def scan(
        self, columns: list[str], key_cols: list[str], keys: list[tuple[Any, ...]] | None, current: bool
    ) -> pa.Table:
        """Rows (only ``columns``) whose key is in ``keys`` (all rows if None); history: current only."""

    @abstractmethod
    def write(self, batch: Batch) -> None: ...

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


# --- delta-rs --------------------------------------------------------------------------------


class DeltaRsTarget(Target):
    def open(self) -> None:
        from deltalake import DeltaTable

        refuse_other_format(self.path, "delta")
        if DeltaTable.is_deltatable(str(self.path)):
            dt = DeltaTable(str(self.path))
            self.applied = dt.transaction_version(self.app_id)
            self.schema = pa.schema(dt.schema().to_arrow())
            self.version = dt.version()

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


# --- Delta through Spark (Delta Lake's connector) ----------------------------------------------


class DeltaSparkTarget(Target):
    """Runs where the io.delta jars are on the classpath; tested only there (see tests)."""

    def __init__(self, path: Path, app_id: str, spark: Any) -> None:
        super().__init__(path, app_id)
        self.spark = spark

    def _log(self) -> Any:
        jvm = self.spark.sparkContext._jvm
        return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, str(self.path))

    def open(self) -> None:
        refuse_other_format(self.path, "delta")
        jvm = self.spark.sparkContext._jvm
        if not jvm.io.delta.tables.DeltaTable.isDeltaTable(self.spark._jsparkSession, str(self.path)):
            return
        snapshot = self._log().update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
        txns = self._log().snapshot().transactions() if snapshot is None else snapshot.transactions()
        found = txns.get(self.app_id)
        self.applied = int(found.get()) if found.isDefined() else None
        self.schema = self.spark.read.format("delta").load(str(self.path)).limit(0).toArrow().schema
        self.version = int(snapshot.version())

    def scan(
        self, columns: list[str], key_cols: list[str], keys: list[tuple[Any, ...]] | None, current: bool
    ) -> pa.Table:
        df = self.spark.read.format("delta").load(str(self.path))
        if current:
            df = df.where("_current")
        if keys is not None:
            from pgrecv.spark.sparkops import keys_frame

            df = df.join(keys_frame(self.spark, key_cols, keys, df.schema), on=key_cols, how="left_semi")
        return df.select(*columns).toArrow()

    def write(self, batch: Batch) -> None:
        from pgrecv.spark.sparkops import frame

        src = frame(self.spark, batch.source)
        path = str(self.path)
        jvm = self.spark.sparkContext._jvm
        if not jvm.io.delta.tables.DeltaTable.isDeltaTable(self.spark._jsparkSession, path):
            empty = frame(self.spark, batch.schema.empty_table())
            empty.write.format("delta").save(path)
        # Delta's idempotent DML: the app transaction is committed with the MERGE itself.
        self.spark.conf.set("spark.databricks.delta.write.txnAppId", self.app_id)
        self.spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch.position))
        view = f"pgrecv_src_{uuid.uuid4().hex}"
        src.createOrReplaceTempView(view)
        try:
            eq = " <=> " if batch.null_safe else " = "
            on = " AND ".join(f"(t.{_q(c)}{eq}s.{_q(c)})" for c in batch.key_cols)
            cols = batch.schema.names
            insert = f"INSERT ({', '.join(map(_q, cols))}) VALUES ({', '.join('s.' + _q(c) for c in cols)})"
            sets = ", ".join(f"t.{_q(c)} = s.{_q(c)}" for c in cols)
            if batch.append_only:
                data = src.where(f"{OP_COL} = 'U'").select(*cols)
                data.write.format("delta").mode("overwrite" if batch.truncate else "append").option(
                    "mergeSchema", "true"
                ).option("txnAppId", self.app_id).option("txnVersion", batch.position).save(path)
                return
            self.spark.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")
            if batch.history:
                sql = (
                    f"MERGE INTO delta.`{path}` t USING {view} s ON {on} AND t._current AND s.{OP_COL} = 'C' "
                    "WHEN MATCHED THEN UPDATE SET t._current = false, t._end_lsn = s._end_lsn, "
                    "t._end_change_lsn = s._end_change_lsn, t._end_time = s._end_time "
                    f"WHEN NOT MATCHED AND s.{OP_COL} = 'N' THEN {insert}"
                )
            else:
                sql = (
                    f"MERGE INTO delta.`{path}` t USING {view} s ON {on} "
                    f"WHEN MATCHED AND s.{OP_COL} = 'D' THEN DELETE "
                    f"WHEN MATCHED AND s.{OP_COL} = 'U' THEN UPDATE SET {sets} "
                    f"WHEN NOT MATCHED AND s.{OP_COL} = 'U' THEN {insert}"
                    + (" WHEN NOT MATCHED BY SOURCE THEN DELETE" if batch.truncate else "")
                )
            self.spark.sql(sql)
        finally:
            self.spark.catalog.dropTempView(view)
            self.spark.conf.unset("spark.databricks.delta.write.txnAppId")
            self.spark.conf.unset("spark.databricks.delta.write.txnVersion")


# --- Parquet: versions switched by an atomic pointer ----------------------------------------------


def _atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """``data`` under ``path`` whole or not at all. The temp file has an unpredictable name and is
    created with O_EXCL (mkstemp); ``mode`` None means what the umask allows (lake metadata other
    readers need), else exactly ``mode`` (0600 for raw change data)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is None:
                mask = os.umask(0)
                os.umask(mask)
                mode = 0o666 & ~mask
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


class ParquetTarget(Target):
    """``TABLE/_versions/vNNNNNN/`` data, ``TABLE/_pgrecv_table.json`` the truth, ``TABLE/current``
    a symlink to the current version for readers (``spark.read.parquet("TABLE/current")``)."""

    KEEP = 2  # versions kept: the current one and the one before (readers still on it)

    def __init__(self, path: Path, app_id: str, spark: Any) -> None:
        super().__init__(path, app_id)
        self.spark = spark
        self.pointer: dict[str, Any] | None = None

    def _dir(self, version: int) -> Path:
        return self.path / "_versions" / f"v{version:06d}"

    def open(self) -> None:
        import pyarrow.parquet as pq

        refuse_other_format(self.path, "parquet")
        self._sweep()
        try:
            self.pointer = orjson.loads((self.path / POINTER).read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise OutputError(f"{self.path / POINTER}: unreadable ({exc}): restore it or remove the table") from None
        assert self.pointer is not None
        self.version = int(self.pointer["version"])
        self.applied = int(self.pointer["applied_lsn_int"])
        self.schema = pq.read_schema(self._dir(self.version) / "_schema.parquet")
        self._link(self.version)  # repair a switch a crash interrupted

    def _link(self, version: int) -> None:
        link = self.path / "current"
        want = f"_versions/v{version:06d}"
        with contextlib.suppress(OSError):
            if os.readlink(link) == want:
                return
        tmp = self.path / f".tmp-current-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.symlink(want, tmp)
        os.replace(tmp, link)

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

        from pgrecv.spark.source import literal_read
        from pgrecv.spark.sparkops import empty_frame, frame

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
                    cur = cur.withColumn(field.name, F.lit(None).cast(frame_type(field.type)))
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

    def _switch(self, version: int, mode: str, position: int, key_cols: list[str]) -> None:
        """The new version (already renamed into place) becomes the table: pointer, then link."""
        pointer = {
            "v": 1,
            "format": "parquet",
            "mode": mode,
            "version": version,
            "path": f"_versions/v{version:06d}",
            "applied_lsn": f"{position >> 32:X}/{position & 0xFFFFFFFF:X}",
            "applied_lsn_int": position,
            "key": key_cols,
        }
        _atomic_write(self.path / POINTER, orjson.dumps(pointer, option=orjson.OPT_INDENT_2))
        self._link(version)
        self.version = version
        self._cleanup(version)

    def _sweep(self) -> None:
        """Temp versions and temp pointers a killed run left (even when this run has nothing to write)."""
        for base in (self.path, self.path / "_versions"):
            if not base.is_dir():
                continue
            for entry in base.iterdir():
                if entry.name.startswith(".tmp-"):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)

    def _cleanup(self, version: int) -> None:
        base = self.path / "_versions"
        for entry in base.iterdir():
            name = entry.name
            if name.startswith(".tmp-") or (name.startswith("v") and int(name[1:]) <= version - self.KEEP):
                shutil.rmtree(entry, ignore_errors=True)


def frame_type(arrow: pa.DataType) -> str:
    from pgrecv.spark.types import spark_ddl

    return spark_ddl(arrow)
