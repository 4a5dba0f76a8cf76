"""Delta tables through Delta Lake's Spark connector (``--delta-engine spark``): each batch is ONE
Delta commit made by the connector itself, a ``MERGE INTO`` fed by the batch's final events (or,
for a new table, a TRUNCATE or ``--append-only``, one write), recording the app transaction
``pgrecv:<schema>.<table>`` = the batch's end commit LSN (Delta's ``txnAppId``/``txnVersion``) in
the same commit. A run killed before the commit left nothing; one killed after it finds the
position recorded and skips the batch. Tables pgrecv creates have deletion vectors on, so that a
sparse update or delete marks rows in the files it touches instead of rewriting them.

The table's state (position, schema, version) is read from its log by delta-rs, which also reads
the tables written here (through ``deltalake.QueryBuilder``: delta-rs's Arrow dataset reader does
not apply deletion vectors and refuses such tables).
"""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pyarrow as pa

from pgrecv.errors import OutputError, UsageError
from pgrecv.spark.files import file_url
from pgrecv.spark.schema import quoted
from pgrecv.spark.sparkops import is_connect
from pgrecv.spark.stores import StorePath, TargetPath
from pgrecv.spark.tables import MODE_APP_ID, Batch, Table, frames, refuse_other_format
from pgrecv.spark.tables.delta import delta_table, read_log
from pgrecv.spark.tables.rewrite import END_COLS, ROWS_PER_FILE, missing_dirs, unmake

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_SESSION_WRITES = threading.Lock()  # through Spark Connect the app transaction is the session's conf
# what a new table is created with (Delta table properties)
NEW_TABLE = {"delta.enableDeletionVectors": "true"}


class DeltaSparkTable(Table):
    """A Delta table written and committed by Delta's Spark connector."""

    def __init__(self, path: TargetPath, app_id: str, spark: Any) -> None:
        super().__init__(path, app_id, spark)
        self._files: list[str] = []

    def open(self) -> None:
        refuse_other_format(self.path, "delta")
        dt = delta_table(self.path)
        if dt is None:
            return
        table = read_log(self, dt)
        self._files = sorted(self._name(p) for p in table.column("path").to_pylist())

    def _name(self, rel: str) -> str:
        """A data file's name from its path in the log: a local path, or its ``s3a://`` URL (as the
        delta-rs writer names them)."""
        from urllib.parse import unquote

        if isinstance(self.path, StorePath):
            return f"{self.path.spark_url}/{unquote(rel)}"
        return str(self.path / unquote(rel))

    def data_files(self) -> list[str]:
        """The current version's data files. With deletion vectors some of their rows are deleted:
        the engine only counts them (which file sizes a batch takes), never reads them as rows."""
        return list(self._files)

    def frame(self) -> Any:
        """The current rows, read through the connector at the version opened (deletion vectors applied)."""
        if self.version is None:
            return None
        return self.spark.read.format("delta").option("versionAsOf", self.version).load(file_url(self.path))

    def write_frames(self, batch: Batch) -> int:
        made = missing_dirs(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        kept = None
        try:
            if batch.settle is not None:
                kept = frames.settled(batch)
            self._write(batch)
        except BaseException as exc:
            if self.version is None:
                unmake(made)
            if _is_conflict(exc):
                raise _conflict(self.path, exc) from None
            raise
        finally:
            if kept is not None:
                kept.unpersist()
        return self._reopen()

    def _write(self, batch: Batch) -> None:
        rows = frames.new_rows(batch)
        if self.version is None or batch.truncate:
            new = self.version is None
            self._save(self._clustered(rows, batch), batch, "append" if new else "overwrite")
            if new:
                self._record_mode(batch)
            return
        if batch.append_only:
            self._save(rows, batch, "append")
            return
        self._add_columns(batch)
        if batch.history:
            self._merge_history(batch)
        elif batch.final is not None:
            self._overwrite(batch)
        else:
            self._merge_latest(batch)

    def _overwrite(self, batch: Batch) -> None:
        """A one-pass batch: one overwrite of the whole table (:func:`frames.whole_table`), its
        current rows read at the version opened; the target's lock keeps other runs out meanwhile."""
        self._save(self._clustered(frames.whole_table(self.frame(), batch), batch), batch, "overwrite")

    def _clustered(self, rows: Any, batch: Batch) -> Any:
        """A whole table's rows in key order, so that nearby keys share a file (as the other writers)."""
        from pyspark.sql import functions as F

        if not batch.key_cols:
            return rows
        keys = [F.col(quoted(k)) for k in batch.key_cols]
        rows = rows.coalesce(1) if batch.single else rows.repartitionByRange(*keys)
        return rows.sortWithinPartitions(*keys)

    def _save(self, rows: Any, batch: Batch, mode: str) -> None:
        """One write (a new table, a TRUNCATE's overwrite, an append) with the app transaction."""
        w = (
            rows.write.format("delta")
            .mode(mode)
            .option("txnAppId", self.app_id)
            .option("txnVersion", str(batch.position))
            .option("mergeSchema", "true")
            .option("maxRecordsPerFile", ROWS_PER_FILE)
        )
        if self.version is None:
            for k, v in NEW_TABLE.items():
                w = w.option(k, v)
        w.save(file_url(self.path))

    def _record_mode(self, batch: Batch) -> None:
        """The --mode the table is made with, as the delta-rs writer records it (MODE_APP_ID): an app
        transaction, here in a commit of its own right after the one that made the table (a write
        carries one transaction). A run killed between the two leaves it unrecorded, and the
        table's columns tell its mode (tables.mode_of)."""
        from pgrecv.spark.sparkops import spark_schema

        empty = self.spark.createDataFrame([], spark_schema(batch.schema))
        mode = MODE_APP_ID + ("history" if batch.history else "latest")
        empty.write.format("delta").mode("append").option("txnAppId", mode).option("txnVersion", "1").save(
            file_url(self.path)
        )

    def _add_columns(self, batch: Batch) -> None:
        """Columns the batch adds, in a commit of their own before the merge (no rows, no position:
        a run killed after it finds the columns there and merges again)."""
        have = set(self.schema.names) if self.schema is not None else set()
        new = [f for f in batch.schema if f.name not in have]
        if not new:
            return
        from pgrecv.spark.sparkops import spark_schema

        empty = self.spark.createDataFrame([], spark_schema(pa.schema(new)))
        empty.write.format("delta").mode("append").option("mergeSchema", "true").save(file_url(self.path))

    def _merge_latest(self, batch: Batch) -> None:
        """MERGE of the final events: a key's delete deletes its row, an upsert updates or inserts it."""
        from pyspark.sql import functions as F

        if is_connect(self.spark):
            self._merge_sql(batch, frames.latest_source(batch), *frames.latest_merge_sql(batch))
            return
        values = {quoted(n): F.col(f"s.{quoted(n)}") for n in batch.schema.names}
        kind = F.col("s." + frames.own(batch, "kind"))
        self._merge(
            batch,
            frames.latest_source(batch),
            frames.matches(batch),
            [("delete", kind == "D", None), ("update", None, values)],
            (kind == "U", values),
        )

    def _merge_history(self, batch: Batch) -> None:
        """MERGE of history mode's version rows: the target's current version of each touched key
        is closed (its ``_end_*`` set, ``_current`` false) and every new version inserted."""
        from pyspark.sql import functions as F

        if is_connect(self.spark):
            self._merge_sql(batch, frames.history_source(batch), *frames.history_merge_sql(batch))
            return
        op = F.col("s." + frames.own(batch, "op"))
        on = (op == "C") & F.col("t.`_current`") & frames.matches(batch)
        close = {**{quoted(c): F.col(f"s.{quoted(c)}") for c in END_COLS}, "`_current`": F.lit(False)}
        insert = {quoted(n): F.col(f"s.{quoted(n)}") for n in batch.schema.names}
        self._merge(batch, frames.history_source(batch), on, [("update", None, close)], (op == "I", insert))

    def _merge(
        self,
        batch: Batch,
        source: Any,
        on: Any,
        matched: list[tuple[str, Any, dict[str, Any] | None]],
        not_matched: tuple[Any, dict[str, Any]],
    ) -> None:
        """One MERGE through Delta's Scala API, in a copy of the run's session whose SQL conf names
        the app transaction: Delta checks it (a recorded position at or past it skips the merge)
        and records it in the merge's commit. A copy per table, because tables are applied side by
        side and the conf is the session's."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        session = self.spark._jsparkSession.cloneSession()
        session.conf().set(TXN_APP_ID, self.app_id)
        session.conf().set(TXN_VERSION, str(batch.position))
        target = jvm.io.delta.tables.DeltaTable.forPath(session, file_url(self.path)).alias("t")
        builder = target.merge(source.alias("s")._jdf, on._jc)

        def scala(cols: dict[str, Any]) -> Any:
            return jvm.PythonUtils.toScalaMap({k: c._jc for k, c in cols.items()})

        for action, cond, cols in matched:
            clause = builder.whenMatched() if cond is None else builder.whenMatched(cond._jc)
            builder = clause.delete() if action == "delete" else clause.update(scala(cols or {}))
        cond, cols = not_matched
        builder = builder.whenNotMatched(cond._jc).insert(scala(cols))
        builder.execute()

    def _merge_sql(self, batch: Batch, source: Any, on: str, clauses: str) -> None:
        """Through Spark Connect (no JVM here for Delta's Scala API): one ``MERGE INTO`` statement
        from a temporary view of the source, with the app transaction in the session's conf, which
        Delta reads as it does for the Scala API's merge. One statement at a time, since the conf
        is the session's (a cloned session is a JVM object)."""
        import secrets

        view = f"_pgrecv_source_{secrets.token_hex(8)}"
        source.createOrReplaceTempView(view)
        sql = f"MERGE INTO delta.{quoted(file_url(self.path))} t USING {view} s ON {on} {clauses}"
        try:
            with _SESSION_WRITES:
                self.spark.conf.set(TXN_APP_ID, self.app_id)
                self.spark.conf.set(TXN_VERSION, str(batch.position))
                try:
                    self.spark.sql(sql)
                finally:
                    self.spark.conf.unset(TXN_APP_ID)
                    self.spark.conf.unset(TXN_VERSION)
        finally:
            self.spark.catalog.dropTempView(view)

    def _reopen(self) -> int:
        """Reads the table's new state; the bytes its commits wrote: new data files and deletion
        vectors of their own (a file the batch only marks is added again with its deletion
        vector, and not written again)."""
        had = set(self._files)
        before = self.version
        dt = delta_table(self.path)
        assert dt is not None  # (a table the run has just committed to)
        self.version = dt.version()
        if self.version == before:
            return 0
        written = 0
        lines = [
            line
            for v in range(0 if before is None else before + 1, self.version + 1)
            for line in (self.path / "_delta_log" / f"{v:020d}.json").read_bytes().splitlines()
        ]
        for line in lines:
            action = orjson.loads(line)
            add = action.get("add")
            if add:
                if self._name(add["path"]) not in had:
                    written += int(add.get("size") or 0)
                dv = add.get("deletionVector") or {}
                if dv.get("storageType") == "u":  # a deletion vector file of its own
                    written += int(dv.get("sizeInBytes") or 0)
        return written


_CONFLICTS = ("ConcurrentAppendException", "ConcurrentDelete", "ConcurrentTransactionException",
              "ConcurrentWriteException", "MetadataChangedException", "ProtocolChangedException",
              "DELTA_CONCURRENT")  # fmt: skip


def _is_conflict(exc: BaseException) -> bool:
    text = str(exc)
    return any(c in text for c in _CONFLICTS)


def _conflict(path: TargetPath, exc: BaseException) -> OutputError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return OutputError(
        f"{path}: another writer committed to this Delta table meanwhile ({first}): "
        "run spark-apply again (one run per target at a time)"
    )


def delta_writer(spark: Any, engine: str) -> type[Table]:
    """The Delta writer of a run: delta-rs, or Delta's Spark connector where the session has it
    (``auto``) or where ``--delta-engine spark`` asks for it (refused without it)."""
    from pgrecv.spark.jars import delta_session
    from pgrecv.spark.tables.delta import DeltaRsTable

    if engine == "delta-rs" or spark is None:  # (no session: nothing to read, nothing written)
        return DeltaRsTable
    if is_connect(spark):
        if engine != "spark":
            return DeltaRsTable  # (auto's choice: the server's Delta setup is its own)
        if not delta_session(spark):
            from pgrecv.spark.jars import DELTA_CATALOG, DELTA_EXTENSION

            raise UsageError(
                "--delta-engine spark through Spark Connect: the server has no Delta Lake connector set up: start "
                f"it with Delta's jars, spark.sql.extensions={DELTA_EXTENSION} and "
                f"spark.sql.catalog.spark_catalog={DELTA_CATALOG}"
            )
        return DeltaSparkTable
    if delta_session(spark):
        return DeltaSparkTable
    if engine == "spark":
        from pgrecv.spark.jars import DELTA_CATALOG, DELTA_EXTENSION

        raise UsageError(
            "--delta-engine spark: Delta Lake's Spark connector is not in this Spark session: give its jars "
            "(--conf spark.jars=... from `mvn -f jvm/pom.xml dependency:copy-dependencies`, or --conf "
            "spark.jars.packages=io.delta:delta-spark_4.1_2.13:4.4.0) and, under spark-submit, "
            f"spark.sql.extensions={DELTA_EXTENSION} and spark.sql.catalog.spark_catalog={DELTA_CATALOG}"
        )
    return DeltaRsTable
