"""docs/spark-apply.md's replay rules as DataFrame operations (they run in Spark tasks).

* :func:`committed` — rows of committed transactions only, each with its commit LSN: plain rows
  joined to their ``commit``, prepared rows to their ``commit_prepared`` (by gid and xid),
  streamed rows to the ``stream_commit`` (or ``stream_prepare``) of their top-level transaction;
  rows of aborted sub-transactions dropped. Snapshot rows and manifests become inserts and a
  TRUNCATE at the snapshot position.
* :func:`table_changes` — one table's changes as key/value events, past the applied position
  and after the last TRUNCATE, a primary-key change split into a delete and an upsert.
* :func:`final_changes` — the last event per key, unchanged-TOAST columns filled from the latest
  earlier value in the batch (following key changes), else marked for the target's row.

Order everywhere: (commit LSN, change LSN) as 64-bit integers, then the line's place in the input
(``_rank``, ``_blk``, ``_mid``), which orders test_decoding's changes (they have no LSN) and makes
the duplicates of an at-least-once delivery (same commit and change LSN) collapse harmlessly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pgrecv.errors import InputError
from pgrecv.spark.convert import json_member, scalar
from pgrecv.spark.source import JSON_LIMITS
from pgrecv.spark.types import ColumnType

ROW_OPS = ("insert", "update", "delete")
NOT_OBJECT = "with a row image that is not a JSON object"
CHANGE_OPS = (*ROW_OPS, "truncate")
POS = ("_rank", "_blk", "_mid")
ORDER = ("c", "l", *POS)
KEEP = (
    "op",
    "schema",
    "table",
    "tables",
    "new",
    "old",
    "unchanged_toast",
    "old_unchanged_toast",
    "json_nulls",
    "old_json_nulls",
    "xid",
    "commit_time",
    "_path",
    "lsn",
    "lsn_i",
    *POS,
)


@dataclass
class Structure:
    """What the driver learns from the (few) structural records."""

    lines: int = 0
    transactions: int = 0
    incomplete: int = 0
    rolled_back: int = 0
    relations: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    missing_prepared: list[tuple[str, int]] = field(default_factory=list)
    # which replay rules the input needs at all (rules it does not need stay out of the plan)
    chunked: int = 0  # change records outside a plain or prepared transaction (streamed chunks)
    prepared: int = 0  # records of two-phase transactions


ORDER_TYPES = ("bigint", "bigint", "int", "bigint", "bigint")


def order_col(prefix: str = "") -> Any:
    """The replay order of a row as one comparable struct."""
    F = _F()
    return F.struct(*[F.col(f"{prefix}{c}").alias(c) for c in ORDER])


def pos_col(prefix: str = "") -> Any:
    """A line's place in the input as one comparable struct (field names shared by every prefix)."""
    F = _F()
    return F.struct(*[F.col(f"{prefix}{c}").alias(c) for c in POS])


def order_lit(values: tuple[Any, ...]) -> Any:
    F = _F()
    return F.struct(*[F.lit(v).cast(t).alias(c) for v, t, c in zip(values, ORDER_TYPES, ORDER, strict=True)])


def by_key(col: Any = None) -> tuple[Any, Any]:
    """A window's partitioning by the key struct, led by the key's hash: Spark's sort has no
    prefix for a struct, so without the hash every comparison of the sort before the window
    compares whole structs (measured: the last-event-per-key window at 1M events took 2.4 s
    more without it, 0.3 s with it)."""
    F = _F()
    key = F.col("key") if col is None else col
    return F.hash(key), key


def key_columns(plan: TablePlan) -> dict[str, Any] | None:
    """The key's columns as columns of their own (``_k0``, ``_k1``, ...), to partition the last
    event's window by and to join the target on: the final events then come out of the window
    partitioned as the one-pass join needs them, and Spark shuffles them once (a window's
    partitioning by an expression such as ``key.id`` is lost after it; bench/NOTES.md,
    2026-12-03, night). None for REPLICA IDENTITY FULL, whose join is NULL-safe."""
    if plan.full or not plan.key_cols:
        return None
    F = _F()
    return {f"_k{i}": F.col("key")[k] for i, k in enumerate(plan.key_cols)}


def _F() -> Any:
    from pyspark.sql import functions as F

    return F


def _first_after(rows: Any, ends: Any, on: Any) -> Any:
    """Each row with the first ``ends`` record (by input position) after it that matches ``on``."""
    from pyspark.sql import Window

    F = _F()
    j = rows.join(ends, on & (pos_col("e") > pos_col()), "left")
    w = Window.partitionBy(*POS).orderBy(*[F.col(f"e{p}").asc_nulls_last() for p in POS])
    return j.withColumn("_n", F.row_number().over(w)).where("_n = 1").drop("_n")


def _streamed(r: Any, is_change: Any) -> tuple[Any, Any]:
    """(committed rows of streamed transactions, rows of streamed prepared ones)."""
    from pyspark.sql import Window

    F = _F()
    # streamed chunks: the top-level xid is the enclosing stream_start's (rows of sub-transactions
    # carry their own xid), so this one rule is positional: a window over each file in line order
    chunky = F.col("commit_lsn_i").isNull() & F.col("gid").isNull()
    marks = r.where(F.col("op").isin("stream_start", "stream_stop") | (is_change & chunky))
    w = Window.partitionBy("_path").orderBy("_blk", "_mid").rowsBetween(Window.unboundedPreceding, 0)
    mark = F.when(F.col("op") == "stream_start", F.col("xid")).when(F.col("op") == "stream_stop", F.lit(-1))
    streamed = (
        marks.withColumn("top", F.last(mark, ignorenulls=True).over(w))
        .where(is_change)
        .withColumn("top", F.when(F.col("top") >= 0, F.col("top")))
    )
    stray = streamed.where("top IS NULL").select("op", "_path", "lsn", "xid").limit(1).collect()
    if stray:
        from pgrecv.spark.source import find_line

        s = stray[0]
        where = find_line(s["_path"], {"op": s["op"], "lsn": s["lsn"], "xid": s["xid"]})
        raise InputError(
            f"{where}: {s['op']} outside a transaction (no begin or stream_start before it): the file is corrupt"
        )
    ends = r.where(
        F.col("op").isin("stream_commit", "stream_prepare")
        | ((F.col("op") == "stream_abort") & (F.col("subxid") == F.col("xid")))
    ).select(
        F.col("xid").alias("exid"),
        F.col("op").alias("eop"),
        F.col("commit_lsn_i").alias("ec"),
        F.col("commit_time").alias("etime"),
        F.col("gid").alias("egid"),
        *[F.col(p).alias(f"e{p}") for p in POS],
    )
    streamed = _first_after(streamed, ends, F.col("top") == F.col("exid"))
    subaborts = r.where("op = 'stream_abort' AND subxid <> xid").select(
        F.col("xid").alias("axid"), F.col("subxid").alias("asub"), *[F.col(p).alias(f"a{p}") for p in POS]
    )
    apos = pos_col("a")
    aborted_sub = (
        (F.col("top") == F.col("axid"))
        & (F.col("xid") == F.col("asub"))
        & (apos > pos_col())
        & (F.col("eop").isNull() | (apos < pos_col("e")))
    )
    streamed = streamed.join(subaborts, aborted_sub, "left_anti")
    stream_done = streamed.where("eop = 'stream_commit'").select(
        *[c for c in KEEP if c != "commit_time"], F.col("etime").alias("commit_time"), F.col("ec").alias("c")
    )
    stream_prepared = streamed.where("eop = 'stream_prepare'").select(
        *[c for c in KEEP if c not in ("xid",)],
        F.col("top").alias("xid"),
        F.col("egid").alias("gid"),
        *[F.col(f"e{p}").alias(f"p{p}") for p in POS],
    )
    return stream_done, stream_prepared


def _two_phase(r: Any, is_change: Any, stream_prepared: Any) -> tuple[Any, Any]:
    """(rows of prepared transactions committed in the input, rows still pending)."""
    from pyspark.sql import Window

    F = _F()
    # two-phase: rows of a prepared transaction wait for commit_prepared of their gid (and xid)
    prepared = r.where(is_change & F.col("commit_lsn_i").isNull() & F.col("gid").isNotNull()).select(
        *KEEP, "gid", *[F.col(p).alias(f"p{p}") for p in POS]
    )
    if stream_prepared is not None:
        prepared = prepared.unionByName(stream_prepared)
    outcomes = r.where(F.col("op").isin("commit_prepared", "rollback_prepared")).select(
        F.col("gid").alias("ogid"),
        F.col("xid").alias("oxid"),
        F.col("op").alias("oop"),
        F.col("commit_lsn_i").alias("oc"),
        F.col("commit_time").alias("otime"),
        *[F.col(p).alias(f"o{p}") for p in POS],
    )
    on = (
        (F.col("gid") == F.col("ogid"))
        & (F.col("oxid").isNull() | F.col("xid").isNull() | (F.col("oxid") == F.col("xid")))
        & (pos_col("o") > pos_col("p"))
    )
    j = prepared.join(outcomes, on, "left")
    wp = Window.partitionBy(*POS).orderBy(*[F.col(f"o{p}").asc_nulls_last() for p in POS])
    j = j.withColumn("_n", F.row_number().over(wp)).where("_n = 1").drop("_n")
    two_phase = j.where("oop = 'commit_prepared'").select(
        *[c for c in KEEP if c != "commit_time"], F.col("otime").alias("commit_time"), F.col("oc").alias("c")
    )
    pending = j.where("oop IS NULL").select(*KEEP, "gid")
    return two_phase, pending


# The most commit LSNs that are broadcast to the changes' semi-join. They are one per transaction,
# and a broadcast is built in the driver's JVM: OLTP's one-change transactions would make the
# driver's memory grow with the input (5M of them ran out of the default 1 GB, "Not enough memory
# to build and broadcast the table"). Past this, a sort-merge join. Spark's own broadcast
# threshold, 10 MB, admits about as many by its size estimate of a long.
BROADCAST_COMMITS = 500_000


def broadcasts_commits(st: Structure) -> bool:
    """Whether the input's transactions are few enough for :func:`commit_hint` to broadcast."""
    return st.transactions <= BROADCAST_COMMITS


def commit_hint(commits: Any, st: Structure) -> Any:
    """The commit LSNs with their join hint: broadcast while the input's transactions are few,
    else sorted and merged. The merge needs its hint too: the adaptive plan would broadcast them
    anyway once their shuffle is under its threshold, and a few MB of compressed LSNs can be
    millions of them."""
    F = _F()
    return F.broadcast(commits) if broadcasts_commits(st) else commits.hint("merge")


def committed(
    records: Any, manifests: list[tuple[str, str, int]], st: Structure, commits: Any = None, keep: Any = None
) -> tuple[Any, Any]:
    """(committed changes, pending prepared rows or None) from all records. The rules for streamed
    and two-phase transactions join the plan only when the input has such records (``st``).
    ``commits``: the commit LSNs (``c``) when the caller has them (a plain input read directly,
    :mod:`pgrecv.spark.direct`: no snapshot rows either), with :func:`commit_hint`'s join hint;
    ``keep``: instead, a predicate over ``commit_lsn_i`` that says it (``direct.Plain.keep``)."""
    F = _F()
    r = records
    is_change = F.col("op").isin(*CHANGE_OPS)

    # plain transactions: the row's commit_lsn has a commit record
    direct = commits is not None or keep is not None
    plain = r.where(is_change & F.col("commit_lsn_i").isNotNull())
    if keep is not None:
        plain = plain.where(keep)
    else:
        if commits is None:
            commits = commit_hint(r.where("op = 'commit'").select(F.col("commit_lsn_i").alias("c")).distinct(), st)
        plain = plain.join(commits, F.col("commit_lsn_i") == F.col("c"), "left_semi")
    plain = plain.select(*KEEP, F.col("commit_lsn_i").alias("c"))

    stream_done = stream_prepared = None
    if st.chunked:
        stream_done, stream_prepared = _streamed(r, is_change)
    two_phase = pending = None
    if st.prepared:
        two_phase, pending = _two_phase(r, is_change, stream_prepared)

    # snapshots: rows are inserts at the snapshot position (consistent point - 1), after a TRUNCATE
    snap = None
    if not direct:
        snap = r.where("op = 'snapshot'").select(
            *[F.lit("insert").alias("op") if c == "op" else F.col(c) for c in KEEP],
            (F.col("snapshot_lsn_i") - 1).alias("c"),
        )
    out = plain
    for p in (stream_done, two_phase, snap):
        if p is not None:
            out = out.unionByName(p)
    out = out.withColumn("l", F.coalesce(F.col("lsn_i"), F.lit(0).cast("bigint")))
    if manifests:
        spark = records.sparkSession
        trunc = spark.createDataFrame(
            [(s, t, pos) for s, t, pos in manifests],
            "schema string, `table` string, c long",
        ).select(
            F.lit("truncate").alias("op"),
            F.lit(None).cast("string").alias("schema"),
            F.lit(None).cast("string").alias("table"),
            F.array(F.struct(F.col("schema").alias("schema"), F.col("table").alias("table"))).alias("tables"),
            "c",
        )
        full = trunc
        for c in out.columns:
            if c not in full.columns:
                full = full.withColumn(c, F.lit(None).cast(out.schema[c].dataType))
        full = full.withColumn("l", F.lit(0).cast("bigint")).withColumn("_rank", F.lit(-(2**31)).cast("int"))
        out = out.unionByName(full.select(*out.columns))
    return out, pending


def relation_record(rel: Any) -> dict[str, Any]:
    """A collected relation record (a Row) as the plan reads it."""
    return {
        "schema": rel["schema"],
        "table": rel["table"],
        "replica_identity": rel["replica_identity"],
        "key": list(rel["key"] or []),
        "columns": [c.asDict() for c in rel["columns"]],
    }


def structure(records: Any) -> Structure:
    """Counts for the summary, the relation records (collected: a few per table and file), and
    which rules the input needs: two small jobs over a few columns."""
    F = _F()
    r = records
    s = Structure()
    op = F.col("op")
    is_change = op.isin(*CHANGE_OPS)
    rel = F.struct(pos_col().alias("p"), "schema", "table", "replica_identity", "key", "columns")
    head = r.agg(
        F.count(F.lit(1)).alias("n"),
        F.collect_list(F.when(op == "relation", rel)).alias("r"),
        F.count(F.when(is_change & F.col("commit_lsn_i").isNull() & F.col("gid").isNull(), 1)).alias("chunked"),
        F.count(F.when(F.col("gid").isNotNull() | (op == "stream_prepare"), 1)).alias("prepared"),
    ).first()
    assert head is not None
    s.lines = int(head["n"])
    s.chunked, s.prepared = int(head["chunked"]), int(head["prepared"])
    rels = sorted(head["r"], key=lambda x: tuple(x["p"]))
    for rel in rels:
        if rel["schema"] is None or rel["table"] is None or rel["columns"] is None:
            raise InputError("the input has a relation record without schema, table or columns: it is corrupt")
        s.relations.setdefault((rel["schema"], rel["table"]), []).append(relation_record(rel))
    # one row per transaction (plain: by commit LSN; streamed: by xid; prepared: by gid and xid)
    kind = (
        F.when(op.isin("begin", "commit"), F.lit("T"))
        .when(op.isin("commit_prepared", "rollback_prepared"), F.lit("P"))
        .otherwise(F.lit("S"))
    )
    k = (
        F.when(op.isin("begin", "commit"), F.col("commit_lsn_i").cast("string"))
        .when(op.isin("commit_prepared", "rollback_prepared"), F.concat_ws("/", "gid", F.col("xid").cast("string")))
        .otherwise(F.col("xid").cast("string"))
    )
    flags = ["begin", "commit", "stream_start", "stream_commit", "stream_abort", "stream_prepare"]
    flags += ["commit_prepared", "rollback_prepared"]
    top_abort = (op == "stream_abort") & (F.col("subxid") == F.col("xid"))
    per_txn = (
        r.where(op.isin(*flags) & ((op != "stream_abort") | top_abort))
        .select(kind.alias("kind"), k.alias("k"), "op")
        .where("k IS NOT NULL")
        .groupBy("kind", "k")
        .agg(*[F.max(op == f).alias(f) for f in flags])
    )

    def n(cond: Any) -> Any:
        return F.count(F.when(cond, 1))

    c = {f: F.col(f) for f in flags}
    ended = c["stream_commit"] | c["stream_abort"] | c["stream_prepare"]
    counts = per_txn.agg(
        n(c["commit"] | c["stream_commit"] | c["commit_prepared"]).alias("transactions"),
        n(c["rollback_prepared"] | c["stream_abort"]).alias("rolled_back"),
        n((c["begin"] & ~c["commit"]) | (c["stream_start"] & ~ended)).alias("incomplete"),
    ).first()
    assert counts is not None
    s.transactions, s.rolled_back, s.incomplete = counts["transactions"], counts["rolled_back"], counts["incomplete"]
    return s


# --- one table ----------------------------------------------------------------------------------


@dataclass
class TablePlan:
    schema: str
    table: str
    columns: dict[str, ColumnType]  # every column of the target after this batch
    key_cols: list[str]
    full: bool  # REPLICA IDENTITY FULL without a key: rows are identified by all columns (NULL-safe)
    append_only: bool
    pg_columns: list[str]  # the columns PostgreSQL sends (the latest relation's)

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


def texts_type(plan: TablePlan) -> str:
    return "struct<" + ", ".join(f"`{n.replace('`', '``')}`: string" for n in plan.columns) + ">"


def parse_images(rows: Any, plan: TablePlan, images: tuple[str, ...] = ("new", "old")) -> Any:
    """Each row image parsed once, in its own projection (``_<image>_t``: a struct of the
    columns' JSON texts), so that the many expressions over its columns do not parse it again."""
    from pyspark.sql.types import StructType

    F = _F()
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


def image_texts(image: str, plan: TablePlan, json_nulls: Any) -> dict[str, Any]:
    """Column → its JSON text in the (parsed) image; json/jsonb: the exact text the server sent."""
    F = _F()
    parsed = F.col(f"_{image}_t")
    out: dict[str, Any] = {}
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


def typed(texts: dict[str, Any], plan: TablePlan) -> tuple[dict[str, Any], dict[str, Any]]:
    """(typed values, ok flags) of columns given as their JSON texts."""
    values: dict[str, Any] = {}
    oks: dict[str, Any] = {}
    for n, text in texts.items():
        ct = plan.columns[n]
        if ct.is_json:
            values[n], oks[n] = text, _F().lit(True)
        else:
            values[n], oks[n] = scalar(text, ct)
    return values, oks


def table_changes(
    changes: Any,
    plan: TablePlan,
    applied: int | None,
    truncate_at: tuple[Any, ...] | None,
    history: bool = False,
    dedupe: bool = True,
) -> Any:
    """The table's events, in order: kind U (upsert the image) or D (delete the key); a primary-key
    change is a D of the old key and a U of the new one (``src``: the old key). Keys are typed;
    the other values stay their JSON texts (``v``) until the last event per key is known, so each
    value is converted once, not once per change. ``history``: a D holds the old image PostgreSQL
    sent (its version row shows it), not just the key. ``dedupe=False`` keeps the copies of an
    at-least-once delivery: right when only the last event per key matters and no TOAST value is
    looked up along the key (the copies then replay identically), and it saves a shuffle of every
    row with its images."""
    F = _F()
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
    # same commit and change LSN; one copy stays. (Copies left in would break the lookup of a key
    # change's old row: the second copy of the move would find the first one's delete.)
    # test_decoding's changes have no LSN, and their copies replay identically in input order.
    if dedupe:
        t = t.where(F.col("l") > 0).dropDuplicates(["c", "l", "op"]).unionByName(t.where(F.col("l") <= 0))
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

    def event(kind: str, key: dict[str, Any], src: dict[str, Any], v: dict[str, Any], has: dict[str, Any]) -> Any:
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
    problem = (
        F.when(F.col("op").isin("insert", "update") & F.col("new").isNull(), F.lit("without a new row image"))
        .when((F.col("op") == "delete") & ~has_old, F.lit("without an old row image (REPLICA IDENTITY NOTHING?)"))
        .when(F.col("op").isin("insert", "update") & _not_object(t, "new"), F.lit(NOT_OBJECT))
        .when(_not_object(t, "old"), F.lit(NOT_OBJECT))
    )
    # inline: the events' fields as columns in this one step (explode, then "e.*", took two)
    return t.select("op", *ORDER, "_path", "lsn", "commit_time", problem.alias("_problem"), F.inline(events))


def _not_object(rows: Any, image: str) -> Any:
    """An image that is JSON but not an object (its fields would all read as NULL). Images the
    JSON reader parsed as structs (a direct read) were checked by its first pass."""
    from pyspark.sql.types import StringType

    F = _F()
    if not isinstance(rows.schema[image].dataType, StringType):
        return F.lit(False)
    return F.col(image).isNotNull() & ~F.col(image).startswith("{")


def final_changes(
    events: Any,
    plan: TablePlan,
    toast_cols: list[str],
    moves: bool = True,
    max_rounds: int = 8,
    by: tuple[Any, ...] | None = None,
) -> Any:
    """The last event per key. Unchanged-TOAST columns are filled from the latest earlier value of
    the same row in the batch, following primary-key changes; what the batch cannot supply is left
    to the target: ``need`` lists those columns and ``root`` is the key the row had before the
    batch, whose target row holds them. ``by``: the window partitioned by these columns (the
    key's, :func:`key_columns`) instead of :func:`by_key`."""
    from pyspark.sql import Window

    F = _F()
    # per key, the latest event (a PK change's delete of the old key and upsert of the new one have
    # the same order but different keys)
    w = Window.partitionBy(*(by or by_key())).orderBy(*[F.col(c).desc() for c in ORDER], F.col("kind").desc())
    last = F.row_number().over(w)
    if toast_cols:
        ev = fill_toast(events, toast_cols, moves, max_rounds).withColumn("_n", last)
    else:  # fill_toast's two columns and the rank in one step
        ev = events.withColumns({**_nothing_to_fill(), "_n": last})
    return ev.where("_n = 1").drop("_n")


def fill_toast(events: Any, toast_cols: list[str], moves: bool = True, max_rounds: int = 8) -> Any:
    """Every event with its unchanged-TOAST columns filled from the batch where it can (``need``:
    the columns left to the target's row of the key ``root``)."""
    if toast_cols:
        return _fill_toast(events, toast_cols, max_rounds if moves else 0)
    return events.withColumns(_nothing_to_fill())


def _nothing_to_fill() -> dict[str, Any]:
    """fill_toast's columns when no column has an unchanged TOAST value: every row is its own root."""
    F = _F()
    return {"root": F.col("key"), "need": F.array().cast("array<string>")}


def _fill_toast(ev: Any, cols: list[str], max_rounds: int) -> Any:
    """Round by round: a window pass along each key, then the key changes whose old key's state is
    known look it up there. Without key changes that lack a value, one pass does it all."""
    F = _F()
    moved = (F.col("kind") == "U") & (F.col("src") != F.col("key"))
    ev = ev.withColumn("_mv", moved)
    ev = ev.withColumn("_res", ~moved | all_of([F.col(f"has.{c}") for c in cols]))
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
    need = F.array_compact(F.array(*[F.when((F.col("kind") == "U") & ~F.col(f"has.{c}"), F.lit(c)) for c in cols]))
    return ev.withColumn("need", need).drop("_mv", "_res")


def _carry(ev: Any, cols: list[str]) -> Any:
    """Along each key: a missing value is the nearest earlier one; a delete or an unresolved key
    change before it stops the search (nothing, or wait for the next round)."""
    from pyspark.sql import Window

    F = _F()
    along = Window.partitionBy(*by_key()).orderBy(*[F.col(c) for c in ORDER])
    before = along.rowsBetween(Window.unboundedPreceding, -1)
    ev = ev.withColumn("_wait", F.lit(False))
    for c in cols:
        vtype = ev.schema["v"].dataType[c].dataType.simpleString()
        stop = (F.col("kind") == "D") | F.col("_mv") | F.col(f"has.{c}")
        mark = F.when(
            stop,
            F.struct(
                F.col("kind").alias("k"),
                F.col("_mv").alias("m"),
                F.col("_res").alias("r"),
                F.col(f"has.{c}").alias("h"),
                F.col(f"v.{c}").cast(vtype).alias("x"),
                F.col("root").alias("root"),
            ),
        )
        p = F.last(mark, ignorenulls=True).over(before)
        ev = ev.withColumn("_p", p)
        # no mark before (the key's first events lack the value): _p is NULL, and so would every
        # test on it be; NULL-safe, so that no flag is NULL (a NULL flag drops the row below)
        lacking = (F.col("kind") == "U") & ~F.col("_mv") & ~F.col(f"has.{c}")
        after_u = F.coalesce(F.col("_p.k") == "U", F.lit(False))
        take = lacking & after_u & F.coalesce(F.col("_p.h"), F.lit(False))
        wait = lacking & F.coalesce(F.col("_p.m") & ~F.col("_p.r"), F.lit(False))
        inherit = lacking & after_u & F.col("_p.root").isNotNull() & ~wait
        ev = (
            ev.withColumn("v", F.when(take, F.col("v").withField(c, F.col("_p.x"))).otherwise(F.col("v")))
            .withColumn("has", F.when(take, F.col("has").withField(c, F.lit(True))).otherwise(F.col("has")))
            .withColumn("root", F.when(inherit, F.col("_p.root")).otherwise(F.col("root")))
            .withColumn("_wait", F.col("_wait") | wait)
            .drop("_p")
        )
    return ev.withColumn("_res", F.when(F.col("_mv"), F.col("_res")).otherwise(~F.col("_wait"))).drop("_wait")


def _resolve_moves(ev: Any, cols: list[str]) -> Any:
    """Key changes lacking values take them from the old key's latest earlier state, once that
    state is itself resolved; with no earlier event on the old key, from its target row."""
    from pyspark.sql import Window

    F = _F()
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
        take = ready & ~F.col(f"has.{c}") & (F.col("_skind") == "U") & F.col(f"_shas.{c}")
        cand = cand.withColumn("v", F.when(take, F.col("v").withField(c, F.col(f"_sv.{c}"))).otherwise(F.col("v")))
        cand = cand.withColumn("has", F.when(take, F.col("has").withField(c, F.lit(True))).otherwise(F.col("has")))
    cand = cand.withColumn(
        "root", F.when(ready & (F.col("_skind") == "U"), F.col("_sroot")).otherwise(F.col("root"))
    ).withColumn("_res", ready)
    cand = cand.drop(*[c for c in cand.columns if c.startswith("_s")])
    return rest.unionByName(cand)


def all_of(conds: list[Any]) -> Any:
    """The conjunction of boolean columns (true for none)."""
    F = _F()
    out = F.lit(True)
    for c in conds:
        out = out & c
    return out
