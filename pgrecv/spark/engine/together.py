"""Many small tables' batches in one set of Spark jobs (issue 56: a whole database's stream).

Applied one by one, each table costs its own Spark jobs and about 1,300 py4j calls of plan
building, whatever its rows (bench/NOTES.md: 200 tables of 100 changes took 12x the same changes
in one table). Here the replay does not depend on a table's columns: one Spark job takes the
changes of every small table, parses each row image as a map of its columns' JSON texts, finds
the last event per (table, key), and converts every value by its column's type with the
replay's own conversion (:func:`pgrecv.spark.replay.convert.scalar`), once per distinct type of
the group, not once per table. The driver then takes those final events as Arrow, and for each
table merges them with its current rows (at most :data:`ROWS` of them) and commits one new file
through the table's writer, as any batch (:class:`pgrecv.spark.tables.Batch` ``arrow``). On a
store the driver reads the current files through pyarrow's S3 file system with the run's
settings (:func:`pgrecv.spark.stores.read_parquet`).

A table comes here only when nothing of its batch needs the per-table replay: latest mode, a
key whose values PostgreSQL prints one way only (so that texts compare as values), no TRUNCATE,
no unchanged TOAST value, no json column, ``--bad-values fail``. A table whose events show a
problem (a row without its key, a value its type cannot hold, two changes at one position) goes
back to the per-table replay, which names it as always.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgrecv.spark.read.envelope import JSON_LIMITS
from pgrecv.spark.replay import committed as rp
from pgrecv.spark.replay import events as rev
from pgrecv.spark.replay.convert import scalar
from pgrecv.spark.stores import data_bytes, read_parquet
from pgrecv.spark.tables import Batch, mode_of
from pgrecv.spark.tables.delta import DeltaRsTable
from pgrecv.spark.tables.parquet import ParquetStoreTable, ParquetTable

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from pgrecv.spark.model import ApplyConfig
    from pgrecv.spark.schema import ColumnType, TablePlan
    from pgrecv.spark.tables import Table

# What the driver holds at once is bounded by these, whatever the input: one table's current rows
# (by their count and their files' size) and one chunk of final events (by their values' size).
ROWS = 100_000  # a table's current rows at most: read whole by the driver, merged, written as one file
CURRENT_BYTES = 8 << 20  # ... and their data files' size at most
CHANGES = 20_000  # a table's changes at most
GROUP = 50_000  # changes of the tables one job replays
EVENT_BYTES = 64 << 20  # the final events (their values' texts) the driver takes at once, and one table's at most

# key types whose text PostgreSQL prints one way for one value: a key compared as its text is
# compared as its value (not numeric without a scale, floats, timestamps, json)
_KEY_TYPES = {"smallint", "integer", "bigint", "oid", "text", "character varying", "uuid", "date", "boolean"}


@dataclass(frozen=True)
class Member:
    """A table of the group: its id in the run's changes (``_tid``), its plan and its target."""

    key: tuple[str, str]
    tid: int
    plan: TablePlan
    target: Table
    facts: dict[str, Any]


def fits(plan: TablePlan, target: Table, facts: dict[str, Any], config: ApplyConfig) -> bool:
    """Whether a table's batch can be replayed with the group's."""
    if config.mode != "latest" or config.bad_values != "fail" or plan.append_only or plan.full:
        return False
    writers = (ParquetTable, ParquetStoreTable, DeltaRsTable)  # (on a local disk or a store)
    if not isinstance(target, writers) or mode_of(target) not in (None, "latest"):
        return False
    if facts.get("lean") or facts["truncate_at"] is not None or facts["toast"] or facts["truncate"]:
        return False
    if not plan.key_cols or not 0 < facts["n"] <= CHANGES:
        return False
    if any(ct.is_json for ct in plan.columns.values()):
        return False
    if any(plan.columns[k].pg_type not in _KEY_TYPES for k in plan.key_cols):
        return False
    if target.version is None:
        return True
    files = target.data_files()
    return data_bytes(files) <= CURRENT_BYTES and target.row_count(above=ROWS) <= ROWS


def groups(members: list[Member]) -> list[list[Member]]:
    """The members in groups of at most :data:`GROUP` changes (each one Spark job)."""
    out: list[list[Member]] = []
    n = GROUP
    for m in members:
        if n + m.facts["n"] > GROUP:
            out.append([])
            n = 0
        out[-1].append(m)
        n += m.facts["n"]
    return out


def final_events(changes: DataFrame, group: list[Member]) -> Iterator[tuple[pa.Table, list[ColumnType]]]:
    """The group's final events, as Arrow: ``_tid``, ``kind`` (U or D), ``_problem`` (what holds
    the table back), ``_ok`` (every value fits its type) and one array per distinct column type,
    ``_t0``, ``_t1``, ...: the values of the row's columns of that type, typed, in its plan's
    column order (a D's values are its key's). Yields them in chunks of whole tables of at most
    :data:`EVENT_BYTES` of values, with the distinct types; a table with more is left out (the
    per-table replay takes it)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    spark = changes.sparkSession
    types: list[ColumnType] = []
    for m in group:
        for ct in m.plan.columns.values():
            if ct not in types:
                types.append(ct)
    meta = spark.createDataFrame(
        [
            (
                m.tid,
                m.plan.key_cols,
                list(m.plan.columns),
                [types.index(ct) for ct in m.plan.columns.values()],
                m.target.applied if m.target.applied is not None else -1,
            )
            for m in group
        ],
        "_tid int, _keys array<string>, _cols array<string>, _types array<int>, _applied bigint",
    )
    mine = F.col("op").isin(*rp.ROW_OPS) & (F.col("c") > F.col("_applied"))
    t = changes.join(F.broadcast(meta), "_tid").where(mine)
    t = t.select(
        "*",
        F.from_json("new", "map<string,string>", JSON_LIMITS).alias("_nm"),
        F.from_json("old", "map<string,string>", JSON_LIMITS).alias("_om"),
    )
    nk = F.transform("_keys", lambda k: F.col("_nm")[k])
    ok = F.transform("_keys", lambda k: F.col("_om")[k])
    has_old = F.col("old").isNotNull()
    op = F.col("op")
    moved = (op == "update") & has_old & (F.coalesce(nk != ok, F.lit(True)))
    values = F.transform("_cols", lambda n: F.col("_nm")[n])
    only_key = F.transform("_cols", lambda n: F.when(F.array_contains("_keys", n), F.col("_om")[n]))
    no_values = F.lit(None).cast("array<string>")

    def event(kind: str, key: Column, v: Column) -> Column:
        return F.struct(F.lit(kind).alias("kind"), key.alias("key"), v.alias("v"), no_values.alias("has"))

    upsert, delete = event("U", nk, values), event("D", ok, only_key)
    events = F.when(op == "delete", F.array(delete)).when(moved, F.array(delete, upsert)).otherwise(F.array(upsert))
    not_object = (F.col("new").isNotNull() & ~F.col("new").startswith("{")) | (has_old & ~F.col("old").startswith("{"))
    problem = (
        F.when(op.isin("insert", "update") & F.col("new").isNull(), F.lit("no new image"))
        .when((op == "delete") & ~has_old, F.lit("no old image"))
        .when(not_object, F.lit(rp.NOT_OBJECT))
        .when(op.isin("insert", "update") & F.exists(nk, lambda x: x.isNull()), F.lit(rp.NO_KEY))
        .when(op.isin("update", "delete") & has_old & F.exists(ok, lambda x: x.isNull()), F.lit(rp.NO_KEY))
    )
    ev = t.select("_tid", "_types", *rp.ORDER, "_path", "lsn", problem.alias("_problem"), F.inline(events)).withColumn(
        "src", F.col("key")
    )
    final = rev.final_changes(ev, [], moves=False, by=(F.col("_tid"), F.col("key")))

    def typed_as(i: int, ct: ColumnType) -> Column:
        # the values of the row's columns of type i, in column order (a table's other columns
        # take no room: the driver holds these arrays)
        of_type = F.filter(F.arrays_zip("v", "_types"), lambda x: x["_types"] == i)
        return F.transform(of_type, lambda x: scalar(x["v"], ct)[0])

    typed = {f"_t{i}": typed_as(i, ct) for i, ct in enumerate(types)}
    oks = list(enumerate(types))

    def value_ok(x: Column, j: Column) -> Column:
        out = F.when(F.lit(False), F.lit(True))
        for i, ct in oks:
            out = out.when(F.col("_types")[j] == i, scalar(x, ct)[1])
        return F.coalesce(out.otherwise(F.lit(True)), F.lit(False))

    all_ok = F.coalesce(F.forall(F.transform("v", value_ok), lambda b: b), F.lit(True))
    size = F.aggregate(F.transform("v", lambda x: F.coalesce(F.length(x), F.lit(0)) + 16), F.lit(0), lambda a, b: a + b)
    out = final.select(
        "_tid", "kind", "_problem", all_ok.alias("_ok"), *[c.alias(n) for n, c in typed.items()], size.alias("_size")
    ).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        sizes = {r["_tid"]: r["b"] for r in out.groupBy("_tid").agg(F.sum("_size").alias("b")).collect()}
        chunk: list[int] = []
        held = 0
        for tid, b in sorted(sizes.items()):
            if b > EVENT_BYTES:
                continue
            if chunk and held + b > EVENT_BYTES:
                yield out.where(F.col("_tid").isin(chunk)).drop("_size").toArrow(), types
                chunk, held = [], 0
            chunk.append(tid)
            held += b
        if chunk:
            yield out.where(F.col("_tid").isin(chunk)).drop("_size").toArrow(), types
    finally:
        out.unpersist()


def merged(member: Member, events: pa.Table, types: list[ColumnType], schema: pa.Schema) -> pa.Table | None:
    """The table's rows after its final events (its current rows without the keys the events
    touch, and the events' upserts), sorted by key; None when its events show a problem (the
    per-table replay then reports it)."""
    import pyarrow.compute as pc

    plan = member.plan
    if events.num_rows == 0:
        return None
    problems = events.column("_problem")
    if problems.null_count != len(problems) or not pc.all(events.column("_ok")).as_py():
        return None
    cols = {}
    seen = [0] * len(types)  # each column's place among its table's columns of its type
    for n, ct in plan.columns.items():
        i = types.index(ct)
        cols[n] = pc.list_element(events.column(f"_t{i}"), seen[i]).cast(schema.field(n).type)
        seen[i] += 1
    rows = pa.table(cols, schema=schema)
    keys = rows.select(plan.key_cols)
    if len(keys.group_by(plan.key_cols).aggregate([])) != len(keys):
        return None  # two texts of one key value (not as PostgreSQL prints it): the per-table replay
    upserts = rows.filter(pc.equal(events.column("kind"), "U"))
    files = member.target.data_files()
    if files:
        current = read_parquet(files)  # (local, or on the target's store)
        have = current.column_names  # a column added since a file was written reads as NULL
        current = pa.table(
            {
                f.name: current.column(f.name).cast(f.type) if f.name in have else pa.nulls(len(current), f.type)
                for f in schema
            },
            schema=schema,
        )
        idx = current.select(plan.key_cols).append_column("_pgrecv_i", pa.array(range(len(current)), pa.int64()))
        hit = idx.join(keys, plan.key_cols, join_type="left semi").column("_pgrecv_i")
        drop = pc.is_in(pa.array(range(len(current)), pa.int64()), value_set=hit.combine_chunks())
        rows = pa.concat_tables([current.filter(pc.invert(drop)), upserts])
    else:
        rows = upserts
    return rows.sort_by([(k, "ascending") for k in plan.key_cols])


def batch_of(member: Member, rows: pa.Table, schema: pa.Schema) -> Batch:
    """The table's batch: its whole new content, replacing every current file."""
    return Batch(schema, member.plan.key_cols, False, False, None, None, member.facts["position"], arrow=rows)
