"""What the writers that commit through Spark (Delta's connector, Iceberg's runtime) derive from a
:class:`~pgrecv.spark.tables.Batch`: its new rows, a MERGE's source and condition, a one-pass
overwrite's rows, and the lean read's settle before the commit. One owner of these rules, so
that the two connectors apply a batch alike; each writer only says how its format commits them.

A merge source has the key as ``_pgrecv_k0``, ``_pgrecv_k1``, ... (the target's own key columns
keep their names, so that the two never clash), the table's columns, and ``_pgrecv_kind``:
``U`` (the key's row after the batch) or ``D`` (the key is deleted); history mode's source has
``_pgrecv_op`` instead: ``C`` (close the key's current version: the ``_end_*`` columns) or ``I``
(insert a version). Where a table has a column whose name starts with ``_pgrecv_``, the prefix
takes more underscores until no column's does (:func:`own`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pgrecv.spark.schema import quoted
from pgrecv.spark.tables import Batch
from pgrecv.spark.tables.rewrite import END_COLS, close_versions

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def own(batch: Batch, name: str) -> str:
    """The merge source's name for its own column ``name`` (``kind``, ``op``, ``k0``, ...): a
    prefix that starts no column name of the table's."""
    prefix = "_pgrecv_"
    while any(n.startswith(prefix) for n in batch.schema.names):
        prefix += "_"
    return prefix + name


def key_name(batch: Batch, i: int) -> str:
    """The merge source's name of the i-th key column."""
    return own(batch, f"k{i}")


def new_rows(batch: Batch) -> DataFrame:
    """The rows the batch inserts or updates (the table's columns, in order)."""
    from pyspark.sql import functions as F

    names = batch.schema.names
    if batch.final is not None:
        return batch.final.where(F.col("_kind") == "U").select(*[F.col("_v")[n].alias(n) for n in names])
    assert batch.upserts is not None
    return batch.upserts.select(*[F.col(quoted(n)) for n in names])


def settled(batch: Batch) -> DataFrame:
    """The lean read counts its changes in the job that reads them and settles them before the
    commit (:attr:`Batch.settle`), which a MERGE or a write makes in the same call as its job:
    the final events are kept first (memory, else the executors' disks: a job of their own,
    which takes the counts), settled, and the write reads them from there. Returns them, to be
    let go after the commit. (A copy written as Parquet in the table's directory measured the
    same, and leaves files behind when the run is killed.)"""
    from pyspark import StorageLevel

    assert batch.final is not None and batch.settle is not None
    kept = batch.final.persist(StorageLevel.MEMORY_AND_DISK)
    kept.count()
    batch.settle()
    batch.final = kept
    return kept


def matches(batch: Batch, target: str = "t", source: str = "s") -> Column:
    """A target row is the source row's key (NULL-safe under REPLICA IDENTITY FULL)."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    for i, k in enumerate(batch.key_cols):
        a, b = F.col(f"{target}.{quoted(k)}"), F.col(f"{source}.{key_name(batch, i)}")
        cond = cond & (a.eqNullSafe(b) if batch.null_safe else a == b)
    return cond


def matches_sql(batch: Batch, target: str = "t", source: str = "s") -> str:
    """:func:`matches` as SQL text (for a MERGE statement)."""
    eq = "<=>" if batch.null_safe else "="
    return " AND ".join(
        f"{target}.{quoted(k)} {eq} {source}.{key_name(batch, i)}" for i, k in enumerate(batch.key_cols)
    )


def latest_merge_sql(batch: Batch) -> tuple[str, str]:
    """A latest-mode ``MERGE INTO … t USING <latest_source> s``'s condition and clauses as SQL text:
    a key's delete deletes its row, an upsert updates or inserts it."""
    names = [quoted(n) for n in batch.schema.names]
    kind = "s." + own(batch, "kind")
    return matches_sql(batch), (
        f"WHEN MATCHED AND {kind} = 'D' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{n} = s.{n}' for n in names)} "
        f"WHEN NOT MATCHED AND {kind} = 'U' THEN INSERT ({', '.join(names)}) VALUES "
        f"({', '.join(f's.{n}' for n in names)})"
    )


def history_merge_sql(batch: Batch, stored: Callable[[str], str] = str) -> tuple[str, str]:
    """History mode's ``MERGE INTO … t USING <history_source> s``'s condition and clauses as SQL
    text: the current version of each touched key is closed (``_end_*`` set, ``_current`` false)
    and every new version inserted. ``stored``: a column's name in the table (Iceberg's own
    ``_deleted`` is stored under another)."""
    names = [quoted(stored(n)) for n in batch.schema.names]
    op = "s." + own(batch, "op")
    close = ", ".join([*(f"{quoted(c)} = s.{quoted(c)}" for c in END_COLS), "`_current` = false"])
    return f"{op} = 'C' AND t.`_current` AND {matches_sql(batch)}", (
        f"WHEN MATCHED THEN UPDATE SET {close} "
        f"WHEN NOT MATCHED AND {op} = 'I' THEN INSERT ({', '.join(names)}) VALUES "
        f"({', '.join(f's.{n}' for n in names)})"
    )


def latest_source(batch: Batch) -> DataFrame:
    """A latest-mode MERGE's source: every key the batch touches, with its row after the batch
    (``U``) or deleted (``D``)."""
    from pyspark.sql import functions as F

    names, keys = batch.schema.names, batch.key_cols
    if batch.final is not None:
        return batch.final.select(
            *[F.col("_k")[k].alias(key_name(batch, i)) for i, k in enumerate(keys)],
            *[F.col("_v")[n].alias(n) for n in names],
            F.col("_kind").alias(own(batch, "kind")),
        )
    # every touched key, with its new row where it has one (else: deleted)
    assert batch.keys is not None and batch.upserts is not None
    ks = batch.keys.select(*[F.col(quoted(k)).alias(key_name(batch, i)) for i, k in enumerate(keys)]).alias("k")
    ups = batch.upserts.select(*[F.col(quoted(n)) for n in names], F.lit(True).alias(own(batch, "op"))).alias("u")
    return ks.join(ups, matches(batch, target="u", source="k"), "left").select(
        *[F.col(f"k.{key_name(batch, i)}") for i in range(len(keys))],
        *[F.col(f"u.{quoted(n)}").alias(n) for n in names],
        F.when(F.col(f"u.{own(batch, 'op')}").isNull(), F.lit("D")).otherwise(F.lit("U")).alias(own(batch, "kind")),
    )


def history_source(batch: Batch) -> DataFrame:
    """History mode's MERGE source: the closes of the keys' current versions (``C``: key and
    ``_end_*``) and the new versions (``I``: every column)."""
    from pyspark.sql import functions as F

    assert batch.closes is not None and batch.upserts is not None
    closes = batch.closes.select(
        *[F.col(quoted(k)).alias(key_name(batch, i)) for i, k in enumerate(batch.key_cols)],
        *[F.col(quoted(c)) for c in END_COLS],
        F.lit("C").alias(own(batch, "op")),
    )
    versions = batch.upserts.select(*[F.col(quoted(n)) for n in batch.schema.names], F.lit("I").alias(own(batch, "op")))
    return closes.unionByName(versions, allowMissingColumns=True)


def whole_table(current: DataFrame, batch: Batch) -> DataFrame:
    """The table's rows after the batch, from its current rows (columns the batch adds as NULLs),
    for a writer that replaces the whole table in one commit: the current rows without the
    batch's keys and its new rows; in history mode, every version with the touched keys' current
    ones closed, and the new versions. A batch that updates or deletes at least a quarter of the
    table's rows (one pass) is written so: a MERGE would join and mark every file first
    (bench/NOTES.md, 2026-12-05)."""
    from pyspark.sql import functions as F

    from pgrecv.spark.sparkops import spark_schema

    names, keys = batch.schema.names, batch.key_cols
    have = set(current.columns)
    types = {f.name: f.dataType for f in spark_schema(batch.schema)}
    current = current.select(*[F.col(quoted(n)) if n in have else F.lit(None).cast(types[n]).alias(n) for n in names])
    if batch.history:
        assert batch.closes is not None
        return close_versions(current, batch.closes, keys, batch.null_safe, names).unionByName(new_rows(batch))
    if batch.final is not None:
        touched = batch.final.select(*[F.col("_k")[k].alias(key_name(batch, i)) for i, k in enumerate(keys)])
    else:
        assert batch.keys is not None
        touched = batch.keys.select(*[F.col(quoted(k)).alias(key_name(batch, i)) for i, k in enumerate(keys)])
    kept = current.alias("t").join(touched.alias("s"), matches(batch), "left_anti")
    return kept.unionByName(new_rows(batch))
