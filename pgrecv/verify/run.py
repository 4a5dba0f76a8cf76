"""``pgrecv verify``: PostgreSQL and the lake compared at one exact position.

The position: a temporary slot made with an exported snapshot gives a consistent point C and a
view of every table holding exactly the transactions that commit before C. With catch-up (the
default), the user's slot is streamed into the change directory up to C (``start --endpos``: a
transaction committing at C or later is not taken) and the files are applied, so every table of
the lake holds exactly those transactions too. The snapshot stays imported in one transaction
for the whole comparison, while the source goes on writing. Without catch-up the lake is compared
as it is, and a table applied only up to an earlier position shows its lag as differences.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from pgrecv.errors import SlotError, UsageError
from pgrecv.lsn import LSN, lsn_str
from pgrecv.pg.conn import ConnOptions, connect, server_major, translate
from pgrecv.spark.model import BadValues, Name, Progress
from pgrecv.verify.canon import canon
from pgrecv.verify.compare import TableDiff, compare
from pgrecv.verify.sides import LakeSide, PgSide, Plan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pgrecv.snapshot.core import Table as PgTable
    from pgrecv.spark.model import Summary
    from pgrecv.spark.stores import TargetPath
    from pgrecv.spark.tables import Table as LakeTable


@dataclass(frozen=True)
class VerifyConfig:
    opts: ConnOptions
    slot: str
    target: TargetPath  # a local directory or a prefix on S3, as spark-apply's
    fmt: str  # delta, parquet or iceberg
    tables: tuple[str, ...] = ()
    publication: str | None = None
    source: str | None = None  # the change directory; None: compare the lake as it is
    master: str | None = None
    remote: str | None = None  # a Spark Connect server (sc://HOST:PORT): the lake's side runs there
    conf: dict[str, str] = field(default_factory=dict)
    # as given to spark-apply: its catch-up applies with them, and the comparison follows them
    keys: dict[Name, tuple[str, ...]] = field(default_factory=dict)
    append_only: bool = False
    bad_values: BadValues = "fail"
    catalog: str | None = None  # --format iceberg: the session's catalog (None: the Hadoop one under --target)


@dataclass
class TableReport:
    name: str
    status: str  # equal, different, missing (no such table in the lake), not compared, only in the lake
    key: tuple[str, ...] = ()
    applied: int | None = None  # the lake table's applied position
    diff: TableDiff | None = None
    not_compared: tuple[str, ...] = ()  # columns without a shared canonical form
    note: str = ""

    @property
    def differs(self) -> bool:
        """A difference: one not compared, or only in the lake (named in the report), is none."""
        return self.status not in ("equal", "not compared", "only in the lake")


@dataclass
class Report:
    lsn: int  # the snapshot's consistent point: the lake and PostgreSQL hold what commits before it
    caught_up: bool
    tables: list[TableReport] = field(default_factory=list)
    applied: Summary | None = None

    @property
    def equal(self) -> bool:
        return not any(t.differs for t in self.tables)


def run_verify(
    config: VerifyConfig,
    catch_up: Callable[[int], None] | None,
    log: Callable[[str], None] = lambda _m: None,
    spark: SparkSession | None = None,
    progress: Progress | None = None,
) -> Report:
    """Compares every published table (``config.tables``: globs) of PostgreSQL and the lake at one
    position; ``catch_up(C)`` streams the slot into ``config.source`` up to C (None: no catch-up)."""
    from pgrecv.pg.slots import create_slot_command, get_slot, resolve_publication
    from pgrecv.snapshot.core import import_snapshot, list_tables
    from pgrecv.spark import stores
    from pgrecv.spark.targets import check_store

    if config.fmt not in ("delta", "parquet", "iceberg"):
        raise UsageError(f"verify compares --format delta, parquet or iceberg tables, not {config.fmt}")
    check_store(config.target, config.fmt, config.catalog)
    if isinstance(config.target, stores.StorePath) and config.target.scheme == "gs":
        raise UsageError(f"--target {config.target}: verify does not read a lake on gs:// yet (S3 and local ones: yes)")
    stores.use_conf(config.conf)  # (the store's settings, for the table files the driver reads a footer of)
    if not config.target.is_dir():
        where = "no such directory" if isinstance(config.target, Path) else "nothing under that prefix"
        raise UsageError(f"--target {config.target}: {where}: give spark-apply's --target")
    with connect(config.opts) as meta:
        row = get_slot(meta, config.slot)
        if row is None:
            raise SlotError(
                f'replication slot "{config.slot}" does not exist: give the slot that spark-apply\'s files come from'
            )
        # the tables the slot's changes hold: a pgoutput slot's publication's, a test_decoding slot's all
        plugin = "test_decoding" if row.get("plugin") == "test_decoding" else "pgoutput"
        publication = resolve_publication(meta, config.publication) if plugin == "pgoutput" else None
        block_size = int(meta.execute("SELECT current_setting('block_size')").fetchone()[0])  # type: ignore[index]
    if catch_up is not None and row.get("active"):
        raise SlotError(
            f'replication slot "{config.slot}" is in use (a pgrecv start running?): verify streams it up to its '
            "snapshot: stop the stream and run verify again, or compare the lake as it is with --no-catch-up"
        )
    conn = connect(config.opts)
    try:
        rconn = connect(config.opts, replication=True)
        try:
            major = server_major(rconn)
            name = f"pgrecv_verify_{secrets.token_hex(6)}"
            command = create_slot_command(
                name, "pgoutput", major, export=True, two_phase=False, failover=False, temporary=True
            )
            made = rconn.execute(command).fetchone()
            assert made is not None
            cp = int(LSN.parse(made[1]))
            import_snapshot(conn, str(made[2]))
        except psycopg.Error as exc:
            raise translate(exc) from None
        finally:
            rconn.close()  # the temporary slot goes; the imported snapshot stays with conn's transaction
        log(f"snapshot at {lsn_str(cp)}")
        tables = list_tables(conn, plugin, publication, major, config.tables, block_size)
        report = Report(cp, catch_up is not None)
        if catch_up is not None:
            confirmed = _confirmed(conn, config.slot)
            if confirmed is not None and confirmed > cp:
                raise SlotError(
                    f'replication slot "{config.slot}" was confirmed past the snapshot ({lsn_str(confirmed)} > '
                    f"{lsn_str(cp)}) while verify took it: another consumer is streaming it; run verify again"
                )
            began = time.monotonic()
            catch_up(cp)
            log(f"caught up in {time.monotonic() - began:.1f} s")
        began = time.monotonic()
        spark = spark or _session(config)
        log(f"Spark session in {time.monotonic() - began:.1f} s")
        if config.fmt == "iceberg":
            from pgrecv.spark.tables.iceberg import use_catalog

            use_catalog(spark, config.target, config.catalog)
        if catch_up is not None and config.source is not None:
            began = time.monotonic()
            report.applied = _apply(config, spark)
            log(f"applied in {time.monotonic() - began:.1f} s")
        hooks = progress or Progress()
        hooks.tables(len(tables))
        held = {} if report.applied is None else {r.table: r.error for r in report.applied.tables if r.error}
        for t in tables:
            began = time.monotonic()
            result = _verify_table(conn, spark, config, t, cp, catch_up is not None)
            log(f"{result.name}: {result.status} in {time.monotonic() - began:.1f} s")
            if result.name in held and result.status != "equal":
                result.note = f"held back by the catch-up's apply: {held[result.name]}"
            report.tables.append(result)
            hooks.table_done(result.name)
        report.tables += _only_in_lake(config, tables)
        conn.execute("ROLLBACK")
        return report
    finally:
        conn.close()


def _only_in_lake(config: VerifyConfig, tables: Sequence[PgTable]) -> list[TableReport]:
    """The lake's tables PostgreSQL has not among those compared (dropped, renamed, or outside the
    publication): listed, not differences, since the lake keeps what spark-apply once wrote."""
    from pgrecv.filters import table_filter
    from pgrecv.spark.model import STATE_DIR, table_dir_name, table_of_dir_name

    known = {table_dir_name(t.relation.namespace, t.relation.name) for t in tables}
    keep = table_filter(config.tables, ())
    out = []
    entries: list[TargetPath] = list(config.target.iterdir())
    for entry in sorted(entries, key=lambda p: p.name):
        name = table_of_dir_name(entry.name)
        if entry.name in known or entry.name == STATE_DIR or name is None or not entry.is_dir():
            continue
        if keep is None or keep(*name):
            note = "no such table in PostgreSQL (dropped, renamed, or outside the publication): not compared"
            out.append(TableReport(f"{name[0]}.{name[1]}", "only in the lake", note=note))
    return out


def _confirmed(conn: psycopg.Connection[Any], slot: str) -> int | None:
    from pgrecv.pg.slots import get_slot

    row = get_slot(conn, slot)
    value = None if row is None else row.get("confirmed_flush_lsn")
    return None if value is None else int(LSN.parse(str(value)))


def _session(config: VerifyConfig) -> SparkSession:
    """spark-apply's session for the same lake: with the store's settings when it is on a store, and
    its Hadoop connector checked (else each task would fail on its first file with a Java stack)."""
    from pgrecv.spark import stores
    from pgrecv.spark.apply import open_session

    target = config.target
    on_store = isinstance(target, stores.StorePath)
    spark = open_session(config.master, config.remote, config.conf, config.fmt, "auto", on_store)
    if isinstance(target, stores.StorePath):
        stores.check_session(spark, (target.scheme,))
    return spark


def _apply(config: VerifyConfig, spark: SparkSession) -> Summary:
    from pgrecv.spark.apply import run_apply
    from pgrecv.spark.model import ApplyConfig

    assert config.source is not None
    apply = ApplyConfig(
        sources=(config.source,),
        target=config.target,
        fmt=config.fmt,  # type: ignore[arg-type]
        tables=config.tables,
        master=config.master,
        remote=config.remote,
        conf=config.conf,
        keys=config.keys,
        append_only=config.append_only,
        bad_values=config.bad_values,
        catalog=config.catalog,
    )
    return run_apply(apply, spark)


def _lake_table(spark: SparkSession, config: VerifyConfig, schema: str, name: str) -> LakeTable:
    from pgrecv.spark.model import app_id, table_dir_name
    from pgrecv.spark.tables import writer_of

    path = config.target / table_dir_name(schema, name)
    table = writer_of(spark, config.target, config.fmt, "auto", config.catalog)(path, app_id(f"{schema}.{name}"), spark)
    if config.fmt == "iceberg":
        table.names = (schema, name)  # (a table of a named catalog is found by them)
    return table


def _verify_table(
    conn: psycopg.Connection[Any], spark: SparkSession, config: VerifyConfig, t: PgTable, cp: int, caught_up: bool
) -> TableReport:
    from pgrecv.spark.sparkops import spark_schema
    from pgrecv.spark.tables import mode_of

    rel = t.relation
    report = TableReport(f"{rel.namespace}.{rel.name}", "equal")
    lake = _lake_table(spark, config, rel.namespace, rel.name)
    if not lake.exists():
        report.status = "missing"
        report.note = f"{_count(conn, t)} rows in PostgreSQL"
        return report
    lake.open()
    report.applied = lake.applied
    if lake.schema is None:
        report.status = "missing"
        report.note = f"{_count(conn, t)} rows in PostgreSQL"
        return report
    if mode_of(lake) == "history":
        report.status = "not compared"
        report.note = "a history-mode table (--mode history): verify compares latest-mode tables"
        return report
    if caught_up and lake.applied is not None and lake.applied >= cp:
        raise SlotError(
            f"{report.name}: the lake is past the snapshot (applied {lsn_str(lake.applied)} >= {lsn_str(cp)}): "
            "another stream and apply ran meanwhile; run verify again"
        )
    frame = lake.frame()
    if frame is None:
        frame = spark.createDataFrame([], spark_schema(lake.schema))
    lake_types = {f.name: f.dataType.simpleString() for f in frame.schema.fields}
    columns = [c for c in rel.columns if c.name in t.columns]
    names: list[str] = []
    types: list[str] = []
    canons = []
    skipped: list[str] = []
    for c in columns:
        form = canon(c.name, c.type_name, lake_types.get(c.name), config.bad_values)
        if form is None:
            skipped.append(c.name)
            continue
        names.append(c.name)
        types.append(c.type_name)
        canons.append(form)
    given = config.keys.get((rel.namespace, rel.name))  # --key, as the apply was given it
    if given:
        keyed = [names.index(n) for n in given if n in names]
    else:
        keyed = [i for i, n in enumerate(names) if any(c.key and c.name == n for c in columns)]
    key = tuple(keyed) if keyed else tuple(range(len(names)))
    plan = Plan(tuple(names), tuple(canons), key, tuple(types))
    report.key = tuple(names[i] for i in key)
    report.not_compared = tuple(skipped)
    pg = PgSide(conn, _source(t), _where(t), plan)
    side = LakeSide(frame, plan)
    report.diff = compare(pg, side, names)
    if not report.diff.equal:
        report.status = "different"
        if not caught_up and lake.applied is not None and lake.applied < cp - 1:
            report.note = f"applied up to {lsn_str(lake.applied)}, the snapshot is at {lsn_str(cp)}: it may lag"
    return report


def _source(t: PgTable) -> sql.Composable:
    ident = sql.Identifier(t.relation.namespace, t.relation.name)
    return ident if t.partitioned else sql.SQL("ONLY {}").format(ident)


def _where(t: PgTable) -> sql.Composable | None:
    return sql.SQL("(" + t.rowfilter.replace("%", "%%") + ")") if t.rowfilter else None


def _count(conn: psycopg.Connection[Any], t: PgTable) -> int:
    where = _where(t) or sql.SQL("true")
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(_source(t), where)).fetchone()
    return int(row[0]) if row is not None else 0


def key_text(names: Sequence[str], key: Sequence[str | None]) -> str:
    """A key for the report: ``id=5`` or ``(a=1, b=x)``."""
    parts = [f"{n}={'NULL' if v is None else v}" for n, v in zip(names, key, strict=False)]
    return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"
