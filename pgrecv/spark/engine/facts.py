"""Per table, the facts its batch is planned from: counts by op past its applied position, the
position, the last TRUNCATE and the columns with unchanged TOAST values; and the choices they
decide (one task, the lean read's one pass). What reaches the driver is bounded by the number of
tables and columns, whatever the input size."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pgrecv.errors import InputError, UsageError
from pgrecv.spark.engine.batch import ONE_PASS_SHARE
from pgrecv.spark.engine.tuning import PUSHDOWN, input_bytes
from pgrecv.spark.model import ApplyConfig, Tuning
from pgrecv.spark.read import direct
from pgrecv.spark.replay import committed as rp
from pgrecv.spark.replay import events as rev
from pgrecv.spark.schema import plan as table_plan
from pgrecv.spark.stores import SourceFile
from pgrecv.spark.tables import Table
from pgrecv.spark.tables.rewrite import fits_one_file

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pgrecv.spark.model import TableResult
    from pgrecv.spark.tables import Batch


# a batch of at most this many changes onto a table of one file is applied by one task
# (single_task; Tuning.single_task off: never)
SINGLE_TASK_CHANGES = 50_000


def lean_fits(config: ApplyConfig, files: list[SourceFile], tuning: Tuning) -> bool:
    """Whether a run may try the lean read (:func:`lean.read_lean`): latest mode, the one pass's
    policy, and an input large enough that the first pass's facts would not choose one task. Not
    where ``--conf`` sets the JSON reader's filter pushdown, which the lean read turns off so that
    its main job sees every line."""
    return (
        PUSHDOWN not in config.conf
        and config.mode == "latest"
        and not config.append_only
        and config.bad_values == "fail"
        and tuning.lean
        and tuning.one_pass
        and input_bytes(files) >= direct.LEAN_MIN_BYTES
    )


def table_facts(
    changes: DataFrame, applied: dict[tuple[str, str], int | None], spark: SparkSession
) -> dict[tuple[str, str], dict[str, Any]]:
    """Per table: counts by op past its applied position, the position, the last TRUNCATE, and
    the columns with unchanged TOAST values (a small aggregate for all tables, and a second over
    the rows with TRUNCATEs or unchanged TOAST values if there are any).

    What reaches the driver is bounded by the number of tables and columns, whatever the input
    size: one row per table, lists of column names only. (History mode's list of every TRUNCATE
    stays in Spark: see history_batch.)"""
    from pyspark.sql import functions as F

    every = changes.join(F.broadcast(_applied_frame(spark, applied)), ["schema", "table"])
    live = F.col("c") > F.col("_applied")
    has_toast = live & (F.size("unchanged_toast") > 0)
    # counts and positions only: a hash aggregate. The lists (TRUNCATEs, unchanged-TOAST columns)
    # need an aggregate that sorts its input; it runs only if some table has such rows, over those
    # rows alone (1M events, warm: 1.49 s as one aggregate of everything, 1.24-1.32 s as the counts).
    agg = every.groupBy("schema", "table").agg(
        F.count(F.lit(1)).alias("n_all"),
        F.sum(F.when(live, 1).otherwise(0)).alias("n"),
        *[
            F.sum(F.when(live & (F.col("op") == op), 1).otherwise(0)).alias(op)
            for op in ("insert", "update", "delete", "truncate")
        ],
        F.max(F.when(live, F.col("c"))).alias("position"),
        F.sum(F.when(has_toast, 1).otherwise(0)).alias("n_toast"),
    )
    out = _fact_dicts(agg)
    if any(d["truncate"] or d["n_toast"] for d in out.values()):
        order = rp.order_col()
        lists = (
            every.where(live & ((F.col("op") == "truncate") | (F.size("unchanged_toast") > 0)))
            .groupBy("schema", "table")
            .agg(
                F.max(F.when(F.col("op") == "truncate", order)).alias("truncate_at"),
                F.array_distinct(F.flatten(F.collect_set(F.col("unchanged_toast")))).alias("toast"),
                # updates with an old image and unchanged TOAST values: maybe key changes to follow
                F.count(F.when((F.col("op") == "update") & F.col("old").isNotNull(), 1)).alias("moves"),
            )
        )
        for r in lists.collect():
            d = out[(r["schema"], r["table"])]
            ta = r["truncate_at"]
            d["truncate_at"] = tuple(ta) if ta is not None else None
            d["toast"] = sorted(r["toast"] or [])
            d["moves"] = r["moves"]
    return out


def plain_facts(plain: direct.Plain, applied: dict[tuple[str, str], int | None]) -> dict[Any, Any] | None:
    """:func:`table_facts` from the direct read's cached counts, without reading the input again;
    None when the input has TRUNCATEs or unchanged TOAST values (whose facts are lists that the
    counts do not hold: :func:`table_facts` finds them), or uncommitted changes too many to list
    and commits too many to broadcast (the cached rows, two per transaction, would be sorted and
    merged with them; the per-table copy of the committed changes needs no join to be counted)."""
    from pyspark.sql import functions as F

    rows = None if plain.truncates or plain.toast else plain.committed_counts()
    if rows is None:
        return None
    rows = rows.join(F.broadcast(_applied_frame(plain.spark, applied)), ["schema", "table"])
    live = F.col("k") > F.col("_applied")
    n = sum((F.col(o) for o in rp.ROW_OPS[1:]), F.col(rp.ROW_OPS[0]))
    return _fact_dicts(
        rows.groupBy("schema", "table").agg(
            F.sum(n).alias("n_all"),
            F.sum(F.when(live, n).otherwise(0)).alias("n"),
            *[F.sum(F.when(live, F.col(o)).otherwise(0)).alias(o) for o in rp.ROW_OPS],
            F.lit(0).alias("truncate"),
            F.max(F.when(live, F.col("k"))).alias("position"),
            F.lit(0).alias("n_toast"),
        )
    )


def _applied_frame(spark: SparkSession, applied: dict[tuple[str, str], int | None]) -> DataFrame:
    """Each wanted table's applied position (-1: none yet), to join to its changes."""
    return spark.createDataFrame(
        [(s, t, a if a is not None else -1) for (s, t), a in applied.items()] or [("", "", -1)],
        "schema string, `table` string, _applied long",
    )


def _fact_dicts(agg: DataFrame) -> dict[tuple[str, str], dict[str, Any]]:
    """The facts per table from an aggregate of one row per table, with the list facts (last
    TRUNCATE, unchanged-TOAST columns, key changes) empty until a pass finds them."""
    out = {}
    for r in agg.collect():  # one row per table
        d = r.asDict()
        d.update(truncate_at=None, toast=[], moves=0)
        out[(r["schema"], r["table"])] = d
    return out


def lean_facts(plain: direct.Plain) -> dict[str, Any]:
    """The facts of the lean read's one table before its main job (a transaction past its applied
    position was committed); its counts are taken by that job (:func:`lean_settle`)."""
    facts: dict[str, Any] = {o: 0 for o in (*rp.ROW_OPS, "truncate", "n_toast", "moves")}
    facts.update(n_all=1, n=1, position=plain.last_commit, truncate_at=None, toast=[], lean=True)
    return facts


def lean_one_pass(plain: direct.Plain, target: Table, files: list[SourceFile]) -> bool:
    """:func:`one_pass_fits` for the lean read, from the input's size (an over-count of its
    changes) instead of their counts: otherwise the step-by-step write, which needs them."""
    if target.version is None:
        return True
    most = input_bytes(files) // direct.LEAN_LINE_BYTES * ONE_PASS_SHARE
    return bool(most >= target.row_count(above=most))


def lean_settle(plain: direct.Plain, batch: Batch, result: TableResult) -> Callable[[], None]:
    """What the writer calls after the lean main job and before its commit: the table's counts
    and position from that job. No live change (a transaction past the applied position without
    one of this table's), other lines than the structural pass's (appended meanwhile, or a line
    it took for a row change that is not one), or row changes of other commit LSNs than it took
    from their text: the ordinary way decides."""

    def settle() -> None:
        got = plain.observed()
        if got["position"] is None or got["others"] != plain.structure.lines:
            raise direct.LeanDeclined
        if not direct.sums_match(plain, got):
            raise direct.LeanDeclined  # other commit LSNs than the structural pass took
        plain.counts = got
        batch.position = got["position"]
        result.inserts, result.updates, result.deletes = (got[o] for o in rp.ROW_OPS)

    return settle


def single_task(facts: dict[str, Any], target: Table) -> bool:
    """Whether a table's batch is replayed and written by one task: few changes (at most
    :data:`SINGLE_TASK_CHANGES`) onto a table that stays within one file. Each shuffle between the
    replay and the write is a Spark job of its own, with its tasks, files and planning, which is
    what a small table's apply is made of (bench/NOTES.md, many small tables); one partition
    from the input on needs none of them."""
    if facts["n"] > SINGLE_TASK_CHANGES:
        return False
    return fits_one_file(facts["insert"] + facts["update"], target.data_files())


def image_type(
    wanted: list[tuple[str, str]], st: rp.Structure, targets: dict[tuple[str, str], Table], config: ApplyConfig
) -> str | None:
    """The row images' type for a direct read (:meth:`direct.Plain.records`): the one wanted
    table's columns as texts, if it has no json column (whose value must stay the exact text the
    server sent). None: the images stay texts, parsed by the replay."""
    if len(wanted) != 1:
        return None
    (s, t), target = wanted[0], targets[wanted[0]]
    try:
        plan = table_plan(
            s, t, st.relations.get((s, t), []), target.schema, config.append_only, config.mode == "history"
        )
    except (InputError, UsageError):
        return None  # the table's own pass reports it
    if any(ct.is_json for ct in plan.columns.values()):
        return None
    return rev.texts_type(plan)
