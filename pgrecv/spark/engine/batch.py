"""A table's batch as DataFrames: the final events of its changes, typed and checked, and what
the table writer needs (:class:`pgrecv.spark.tables.Batch`). Latest mode in one pass where it
fits, else step by step; history mode as version rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import pyarrow as pa

from pgrecv.errors import InputError, UsageError
from pgrecv.spark.engine.values import all_ok, apply_policy, no_identity, typed_rows
from pgrecv.spark.files import find_line
from pgrecv.spark.replay import committed as rp
from pgrecv.spark.replay import events as rev
from pgrecv.spark.schema import HISTORY_COLS, TablePlan, quoted
from pgrecv.spark.tables import Batch
from pgrecv.spark.tables.rewrite import ONE_PASS_FAILED

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pgrecv.spark.model import ApplyConfig, TableResult
    from pgrecv.spark.tables import Table


# A batch whose updates and deletes number at least 1/ONE_PASS_SHARE of the table's rows is
# applied in one pass (tables.rewrite.Rewrite._one_pass): it would touch most data files anyway.
# (Tuning.one_pass off: never.)
ONE_PASS_SHARE = 4


def one_pass_fits(facts: dict[str, Any], target: Table, config: ApplyConfig, toast: list[str]) -> bool:
    """Whether a latest-mode batch can be applied in one pass. Not with unchanged TOAST values
    (their lookups need passes of their own), nor under ``--bad-values null`` or ``text`` (whose
    counts need the probe); and not for a batch of mostly new keys, whose step-by-step write
    leaves the table's files alone."""
    if toast or config.bad_values != "fail":
        return False
    if facts.get("lean"):
        return True  # chosen by lean_one_pass
    if facts["truncate_at"] is not None or target.version is None:
        return True  # no current row survives, or there is none
    most = (facts["update"] + facts["delete"]) * ONE_PASS_SHARE
    return bool(most >= target.row_count(above=most))


def build_batch(
    changes: DataFrame,
    plan: TablePlan,
    target: Table,
    facts: dict[str, Any],
    spark: SparkSession,
    result: TableResult,
    config: ApplyConfig,
    one_pass: bool = False,
) -> Batch:
    """The table's batch. ``one_pass``: where it fits (:func:`one_pass_fits`), the final events
    unpersisted and unprobed, for the writer's one job; what the probe would find fails that job
    (tables.rewrite.ONE_PASS_FAILED), and the caller then calls again without ``one_pass``."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    names = list(plan.columns)
    schema = pa.schema([(n, plan.columns[n].arrow) for n in names])
    types = {n: ct.pg_type for n, ct in plan.columns.items()}
    truncate = facts["truncate_at"] is not None
    if plan.append_only:
        rows = changes.where((F.col("schema") == plan.schema) & (F.col("table") == plan.table))
        if target.applied is not None:
            rows = rows.where(F.col("c") > target.applied)
        if truncate:
            rows = rows.where(rp.order_col() > rp.order_lit(facts["truncate_at"]))
        bad = rows.where("op NOT IN ('insert', 'truncate')").select("op", "_path", "lsn").limit(1).collect()
        if bad:
            where = find_line(bad[0]["_path"], {"op": bad[0]["op"], "lsn": bad[0]["lsn"]})
            raise InputError(
                f"{where}: {bad[0]['op']} on a table without a key in --append-only mode: only inserts can be appended"
            )
        texts = rev.image_texts("new", plan, F.col("json_nulls"))
        ev = (
            rev.parse_images(rows.where("op = 'insert'"), plan, ("new",))
            .select(F.struct(*[texts[n].cast("string").alias(n) for n in names]).alias("v"), "_path", "lsn")
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        ev, plan = apply_policy(typed_rows(ev, plan), plan, target, config, result)
        schema = pa.schema([(n, plan.columns[n].arrow) for n in names])
        return Batch(
            schema, [], False, truncate, ev.select("tv.*"), None, facts["position"], append_only=True, pg_types=types
        )
    toast = [c for c in facts["toast"] if c in plan.columns]
    events = rev.table_changes(changes, plan, target.applied, facts["truncate_at"], dedupe=bool(toast))
    if one_pass and one_pass_fits(facts, target, config, toast):
        # typed and checked in one select and one filter (each DataFrame step is analysed on the
        # driver, per table: bench/NOTES.md, many small tables)
        typed_values, oks = rev.typed({n: F.col("v")[n] for n in names}, plan)
        failing = F.col("_problem").isNotNull() | ~rp.all_of([oks[n] for n in names])
        flat = rev.key_columns(plan) or {}
        if flat:
            events = events.withColumns(flat)
        final = (
            rev.final_changes(events, [], moves=False, by=tuple(F.col(c) for c in flat) or None)
            .select(
                *flat,
                F.col("kind").alias("_kind"),
                F.col("key").alias("_k"),
                F.struct(*[typed_values[n].alias(n) for n in names]).alias("_v"),
                failing.alias("_bad"),
            )
            .where(F.when(F.col("_bad"), F.raise_error(F.lit(ONE_PASS_FAILED))).otherwise(F.lit(True)))
        )
        return Batch(
            schema,
            plan.key_cols,
            plan.full,
            truncate,
            None,
            None,
            facts["position"],
            final=final,
            flat_key=bool(flat),
            pg_types=types,
        )
    final = rev.final_changes(events, toast, moves=bool(facts["moves"])).persist(StorageLevel.MEMORY_AND_DISK)
    final = typed_rows(final, plan)
    # one pass for the three things that stop the table or need more work
    upserts = final.where("kind = 'U'")
    is_u = F.col("kind") == "U"
    probe = final.agg(
        F.max(F.col("_problem").isNotNull()).alias("problem"),
        F.max(~all_ok(names)).alias("bad"),
        F.max(is_u & (F.size("need") > 0)).alias("need"),
    ).first()
    assert probe is not None
    if probe["problem"]:
        no_identity(final)
    if probe["bad"]:
        final, plan = apply_policy(final, plan, target, config, result)
        schema = pa.schema([(n, plan.columns[n].arrow) for n in names])
        upserts = final.where("kind = 'U'")
    rows = upserts.select("tv.*", F.col("need").alias(NEED), F.col("root").alias(ROOT))
    if probe["need"]:
        rows = fill_from_target(rows, plan, None if truncate else target.frame())
    else:
        rows = rows.drop(NEED, ROOT)
    keys = final.select("key.*")
    return Batch(
        schema,
        plan.key_cols,
        plan.full,
        truncate,
        rows.select(*[F.col(quoted(n)) for n in names]),
        keys,
        facts["position"],
        pg_types=types,
    )


def history_batch(
    changes: DataFrame,
    plan: TablePlan,
    target: Table,
    facts: dict[str, Any],
    spark: SparkSession,
    result: TableResult,
    config: ApplyConfig,
) -> Batch:
    """``--mode history`` (SCD type 2): every event is a version row, ending where the next version
    of its key starts (``lead()`` over the key); a TRUNCATE adds a deleted version for each key
    live at that point (those of the target too, at the batch's first TRUNCATE); the target's
    current version of each touched key is closed by the key's first new version."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from pgrecv.spark.sparkops import spark_schema

    if plan.append_only:
        raise UsageError(
            f"table {plan.name} has no key: --mode history cannot tell its rows' versions apart; "
            "apply it with --mode latest --append-only, or give it a primary key"
        )
    names = list(plan.columns)
    keys = plan.key_cols
    events = rev.table_changes(changes, plan, target.applied, None, history=True)
    toast = [c for c in facts["toast"] if c in plan.columns]
    ev = typed_rows(rev.fill_toast(events, toast, moves=bool(facts["moves"])), plan).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    probe = ev.agg(
        F.max(F.col("_problem").isNotNull()).alias("problem"),
        F.max(~all_ok(names)).alias("bad"),
        F.max((F.col("kind") == "U") & (F.size("need") > 0)).alias("need"),
    ).first()
    assert probe is not None
    if probe["problem"]:
        no_identity(ev)
    if probe["bad"]:
        ev, plan = apply_policy(ev, plan, target, config, result)
    schema = pa.schema([(n, plan.columns[n].arrow) for n in names] + HISTORY_COLS)
    cur = target.frame()
    if cur is not None:
        cur = cur.where("_current")
    # the replay's own columns travel in one struct beside the table's (whatever their names)
    e = F.struct("kind", "key", *rp.ORDER, "commit_time").alias(EXTRA)
    rows = ev.select("tv.*", F.col("need").alias(NEED), F.col("root").alias(ROOT), e)
    rows = fill_from_target(rows, plan, cur) if probe["need"] else rows.drop(NEED, ROOT)
    n_truncates = facts["truncate"]
    if n_truncates:
        # the keys live at each TRUNCATE get a deleted version there: those whose last event since
        # the TRUNCATE before it is an upsert (and, at the first, the target's live keys untouched
        # before it). Its row holds the key only, as the driver-side replay's does.
        types = {f.name: f.dataType for f in spark_schema(pa.schema([(n, plan.columns[n].arrow) for n in names]))}
        # Every TRUNCATE of the batch, in order, as one row that stays in Spark (broadcast to the
        # tasks): the driver never holds the list, which grows with the input.
        truncates = changes.where(
            (F.col("schema") == plan.schema) & (F.col("table") == plan.table) & (F.col("op") == "truncate")
        )
        if target.applied is not None:
            truncates = truncates.where(F.col("c") > target.applied)
        mark = F.struct(rp.order_col().alias("o"), "commit_time")
        marks = F.broadcast(truncates.agg(F.sort_array(F.collect_list(mark)).alias("_marks")))
        seg = F.size(F.filter(F.col("_marks"), lambda x: x["o"] < rp.order_col()))
        segs = events.crossJoin(marks).select("key", "kind", *rp.ORDER, seg.alias("_seg"))
        last = Window.partitionBy(*rp.by_key(), "_seg").orderBy(*[F.col(c).desc() for c in rp.ORDER])
        live = (
            segs.withColumn("_n", F.row_number().over(last))
            .where(f"_n = 1 AND kind = 'U' AND _seg < {int(n_truncates)}")
            .select("key", "_seg")
        )
        if cur is not None:
            first = segs.where("_seg = 0").select(F.col("key").alias("_k"))
            tk = cur.where("NOT _deleted").select(F.struct(*[F.col(quoted(k)).alias(k) for k in keys]).alias("key"))
            untouched = tk.join(first, F.col("key").eqNullSafe(F.col("_k")), "left_anti")
            live = live.unionByName(untouched.select("key", F.lit(0).alias("_seg")))
        at = marks.select(F.posexplode("_marks").alias("_seg", "_t")).select(
            "_seg", *[F.col(f"_t.o.{c}").alias(c) for c in rp.ORDER], F.col("_t.commit_time").alias("commit_time")
        )
        tomb = live.join(F.broadcast(at), "_seg").select(
            *[F.col("key")[n].alias(n) if n in keys else F.lit(None).cast(types[n]).alias(n) for n in names],
            F.struct(F.lit("D").alias("kind"), "key", *rp.ORDER, "commit_time").alias(EXTRA),
        )
        rows = rows.unionByName(tomb)
    x = {c: F.col(f"{EXTRA}.{c}") for c in ("kind", "key", *rp.ORDER, "commit_time")}
    w = Window.partitionBy(*rp.by_key(x["key"])).orderBy(*[x[c] for c in rp.ORDER])
    start_time = x["commit_time"].cast("timestamp")
    versions = rows.select(
        *[F.col(quoted(n)) for n in names],
        x["key"].alias("_pgrecv_key"),
        x["c"].alias("_start_lsn"),
        x["l"].alias("_start_change_lsn"),
        F.lead(x["c"]).over(w).alias("_end_lsn"),
        F.lead(x["l"]).over(w).alias("_end_change_lsn"),
        start_time.alias("_start_time"),
        F.lead(start_time).over(w).alias("_end_time"),
        F.lead(x["c"]).over(w).isNull().alias("_current"),
        (x["kind"] == "D").alias("_deleted"),
        (F.row_number().over(w) == 1).alias("_pgrecv_first"),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    closes = versions.where("_pgrecv_first").select(
        *[F.col("_pgrecv_key")[k].alias(k) for k in keys],
        F.col("_start_lsn").alias("_end_lsn"),
        F.col("_start_change_lsn").alias("_end_change_lsn"),
        F.col("_start_time").alias("_end_time"),
    )
    return Batch(
        schema,
        keys,
        plan.full,
        False,
        versions.select(*[F.col(quoted(n)) for n in schema.names]),
        closes.select(*[F.col(quoted(k)) for k in keys]),
        facts["position"],
        history=True,
        closes=closes,
        pg_types={n: ct.pg_type for n, ct in plan.columns.items()},
    )


NEED, ROOT, EXTRA = "_pgrecv_need", "_pgrecv_root", "_pgrecv_e"  # beside a table's columns: no clash


def fill_from_target(rows: DataFrame, plan: TablePlan, cur: DataFrame | None) -> DataFrame:
    """Unchanged-TOAST columns the batch could not supply (``NEED``): the target's row (``cur``:
    its current rows, None after a TRUNCATE) of the key ``ROOT``. Other columns of ``rows`` stay."""
    from pyspark.sql import functions as F

    need = rows.where(F.size(NEED) > 0)
    other = [c for c in rows.columns if c not in plan.columns and c not in (NEED, ROOT)]

    def fail(cols: list[str]) -> NoReturn:
        raise InputError(
            f"table {plan.name}: unchanged TOAST column(s) {', '.join(cols)}, but the target has no row to "
            "keep them from: apply the earlier changes or a snapshot (pgrecv snapshot) first"
        )

    if cur is None:
        fail(need.select(NEED).limit(1).collect()[0][NEED])
    have = [c for c in plan.columns if c in cur.columns]
    t = cur.select(
        F.struct(*[F.col(quoted(k)).alias(k) for k in plan.key_cols]).alias("_pgrecv_tk"),
        *[F.col(quoted(c)).alias(f"_pgrecv_t{i}") for i, c in enumerate(have)],
    )
    j = need.join(t, F.col(ROOT) == F.col("_pgrecv_tk"), "left")
    missing = j.where(F.col("_pgrecv_tk").isNull()).select(NEED).limit(1).collect()
    if missing:
        fail(missing[0][NEED])
    index = {c: i for i, c in enumerate(have)}
    out = j.select(
        *[
            F.when(F.array_contains(NEED, c), F.col(f"_pgrecv_t{index[c]}")).otherwise(F.col(quoted(c))).alias(c)
            if c in index
            else F.col(quoted(c))
            for c in plan.columns
        ],
        *[F.col(quoted(c)) for c in other],
    )
    return rows.where(F.size(NEED) == 0).drop(NEED, ROOT).unionByName(out)
