"""Committed changes, and what the driver learns of the input's structure (in Spark tasks).

* :func:`committed` — rows of committed transactions only, each with its commit LSN: plain rows
  joined to their ``commit``, prepared rows to their ``commit_prepared`` (by gid and xid),
  streamed rows to the ``stream_commit`` (or ``stream_prepare``) of their top-level transaction;
  rows of aborted sub-transactions dropped. Snapshot rows and manifests become inserts and a
  TRUNCATE at the snapshot position.
* :func:`structure` — counts, the relation records, and which rules the input needs.

Order everywhere: (commit LSN, change LSN) as 64-bit integers, then the line's place in the input
(``_rank``, ``_blk``, ``_mid``), which orders test_decoding's changes (they have no LSN) and makes
the duplicates of an at-least-once delivery (same commit and change LSN) collapse harmlessly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgrecv.errors import InputError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row


ROW_OPS = ("insert", "update", "delete")
NOT_OBJECT = "with a row image that is not a JSON object"
NO_KEY = "without a value for its key column"  # a row image that lacks its key (or holds NULL in it)
# another change of the same row at the same commit LSN and LSN (replay.events.final_changes)
CLASH = "at the position (commit LSN, LSN) of another change of the same row"
CHANGE_OPS = (*ROW_OPS, "truncate")
# every op of the format (docs/event-format.md); a line with another is corrupt (exit 9)
KNOWN_OPS = (
    *CHANGE_OPS,
    *("begin", "commit", "relation", "type", "origin", "message", "snapshot"),
    *("begin_prepare", "prepare", "commit_prepared", "rollback_prepared"),
    *("stream_start", "stream_stop", "stream_commit", "stream_abort", "stream_prepare"),
)
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


def order_col(prefix: str = "") -> Column:
    """The replay order of a row as one comparable struct."""
    from pyspark.sql import functions as F

    return F.struct(*[F.col(f"{prefix}{c}").alias(c) for c in ORDER])


def pos_col(prefix: str = "") -> Column:
    """A line's place in the input as one comparable struct (field names shared by every prefix)."""
    from pyspark.sql import functions as F

    return F.struct(*[F.col(f"{prefix}{c}").alias(c) for c in POS])


def order_lit(values: tuple[object, ...]) -> Column:
    from pyspark.sql import functions as F

    return F.struct(*[F.lit(v).cast(t).alias(c) for v, t, c in zip(values, ORDER_TYPES, ORDER, strict=True)])


def by_key(col: Column | None = None) -> tuple[Column, Column]:
    """A window's partitioning by the key struct, led by the key's hash: Spark's sort has no
    prefix for a struct, so without the hash every comparison of the sort before the window
    compares whole structs (measured: the last-event-per-key window at 1M events took 2.4 s
    more without it, 0.3 s with it)."""
    from pyspark.sql import functions as F

    key = F.col("key") if col is None else col
    return F.hash(key), key


def _first_after(rows: DataFrame, ends: DataFrame, on: Column) -> DataFrame:
    """Each row with the first ``ends`` record (by input position) after it that matches ``on``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    j = rows.join(ends, on & (pos_col("e") > pos_col()), "left")
    w = Window.partitionBy(*POS).orderBy(*[F.col(f"e{p}").asc_nulls_last() for p in POS])
    return j.withColumn("_n", F.row_number().over(w)).where("_n = 1").drop("_n")


def _streamed(r: DataFrame, is_change: Column) -> tuple[DataFrame, DataFrame]:
    """(committed rows of streamed transactions, rows of streamed prepared ones)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

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
        from pgrecv.spark.files import find_line

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


def _two_phase(r: DataFrame, is_change: Column, stream_prepared: DataFrame | None) -> tuple[DataFrame, DataFrame]:
    """(rows of prepared transactions committed in the input, rows still pending)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

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


def commit_hint(commits: DataFrame, st: Structure) -> DataFrame:
    """The commit LSNs with their join hint: broadcast while the input's transactions are few,
    else sorted and merged. The merge needs its hint too: the adaptive plan would broadcast them
    anyway once their shuffle is under its threshold, and a few MB of compressed LSNs can be
    millions of them."""
    from pyspark.sql import functions as F

    return F.broadcast(commits) if broadcasts_commits(st) else commits.hint("merge")


def committed(
    records: DataFrame,
    manifests: list[tuple[str, str, int]],
    st: Structure,
    commits: DataFrame | None = None,
    keep: Column | None = None,
) -> tuple[DataFrame, DataFrame | None]:
    """(committed changes, pending prepared rows or None) from all records. The rules for streamed
    and two-phase transactions join the plan only when the input has such records (``st``).
    ``commits``: the commit LSNs (``c``) when the caller has them (a plain input read directly,
    :mod:`pgrecv.spark.direct`: no snapshot rows either), with :func:`commit_hint`'s join hint;
    ``keep``: instead, a predicate over ``commit_lsn_i`` that says it (``direct.Plain.keep``)."""
    from pyspark.sql import functions as F

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


def relation_record(rel: Row) -> dict[str, Any]:
    """A collected relation record (a Row) as the plan reads it."""
    return {
        "schema": rel["schema"],
        "table": rel["table"],
        "replica_identity": rel["replica_identity"],
        "key": list(rel["key"] or []),
        "columns": [c.asDict() for c in rel["columns"]],
    }


def changed_tables() -> list[Column]:
    """Aggregates of the tables that row changes and TRUNCATEs name (``rows``, ``truncated``),
    for :func:`unrelated`."""
    from pyspark.sql import functions as F

    op = F.col("op")
    return [
        F.collect_set(F.when(op.isin(*ROW_OPS), F.struct("schema", "table"))).alias("rows"),
        F.collect_set(F.when(op == "truncate", F.col("tables"))).alias("truncated"),
    ]


def unrelated(head: Row, s: Structure) -> set[tuple[str, str]]:
    """The tables changed without a relation record anywhere in the input: their changes would
    be dropped unread, as of a table not wanted."""
    named = {(r["schema"], r["table"]) for r in head["rows"]}
    named |= {(t["schema"], t["table"]) for ts in head["truncated"] for t in ts or []}
    return {n for n in named if None not in n} - set(s.relations)


def structure(records: DataFrame) -> Structure:
    """Counts for the summary, the relation records (collected: a few per table and file), and
    which rules the input needs: two small jobs over a few columns."""
    from pyspark.sql import functions as F

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
        *changed_tables(),
    ).first()
    assert head is not None
    s.lines = int(head["n"])
    s.chunked, s.prepared = int(head["chunked"]), int(head["prepared"])
    rels = sorted(head["r"], key=lambda x: tuple(x["p"]))
    for rel in rels:
        if rel["schema"] is None or rel["table"] is None or rel["columns"] is None:
            raise InputError("the input has a relation record without schema, table or columns: it is corrupt")
        s.relations.setdefault((rel["schema"], rel["table"]), []).append(relation_record(rel))
    unknown = sorted(unrelated(head, s))
    if unknown:
        from pgrecv.spark.files import find_line

        schema, table = unknown[0]
        named = (op.isin(*ROW_OPS) & (F.col("schema") == schema) & (F.col("table") == table)) | (
            (op == "truncate") & F.exists("tables", lambda t: (t["schema"] == schema) & (t["table"] == table))
        )
        first = r.where(named).orderBy(*POS).select("_path", "op", "lsn").limit(1).collect()[0]
        where = find_line(first["_path"], {"op": first["op"], "lsn": first["lsn"]})
        raise InputError(
            f"{where}: {first['op']} of {schema}.{table}, and no relation record of that table in the input: "
            "its changes cannot be read (a file of `pgrecv start` repeats the records its rows need); "
            "give spark-apply the files from the one that holds it on"
        )
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

    def n(cond: Column) -> Column:
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


def all_of(conds: list[Column]) -> Column:
    """The conjunction of boolean columns (true for none)."""
    from pyspark.sql import functions as F

    out = F.lit(True)
    for c in conds:
        out = out & c
    return out
