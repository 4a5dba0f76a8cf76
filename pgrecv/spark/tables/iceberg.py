"""Apache Iceberg tables through Iceberg's Spark runtime (``--format iceberg``).

By default the tables are in a Hadoop catalog whose warehouse is ``--target`` (no service to run),
each table at ``TARGET/<schema>.<table>`` (the catalog's table of that name in its empty namespace:
the layout of the other formats). The catalog is set in the session at run time, named for the
target (:func:`catalog_of`).

Each batch is ONE Iceberg snapshot whose summary holds the batch's end commit LSN
(:data:`POSITION`): a ``MERGE INTO`` (merge-on-read: deletion vectors, format v3) fed by the
batch's final events, or one write for a new table, a TRUNCATE, a one-pass batch (an overwrite
of the whole table) or ``--append-only``. A MERGE's summary property is attached through
Iceberg's ``CommitMetadata.withCommitProperties`` (a thread-local of the JVM thread that
commits; through Spark Connect, which has no JVM here, the session setting
``spark.sql.iceberg.snapshot-property.*``, one MERGE at a time), a write's through its
``snapshot-property.*`` option. A run killed before the commit
left nothing; one killed after finds the position in the current snapshot's summary.

History mode's ``_deleted`` column is stored as :data:`STORED_DELETED`: Iceberg keeps
``_deleted`` for a metadata column of its own, and Spark reads no table column of that name.

Checked on this machine (2026-12-05, Iceberg 1.12.0, Spark 4.1): the catalog can be set at run
time; MERGE INTO works without Iceberg's SQL extension; a format-v3 merge-on-read MERGE writes a
deletion vector (``added-dvs``); pyiceberg 0.12 reads such a table (``StaticTable.from_metadata``)
with the deletion vector applied.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pyarrow as pa

from pgrecv import failpoints
from pgrecv.errors import InputError, UsageError
from pgrecv.spark.files import file_url
from pgrecv.spark.schema import TablePlan, quoted
from pgrecv.spark.sparkops import is_connect, spark_schema
from pgrecv.spark.stores import TargetPath
from pgrecv.spark.tables import Batch, Table, frames, refuse_other_format
from pgrecv.spark.tables.rewrite import missing_dirs, unmake

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject, JVMView
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

# a table's metadata and snapshots, as Iceberg's JSON holds them
Json = dict[str, object]

POSITION = "pgrecv.applied-lsn"  # the snapshot summary's property: the batch's end commit LSN
# Iceberg (1.9+) puts a session's settings of this prefix into every snapshot's summary it commits
SESSION_PROPERTY = "spark.sql.iceberg.snapshot-property."
_SESSION_WRITES = threading.Lock()  # a session setting serves one statement at a time
_NAMESPACES = threading.Lock()  # a catalog's namespaces made one at a time (IcebergTable._make_namespace)
MODE = "pgrecv.mode"  # the table property: the --mode it was made with
# column names Iceberg keeps for its metadata columns (org.apache.iceberg.MetadataColumns): Spark
# reads no column of these names from an Iceberg table (checked: "SELECT *" fails), so a table
# with one is held back (:func:`check_names`); history mode's own ``_deleted`` is stored as
# :data:`STORED_DELETED`, and read back under its name
RESERVED = ("_file", "_pos", "_deleted", "_spec_id", "_partition", "_row_id", "_last_updated_sequence_number",
            "_change_type", "_change_ordinal", "_commit_snapshot_id")  # fmt: skip
STORED_DELETED = "_is_deleted"
NEW_TABLE = {
    "format-version": "3",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}


def check_names(plan: TablePlan) -> None:
    """A table with a column named as one of Iceberg's metadata columns cannot be an Iceberg
    table that Spark reads: held back, with what to do."""
    for n in plan.columns:
        if n in RESERVED:
            raise InputError(
                f"table {plan.name}: column {n} has the name of one of Iceberg's metadata columns, which Spark "
                "cannot read from an Iceberg table: rename it in PostgreSQL, or apply this table with --format delta "
                "or parquet"
            )


def _stored(name: str) -> str:
    return STORED_DELETED if name == "_deleted" else name


def catalog_of(target: Path) -> str:
    """The name of the target's catalog in the session: one per target, because a session keeps
    each catalog it has loaded (with its warehouse) for its lifetime, and one session may apply
    to several targets (a notebook, Spark Connect, the tests' runner)."""
    digest = hashlib.sha256(file_url(target.resolve()).encode()).hexdigest()[:16]
    return f"pgrecv_iceberg_{digest}"


def use_catalog(spark: SparkSession, target: TargetPath, catalog: str | None = None) -> None:
    """The run's Iceberg catalog: ``catalog`` as the session has it (--iceberg-catalog), else a
    Hadoop catalog whose warehouse is the target, its table cache off (another process, a run
    killed midway or another tool, may have committed meanwhile). Refused in one line when the
    session lacks Iceberg's runtime."""
    from pgrecv.spark.jars import ICEBERG_PACKAGE, iceberg_session

    if not iceberg_session(spark):
        raise UsageError(
            "--format iceberg: Apache Iceberg's Spark runtime is not in this Spark session: give its jars "
            "(--conf spark.jars=... from `mvn -f jvm/pom.xml dependency:copy-dependencies`, or --conf "
            f"spark.jars.packages={ICEBERG_PACKAGE}; a Spark Connect server's own)"
        )
    if catalog is not None:
        if not spark.conf.get(f"spark.sql.catalog.{catalog}", None):
            raise UsageError(
                f"--iceberg-catalog {catalog}: the Spark session has no catalog of that name: set it with --conf "
                f"spark.sql.catalog.{catalog}=org.apache.iceberg.spark.SparkCatalog and its type, uri and warehouse "
                f"(--conf spark.sql.catalog.{catalog}.type=jdbc, ...)"
            )
        return
    assert isinstance(target, Path)  # (targets.check_store: no Hadoop catalog on a store)
    key = f"spark.sql.catalog.{catalog_of(target)}"
    spark.conf.set(key, "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set(f"{key}.type", "hadoop")
    spark.conf.set(f"{key}.warehouse", file_url(target.resolve()))
    spark.conf.set(f"{key}.cache-enabled", "false")


def iceberg_writer(catalog: str | None) -> type[Table]:
    """The Iceberg writer of a run: tables in the session's ``catalog``, or (None) in the
    target's Hadoop catalog."""
    if catalog is None:
        return IcebergTable
    return type("CatalogIcebergTable", (IcebergTable,), {"catalog": catalog})


def _metadata(path: Path) -> Json | None:
    """The table's current metadata, found as the Hadoop catalog finds it (HadoopTableOperations):
    the version hint, else (no hint, or an unreadable one) the highest ``vN.metadata.json``; then
    every next version that exists. A commit writes its metadata file before the hint, so a run
    killed in between leaves a table the hint does not name yet, which Iceberg sees."""
    meta = path / "metadata"
    try:
        version = int((meta / "version-hint.text").read_text().strip())
    except (OSError, ValueError):
        versions = [int(m.group(1)) for f in _names(meta) if (m := _VERSION_FILE.fullmatch(f))]
        if not versions:
            return None
        version = max(versions)
    while (meta / f"v{version + 1}.metadata.json").exists():
        version += 1
    try:
        loaded = orjson.loads((meta / f"v{version}.metadata.json").read_bytes())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


_VERSION_FILE = re.compile(r"v(\d+)\.metadata\.json")


def _names(directory: Path) -> list[str]:
    try:
        return [e.name for e in os.scandir(directory)]
    except OSError:
        return []


def current_snapshot(path: Path, meta: Json | None = None) -> Json | None:
    """The table's current snapshot (its id, summary, ...), read without Spark; None: no table or
    no snapshot."""
    meta = _metadata(path) if meta is None else meta
    snapshots = meta.get("snapshots") if meta is not None else None
    if meta is None or not isinstance(snapshots, list):
        return None
    current = meta.get("current-snapshot-id")
    return next((s for s in snapshots if isinstance(s, dict) and s.get("snapshot-id") == current), None)


def summary_of(snapshot: Json | None) -> dict[str, str]:
    summary = (snapshot or {}).get("summary")
    return {str(k): str(v) for k, v in summary.items()} if isinstance(summary, dict) else {}


def position_of(snapshot: Json | None) -> int | None:
    """The position a snapshot's summary records (None: none)."""
    return _position(summary_of(snapshot))


def _position(summary: dict[str, str]) -> int | None:
    """The position in a snapshot's summary (None: none, or not an LSN's number)."""
    value = summary.get(POSITION)
    return int(value) if value is not None and value.isdigit() else None


def _uuid_columns(batch: Batch) -> set[str]:
    """The batch's uuid columns (strings), which a new Iceberg table or column makes of Iceberg's
    uuid type: exact, and 16 bytes instead of 36 characters."""
    return {
        n
        for n in batch.schema.names
        if batch.pg_types.get(n) == "uuid" and pa.types.is_string(batch.schema.field(n).type)
    }


def _out(rows: DataFrame) -> DataFrame:
    """Rows as an Iceberg table stores them (history mode's ``_deleted`` renamed)."""
    return rows.withColumnRenamed("_deleted", STORED_DELETED)


class IcebergTable(Table):
    """An Iceberg table written by Iceberg's Spark runtime: in the target's Hadoop catalog, its
    state read from its metadata files, or (``catalog`` set) in a catalog of the session, its
    state read through Spark (its ``refs``, ``snapshots`` and properties)."""

    # a local directory in the Hadoop catalog (targets.check_store refuses a store: it renames); with
    # a session's catalog, the table's place under the target (which may be on a store), not its files
    path: TargetPath

    catalog: str | None = None

    def __init__(self, path: TargetPath, app_id: str, spark: SparkSession) -> None:
        super().__init__(path, app_id, spark)
        self._summary: dict[str, str] = {}

    @property
    def local(self) -> Path:
        """The table's directory in the target's Hadoop catalog."""
        assert self.catalog is None and isinstance(self.path, Path)
        return self.path

    @property
    def ident(self) -> str:
        if self.catalog is None:
            return f"{catalog_of(self.local.parent)}.{quoted(self.path.name)}"
        assert self.names is not None
        return ".".join(map(quoted, (self.catalog, *self.names)))

    def exists(self) -> bool:
        return self.local.exists() if self.catalog is None else bool(self.spark.catalog.tableExists(self.ident))

    def open(self) -> None:
        if self.catalog is not None:
            self._open_in_catalog()
            return
        refuse_other_format(self.local, "iceberg")
        meta = _metadata(self.local)
        if meta is None:
            return
        props = meta.get("properties")
        mode = props.get(MODE) if isinstance(props, dict) else None
        self.mode = mode if isinstance(mode, str) else None
        snap = current_snapshot(self.local, meta)
        sid = snap.get("snapshot-id") if snap is not None else None
        if isinstance(sid, int):
            self._opened(sid, summary_of(snap))

    def _open_in_catalog(self) -> None:
        if not self.exists():
            return
        props = {r["key"]: r["value"] for r in self.spark.sql(f"SHOW TBLPROPERTIES {self.ident}").collect()}
        self.mode = props.get(MODE)
        main = self.spark.sql(f"SELECT snapshot_id FROM {self.ident}.refs WHERE name = 'main'").collect()
        if not main:
            return
        sid = int(main[0]["snapshot_id"])
        rows = self.spark.sql(f"SELECT summary FROM {self.ident}.snapshots WHERE snapshot_id = {sid}").collect()
        self._opened(sid, {str(k): str(v) for k, v in (rows[0]["summary"] if rows else {}).items()})

    def _opened(self, sid: int, summary: dict[str, str]) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.version = sid
        self._summary = summary
        self.applied = _position(summary)
        schema = to_arrow_schema(self.spark.table(self.ident).schema)
        self.schema = pa.schema([f.with_name("_deleted") if f.name == STORED_DELETED else f for f in schema])

    def data_files(self) -> list[str]:
        if self.version is None:
            return []
        rows = self.spark.sql(f"SELECT file_path FROM {self.ident}.data_files").collect()
        return [r["file_path"].removeprefix("file:") for r in rows]

    def row_count(self, above: int | None = None) -> int:
        """The current rows, from the snapshot's summary (its records less its deleted positions)."""
        total = int(self._summary.get("total-records", 0))
        return max(0, total - int(self._summary.get("total-position-deletes", 0)))

    def frame(self) -> DataFrame | None:
        if self.version is None:
            return None
        rows = self.spark.read.option("versionAsOf", str(self.version)).table(self.ident)
        return rows.withColumnRenamed(STORED_DELETED, "_deleted") if self.mode == "history" else rows

    def write_frames(self, batch: Batch) -> int:
        made = missing_dirs(self.local) if self.catalog is None else []
        kept = frames.settled(batch) if batch.settle is not None else None
        try:
            self._write(batch)
        except BaseException:
            if self.version is None:
                unmake(made)
            raise
        finally:
            if kept is not None:
                kept.unpersist()
        before = self.version
        self.open()
        return 0 if self.version == before else int(self._summary.get("added-files-size", 0))

    def _make_namespace(self, name: str) -> None:
        """The table's schema as a namespace of the catalog, if missing. Iceberg's JDBC catalog
        checks, then inserts: two new tables of one schema, written at once, both inserted and one
        failed on the key (seen through Spark Connect). So one at a time here, and once more after
        a failure, when another process made it in between (IF NOT EXISTS then sees it)."""
        statement = f"CREATE NAMESPACE IF NOT EXISTS {name}"
        with _NAMESPACES:
            try:
                self.spark.sql(statement)
            except Exception:  # (the JVM's error, through py4j or Spark Connect)
                self.spark.sql(statement)

    def _write(self, batch: Batch) -> None:
        from pyspark.sql import functions as F

        position = {f"snapshot-property.{POSITION}": str(batch.position)}
        if self.version is None:
            if self.catalog is not None and self.names is not None:
                self._make_namespace(f"{quoted(self.catalog)}.{quoted(self.names[0])}")
            props = {**NEW_TABLE, MODE: "history" if batch.history else "latest"}
            rows = _out(frames.new_rows(batch))
            uuids = _uuid_columns(batch)
            if not uuids:
                w = rows.writeTo(self.ident).using("iceberg").options(**position)
                for k, v in props.items():
                    w = w.tableProperty(k, v)
                w.create()  # (never replaces a table: one made meanwhile fails the batch)
                return
            # Spark has no uuid type: the table is made by Iceberg's API, then written (a run killed
            # in between leaves it without a snapshot, and the next writes it)
            if not self.spark.catalog.tableExists(self.ident):
                self._no_connect(uuids)
                self._create(rows.schema, uuids, props)
                if delay := failpoints.iceberg_created_delay():
                    time.sleep(delay)
            rows.writeTo(self.ident).options(**position).append()
            return
        self._add_columns(batch)
        if batch.truncate:
            _out(frames.new_rows(batch)).writeTo(self.ident).options(**position).overwrite(F.lit(True))
        elif batch.append_only:
            _out(frames.new_rows(batch)).writeTo(self.ident).options(**position).append()
        elif batch.final is not None:
            current = self.frame()
            assert current is not None  # (a one-pass batch onto a table that exists)
            rows = _out(frames.whole_table(current, batch))
            rows.writeTo(self.ident).options(**position).overwrite(F.lit(True))
        elif batch.history:
            self._merge_history(batch)
        else:
            self._merge_latest(batch)

    def _add_columns(self, batch: Batch) -> None:
        """Columns the batch adds, each an ALTER TABLE (a metadata commit without a snapshot: a run
        killed after it finds the columns there and merges again); a uuid column by Iceberg's API."""
        have = set(self.schema.names) if self.schema is not None else set()
        uuids = _uuid_columns(batch)
        for f in spark_schema(batch.schema):
            if f.name in have:
                continue
            if f.name in uuids:
                self._no_connect({f.name})
                jvm = self._jvm()
                table = self._iceberg_catalog().loadTable(self._table_identifier())
                table.updateSchema().addColumn(f.name, jvm.org.apache.iceberg.types.Types.UUIDType.get()).commit()
            else:
                add = f"{quoted(_stored(f.name))} {f.dataType.simpleString()}"
                self.spark.sql(f"ALTER TABLE {self.ident} ADD COLUMN {add}")

    def _no_connect(self, uuids: set[str]) -> None:
        """Iceberg's uuid type is made through Iceberg's Java API (Spark has no uuid type):
        through Spark Connect this table is held back, in one line."""
        if is_connect(self.spark):
            raise UsageError(
                f"{self.ident}: uuid column(s) {', '.join(sorted(uuids))} are made of Iceberg's uuid type through "
                "Iceberg's Java API, which Spark Connect does not offer: apply this table with --master"
            )

    def _jvm(self) -> JVMView:
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        return jvm

    def _iceberg_catalog(self) -> JavaObject:
        """The catalog's Iceberg ``Catalog`` (its Spark catalog's ``icebergCatalog()``)."""
        name = self.catalog if self.catalog is not None else catalog_of(self.local.parent)
        return self.spark._jsparkSession.sessionState().catalogManager().catalog(name).icebergCatalog()

    def _table_identifier(self) -> JavaObject:
        """The table's Iceberg ``TableIdentifier``: its directory's name in the Hadoop catalog's
        empty namespace, else ``schema``.``table``."""
        jvm = self._jvm()
        catalog = jvm.org.apache.iceberg.catalog
        if self.catalog is None:
            return catalog.TableIdentifier.of(catalog.Namespace.empty(), self.path.name)
        assert self.names is not None
        levels = self.spark.sparkContext._gateway.new_array(jvm.java.lang.String, 1)  # type: ignore[union-attr]
        levels[0] = self.names[0]
        return catalog.TableIdentifier.of(catalog.Namespace.of(levels), self.names[1])

    def _create(self, schema: StructType, uuids: set[str], props: dict[str, str]) -> None:
        """Makes the table by Iceberg's API: Spark's schema as Iceberg converts it, the ``uuids``
        columns of Iceberg's uuid type (Spark reads and writes them as strings)."""
        jvm = self._jvm()
        types = jvm.org.apache.iceberg.types.Types
        converted = jvm.org.apache.iceberg.spark.SparkSchemaUtil.convert(
            self.spark._jsparkSession.parseDataType(schema.json())
        )
        fields = jvm.java.util.ArrayList()
        for f in converted.columns():
            uuid = f.name() in uuids
            fields.add(types.NestedField.optional(f.fieldId(), f.name(), types.UUIDType.get()) if uuid else f)
        properties = jvm.java.util.HashMap()
        for k, v in props.items():
            properties.put(k, v)
        spec = jvm.org.apache.iceberg.PartitionSpec.unpartitioned()
        self._iceberg_catalog().createTable(
            self._table_identifier(), jvm.org.apache.iceberg.Schema(fields), spec, properties
        )

    def _merge_latest(self, batch: Batch) -> None:
        """MERGE of the final events: a key's delete deletes its row, an upsert updates or inserts it."""
        self._merge(batch, frames.latest_source(batch), *frames.latest_merge_sql(batch))

    def _merge_history(self, batch: Batch) -> None:
        """MERGE of history mode's version rows: the target's current version of each touched key
        is closed (its ``_end_*`` set, ``_current`` false) and every new version inserted."""
        self._merge(batch, _out(frames.history_source(batch)), *frames.history_merge_sql(batch, _stored))

    def _merge(self, batch: Batch, source: DataFrame, on: str, clauses: str) -> None:
        """One ``MERGE INTO`` statement from a temporary view of the source, its commit carrying
        the batch's position."""
        import secrets

        view = f"_pgrecv_source_{secrets.token_hex(8)}"
        source.createOrReplaceTempView(view)
        sql = f"MERGE INTO {self.ident} t USING {view} s ON {on} {clauses}"
        try:
            self._committed_with_position(lambda: self.spark.sql(sql), batch.position)
        finally:
            self.spark.catalog.dropTempView(view)

    def _committed_with_position(self, run: Callable[[], object], position: int) -> None:
        """Runs ``run`` (a statement that commits one snapshot) with the position in that
        snapshot's summary: Iceberg's CommitMetadata, given a Java Callable that calls back here;
        through Spark Connect (no JVM here), the session setting Iceberg also reads
        (:data:`SESSION_PROPERTY`), one statement at a time (it is the session's, not the thread's)."""
        spark = self.spark
        if is_connect(spark):
            with _SESSION_WRITES:
                spark.conf.set(SESSION_PROPERTY + POSITION, str(position))
                try:
                    run()
                finally:
                    spark.conf.unset(SESSION_PROPERTY + POSITION)
            return
        gateway, jvm = spark.sparkContext._gateway, spark.sparkContext._jvm
        assert gateway is not None and jvm is not None
        from pyspark.java_gateway import ensure_callback_server_started

        # PySpark's own way (as foreachBatch): a port of the system's choice, the gateway's secret
        ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]

        class Call:
            def call(self) -> None:
                run()

            class Java:
                implements = ("java.util.concurrent.Callable",)

        props = jvm.java.util.HashMap()
        props.put(POSITION, str(position))
        error = jvm.java.lang.Class.forName("java.lang.RuntimeException")
        jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(props, Call(), error)
