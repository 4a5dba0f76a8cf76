"""One table's changes as key/value events, and the last event per key (they run in Spark tasks).

* :func:`table_changes` — one table's changes as key/value events, past the applied position
  and after the last TRUNCATE, a primary-key change split into a delete and an upsert.
* :func:`final_changes` — the last event per key, unchanged-TOAST columns filled from the latest
  earlier value in the batch (following key changes), else marked for the target's row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgrecv.errors import InputError
from pgrecv.spark.read.envelope import JSON_LIMITS
from pgrecv.spark.replay.committed import CLASH, NO_KEY, NOT_OBJECT, ORDER, all_of, by_key, order_col, order_lit
from pgrecv.spark.replay.convert import json_member, scalar
from pgrecv.spark.schema import TablePlan, quoted

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def key_columns(plan: TablePlan) -> dict[str, Column] | None:
    """The key's columns as columns of their own (``_k0``, ``_k1``, ...), to partition the last
    event's window by and to join the target on: the final events then come out of the window
    partitioned as the one-pass join needs them, and Spark shuffles them once (a window's
    partitioning by an expression such as ``key.id`` is lost after it; bench/NOTES.md,
    2026-12-03, night). None for REPLICA IDENTITY FULL, whose join is NULL-safe."""
    if plan.full or not plan.key_cols:
        return None
    from pyspark.sql import functions as F

    return {f"_k{i}": F.col("key")[k] for i, k in enumerate(plan.key_cols)}


def texts_type(plan: TablePlan) -> str:
    return "struct<" + ", ".join(f"{quoted(n)}: string" for n in plan.columns) + ">"


def parse_images(rows: DataFrame, plan: TablePlan, images: tuple[str, ...] = ("new", "old")) -> DataFrame:
    """Each row image parsed once, in its own projection (``_<image>_t``: a struct of the
    columns' JSON texts), so that the many expressions over its columns do not parse it again."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    # a direct read (pgrecv.spark.direct) may have had the JSON reader parse them already
    return rows.select(
        "*",
        *[
            (
                F.col(i)
                if isinstance(rows.schema[i].dataType, StructType)
                else F.from_json(F.col(i), texts_type(plan), JSON_LIMITS)
            ).alias(f"_{i}_t")
            for i in images
        ],
    )


def image_texts(image: str, plan: TablePlan, json_nulls: Column) -> dict[str, Column]:
    """Column → its JSON text in the (parsed) image; json/jsonb: the exact text the server sent."""
    from pyspark.sql import functions as F

    parsed = F.col(f"_{image}_t")
    out: dict[str, Column] = {}
    for n in plan.columns:
        text = parsed[n]
        if plan.columns[n].is_json:
            # cut from the image's text alone: ``from_json`` leaves a member nested deeper than
            # 1,000 levels NULL whatever its options (the JSON reader itself does not)
            text = json_member(F.col(image), n)
            text = F.when(
                text.isNull() & F.coalesce(F.array_contains(json_nulls, n), F.lit(False)), F.lit("null")
            ).otherwise(text)
        out[n] = text
    return out


def typed(texts: dict[str, Column], plan: TablePlan) -> tuple[dict[str, Column], dict[str, Column]]:
    """(typed values, ok flags) of columns given as their JSON texts."""
    from pyspark.sql import functions as F

    values: dict[str, Column] = {}
    oks: dict[str, Column] = {}
    for n, text in texts.items():
        ct = plan.columns[n]
        if ct.is_json:
            values[n], oks[n] = text, F.lit(True)
        else:
            values[n], oks[n] = scalar(text, ct)
    return values, oks


def table_changes(
    changes: DataFrame,
    plan: TablePlan,
    applied: int | None,
    truncate_at: tuple[object, ...] | None,
    history: bool = False,
    dedupe: bool = True,
) -> DataFrame:
    """The table's events, in order: kind U (upsert the image) or D (delete the key); a primary-key
    change is a D of the old key and a U of the new one (``src``: the old key). Keys are typed;
    the other values stay their JSON texts (``v``) until the last event per key is known, so each
    value is converted once, not once per change. ``history``: a D holds the old image PostgreSQL
    sent (its version row shows it), not just the key. ``dedupe=False`` keeps the copies of an
    at-least-once delivery: right when only the last event per key matters and no TOAST value is
    looked up along the key (the copies then replay identically), and it saves a shuffle of every
    row with its images."""
    from pyspark.sql import functions as F

    # one filter, not three: Spark analyses every DataFrame step of every table on the driver
    # (bench/NOTES.md, many small tables)
    mine = (F.col("schema") == plan.schema) & (F.col("table") == plan.table) & (F.col("op") != "truncate")
    if applied is not None:
        mine = mine & (F.col("c") > applied)
    if truncate_at is not None:
        mine = mine & (order_col() > order_lit(truncate_at))
    t = changes.where(mine)
    # at-least-once delivery: a change that came twice (a transaction sent again after a restart,
    # a cut one in stdout output, a prepared one both carried over and in the input again) has the
    # same commit and change LSN, op and row images; one copy stays. (Copies left in would break
    # the lookup of a key change's old row: the second copy of the move would find the first one's
    # delete.) The LSNs alone do not name a change: COPY's rows are one WAL record, and PostgreSQL
    # sends each with its LSN (tests/spark/test_apply_server.py, COPY). test_decoding's changes
    # have no LSN, and their copies replay identically in input order.
    if dedupe:
        once = ["c", "l", "op", "new", "old"]
        t = t.where(F.col("l") > 0).dropDuplicates(once).unionByName(t.where(F.col("l") <= 0))
    t = parse_images(t, plan)
    new = image_texts("new", plan, F.col("json_nulls"))
    old = image_texts("old", plan, F.col("old_json_nulls"))
    names = list(plan.columns)
    keys = plan.key_cols
    empty = F.array().cast("array<string>")
    toast = F.coalesce(F.col("unchanged_toast"), empty)
    old_toast = F.coalesce(F.col("old_unchanged_toast"), empty)
    has_old = F.col("old").isNotNull()
    # REPLICA IDENTITY FULL: an unchanged TOAST value of the new image is in the old one (unless
    # TOASTed there too; test_decoding leaves NULLs out of old images, and absent means NULL)
    from_old = {n: F.array_contains(toast, n) & has_old & ~F.array_contains(old_toast, n) for n in names}
    if not plan.full:
        from_old = {n: F.lit(False) for n in names}
    present = {n: ~F.array_contains(toast, n) | from_old[n] for n in names}
    value = {n: F.when(from_old[n], old[n]).otherwise(new[n]) for n in names}
    # keys typed once, in a projection of their own (compared, partitioned and joined on)
    key_type = {k: plan.columns[k] for k in keys}
    t = t.select(
        "*",
        *[
            scalar(value[k], key_type[k])[0].alias(f"_nk{i}") if not key_type[k].is_json else value[k].alias(f"_nk{i}")
            for i, k in enumerate(keys)
        ],
        *[
            scalar(old[k], key_type[k])[0].alias(f"_ok{i}") if not key_type[k].is_json else old[k].alias(f"_ok{i}")
            for i, k in enumerate(keys)
        ],
    )
    new_key = {k: F.col(f"_nk{i}") for i, k in enumerate(keys)}
    old_key = {k: F.col(f"_ok{i}") for i, k in enumerate(keys)}

    def event(
        kind: str, key: dict[str, Column], src: dict[str, Column], v: dict[str, Column], has: dict[str, Column]
    ) -> Column:
        return F.struct(
            F.lit(kind).alias("kind"),
            F.struct(*[key[k].alias(k) for k in keys]).alias("key"),
            F.struct(*[src[k].alias(k) for k in keys]).alias("src"),
            F.struct(*[v[n].cast("string").alias(n) for n in names]).alias("v"),
            F.struct(*[has[n].alias(n) for n in names]).alias("has"),
        )

    same_key = F.lit(True)
    for k in keys:
        same_key = same_key & old_key[k].eqNullSafe(new_key[k])
    moved = (F.col("op") == "update") & has_old & ~same_key
    src = {k: F.when(moved, old_key[k]).otherwise(new_key[k]) for k in keys}
    upsert = event("U", new_key, src, value, present)
    only_key = {n: old[n] if n in keys or history else F.lit(None) for n in names}
    delete = event("D", old_key, old_key, only_key, {n: F.lit(True) for n in names})
    events = (
        F.when(F.col("op") == "delete", F.array(delete)).when(moved, F.array(delete, upsert)).otherwise(F.array(upsert))
    )
    # A key column absent from an image, or NULL there, would make a row of a NULL key (a key
    # PostgreSQL enforces is never NULL); an unchanged TOAST value is not in the image. Not for
    # REPLICA IDENTITY FULL without a key, whose rows are identified NULL-safe by all columns.
    no_new_key = no_old_key = F.lit(False)
    if not plan.full:
        for k in keys:
            no_new_key = no_new_key | (value[k].isNull() & present[k])
            no_old_key = no_old_key | old[k].isNull()
    problem = (
        F.when(F.col("op").isin("insert", "update") & F.col("new").isNull(), F.lit("without a new row image"))
        .when((F.col("op") == "delete") & ~has_old, F.lit("without an old row image (REPLICA IDENTITY NOTHING?)"))
        .when(F.col("op").isin("insert", "update") & _not_object(t, "new"), F.lit(NOT_OBJECT))
        .when(_not_object(t, "old"), F.lit(NOT_OBJECT))
        .when(F.col("op").isin("insert", "update") & no_new_key, F.lit(f"{NO_KEY}(s) {', '.join(keys)}"))
        .when(F.col("op").isin("update", "delete") & has_old & no_old_key, F.lit(f"{NO_KEY}(s) {', '.join(keys)}"))
    )
    # inline: the events' fields as columns in this one step (explode, then "e.*", took two)
    return t.select("op", *ORDER, "_path", "lsn", "commit_time", problem.alias("_problem"), F.inline(events))


def _not_object(rows: DataFrame, image: str) -> Column:
    """An image that is JSON but not an object (its fields would all read as NULL). Images the
    JSON reader parsed as structs (a direct read) were checked by its first pass."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    if not isinstance(rows.schema[image].dataType, StringType):
        return F.lit(False)
    return F.col(image).isNotNull() & ~F.col(image).startswith("{")


def final_changes(
    events: DataFrame,
    toast_cols: list[str],
    moves: bool = True,
    max_rounds: int = 8,
    by: tuple[Column, ...] | None = None,
) -> DataFrame:
    """The last event per key. Unchanged-TOAST columns are filled from the latest earlier value of
    the same row in the batch, following primary-key changes; what the batch cannot supply is left
    to the target: ``need`` lists those columns and ``root`` is the key the row had before the
    batch, whose target row holds them. ``by``: the window partitioned by these columns (the
    key's, :func:`key_columns`) instead of :func:`by_key`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # per key, the latest event (a PK change's delete of the old key and upsert of the new one have
    # the same order but different keys)
    w = Window.partitionBy(*(by or by_key())).orderBy(*[F.col(c).desc() for c in ORDER], F.col("kind").desc())
    last = F.row_number().over(w)
    # Two different events of one key at one position (commit LSN, LSN) are no copies of one
    # change and no rows of one COPY (each of its own key): the input is corrupt, and which one is
    # last would depend on the read path. The latest event carries it as its problem (the table is
    # held back, the line named). The event before it is compared by its position and a hash of
    # its kind and values, all numbers: Spark 4.1 compared lead()'s string "D" with the row's "D"
    # as different in the one-pass write's plan (a collect of the same frame did not).
    prev = {c: F.lead(c, 1).over(w) for c in ("c", "l", "_h")}
    clash = (F.col("l") > 0) & (prev["c"] == F.col("c")) & (prev["l"] == F.col("l")) & (prev["_h"] != F.col("_h"))
    problem = F.when(clash, F.lit(CLASH)).otherwise(F.col("_problem"))
    events = events.withColumn("_h", F.xxhash64("kind", "v", "has"))
    if toast_cols:
        ev = fill_toast(events, toast_cols, moves, max_rounds).withColumns({"_n": last, "_problem": problem})
    else:  # fill_toast's two columns and the rank in one step
        ev = events.withColumns({**_nothing_to_fill(), "_n": last, "_problem": problem})
    return ev.where("_n = 1").drop("_n", "_h")


def fill_toast(events: DataFrame, toast_cols: list[str], moves: bool = True, max_rounds: int = 8) -> DataFrame:
    """Every event with its unchanged-TOAST columns filled from the batch where it can (``need``:
    the columns left to the target's row of the key ``root``)."""
    if toast_cols:
        return _fill_toast(events, toast_cols, max_rounds if moves else 0)
    return events.withColumns(_nothing_to_fill())


def _nothing_to_fill() -> dict[str, Column]:
    """fill_toast's columns when no column has an unchanged TOAST value: every row is its own root."""
    from pyspark.sql import functions as F

    return {"root": F.col("key"), "need": F.array().cast("array<string>")}


def _fill_toast(ev: DataFrame, cols: list[str], max_rounds: int) -> DataFrame:
    """Round by round: a window pass along each key, then the key changes whose old key's state is
    known look it up there. Without key changes that lack a value, one pass does it all."""
    from pyspark.sql import functions as F

    moved = (F.col("kind") == "U") & (F.col("src") != F.col("key"))
    ev = ev.withColumn("_mv", moved)
    ev = ev.withColumn("_res", ~moved | all_of([F.col("has")[c] for c in cols]))
    ev = ev.withColumn("root", F.when(moved, F.col("src")).otherwise(F.col("key")))
    if max_rounds == 0:  # no key change lacks a value: one pass along each key does it all
        ev = _carry(ev, cols)
    for rounds in range(max_rounds):
        # each round cuts the lineage (a local checkpoint): the plan stays one round deep
        ev = _carry(ev, cols).localCheckpoint()
        if ev.where(F.col("_mv") & ~F.col("_res")).limit(1).count() == 0:
            break
        if rounds == max_rounds - 1:
            raise InputError(
                f"more than {max_rounds} chained primary-key changes with unchanged TOAST values in one batch: "
                "apply the input in smaller batches (fewer files per run)"
            )
        ev = _resolve_moves(ev, cols)
    need = F.array_compact(F.array(*[F.when((F.col("kind") == "U") & ~F.col("has")[c], F.lit(c)) for c in cols]))
    return ev.withColumn("need", need).drop("_mv", "_res")


def _carry(ev: DataFrame, cols: list[str]) -> DataFrame:
    """Along each key: a missing value is the nearest earlier one; a delete or an unresolved key
    change before it stops the search (nothing, or wait for the next round)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    along = Window.partitionBy(*by_key()).orderBy(*[F.col(c) for c in ORDER])
    before = along.rowsBetween(Window.unboundedPreceding, -1)
    ev = ev.withColumn("_wait", F.lit(False))
    values = ev.schema["v"].dataType
    assert isinstance(values, StructType)  # the events' values: a struct of the table's columns
    for c in cols:
        vtype = values[c].dataType.simpleString()
        stop = (F.col("kind") == "D") | F.col("_mv") | F.col("has")[c]
        mark = F.when(
            stop,
            F.struct(
                F.col("kind").alias("k"),
                F.col("_mv").alias("m"),
                F.col("_res").alias("r"),
                F.col("has")[c].alias("h"),
                F.col("v")[c].cast(vtype).alias("x"),
                F.col("root").alias("root"),
            ),
        )
        p = F.last(mark, ignorenulls=True).over(before)
        ev = ev.withColumn("_p", p)
        # no mark before (the key's first events lack the value): _p is NULL, and so would every
        # test on it be; NULL-safe, so that no flag is NULL (a NULL flag drops the row below)
        lacking = (F.col("kind") == "U") & ~F.col("_mv") & ~F.col("has")[c]
        after_u = F.coalesce(F.col("_p.k") == "U", F.lit(False))
        take = lacking & after_u & F.coalesce(F.col("_p.h"), F.lit(False))
        wait = lacking & F.coalesce(F.col("_p.m") & ~F.col("_p.r"), F.lit(False))
        inherit = lacking & after_u & F.col("_p.root").isNotNull() & ~wait
        ev = (
            ev.withColumn("v", F.when(take, F.col("v").withField(quoted(c), F.col("_p.x"))).otherwise(F.col("v")))
            .withColumn("has", F.when(take, F.col("has").withField(quoted(c), F.lit(True))).otherwise(F.col("has")))
            .withColumn("root", F.when(inherit, F.col("_p.root")).otherwise(F.col("root")))
            .withColumn("_wait", F.col("_wait") | wait)
            .drop("_p")
        )
    return ev.withColumn("_res", F.when(F.col("_mv"), F.col("_res")).otherwise(~F.col("_wait"))).drop("_wait")


def _resolve_moves(ev: DataFrame, cols: list[str]) -> DataFrame:
    """Key changes lacking values take them from the old key's latest earlier state, once that
    state is itself resolved; with no earlier event on the old key, from its target row."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    states = ev.select(
        F.col("key").alias("_sk"),
        *[F.col(c).alias(f"_s{c}") for c in ORDER],
        F.col("kind").alias("_skind"),
        F.col("_res").alias("_sres"),
        F.col("root").alias("_sroot"),
        F.col("has").alias("_shas"),
        F.col("v").alias("_sv"),
    )
    unresolved = F.coalesce(F.col("_mv") & ~F.col("_res"), F.lit(False))
    todo = ev.where(unresolved)
    rest = ev.where(~unresolved)
    cond = (F.col("src") == F.col("_sk")) & (order_col("_s") < order_col())
    ids = [*ORDER, "kind", "key"]
    cand = todo.join(states, cond, "left")
    w = Window.partitionBy(*ids).orderBy(*[F.col(f"_s{c}").desc_nulls_last() for c in ORDER])
    cand = cand.withColumn("_n", F.row_number().over(w)).where("_n = 1").drop("_n")
    ready = F.col("_skind").isNull() | (F.col("_skind") == "D") | F.coalesce(F.col("_sres"), F.lit(False))
    for c in cols:
        take = ready & ~F.col("has")[c] & (F.col("_skind") == "U") & F.col("_shas")[c]
        cand = cand.withColumn(
            "v", F.when(take, F.col("v").withField(quoted(c), F.col("_sv")[c])).otherwise(F.col("v"))
        )
        cand = cand.withColumn(
            "has", F.when(take, F.col("has").withField(quoted(c), F.lit(True))).otherwise(F.col("has"))
        )
    cand = cand.withColumn(
        "root", F.when(ready & (F.col("_skind") == "U"), F.col("_sroot")).otherwise(F.col("root"))
    ).withColumn("_res", ready)
    cand = cand.drop(*[c for c in cand.columns if c.startswith("_s")])
    return rest.unionByName(cand)
