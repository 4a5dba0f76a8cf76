"""Prepared transactions whose outcome is not in the input: kept under ``TARGET/_pgrecv/prepared``
for the next run, which reads them before its input."""

from __future__ import annotations

import os
import shutil
import uuid
from typing import TYPE_CHECKING

from pgrecv.output.format import FORMAT_VERSION, REPLAY_FIELDS, FieldKind, record_pieces
from pgrecv.spark.files import file_url
from pgrecv.spark.replay import committed as rp
from pgrecv.spark.stores import StorePath, TargetPath

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


def carry_pending(
    pending: DataFrame | None, st: rp.Structure, state: TargetPath, spark: SparkSession
) -> tuple[int, TargetPath | None]:
    """Prepared transactions whose outcome is not in the input: their records (and their tables'
    relation records) are written, by Spark, to one 0600 file under ``state`` for the next run.
    Returns (how many, the file)."""
    import orjson
    from pyspark.sql import functions as F

    from pgrecv.output.files import fsync_dir

    if pending is None:
        return 0, None

    # one job for both (each action plans and runs the input's whole plan again, about a second
    # on a small run): the transactions (a struct counts a NULL xid, as a distinct row does),
    # and the tables of their row changes and of their TRUNCATEs (whose records name no table)
    def pair(schema: Column, table: Column) -> Column:
        return F.struct(schema.alias("schema"), table.alias("table"))

    own = F.when(F.col("table").isNotNull(), F.array(pair(F.col("schema"), F.col("table"))))
    listed = F.transform(F.col("tables"), lambda t: pair(t["schema"], t["table"]))
    got = pending.agg(
        F.count_distinct(F.struct("gid", "xid")).alias("n"),
        F.flatten(F.collect_set(F.coalesce(own, listed))).alias("t"),
    ).first()
    assert got is not None  # (an aggregate without groups has one row)
    count = int(got["n"])
    if not count:
        return 0, None
    tables = {(r["schema"], r["table"]) for r in got["t"]}
    rel_lines = [
        orjson.dumps({"v": FORMAT_VERSION, "op": "relation", **rel}).decode()
        for k in sorted(tables)
        for rel in st.relations.get(k, [])[-1:]
    ]

    # the record's text comes from the format module, its values from the rows (the row images
    # as their exact raw JSON text); commit_lsn is null inside a prepared transaction
    fields = [(n, k) for n, k in REPLAY_FIELDS if n != "v" and (n in pending.columns or n == "commit_lsn")]
    pieces = record_pieces([n for n, _ in fields])
    parts = [F.lit(pieces[0])]
    for (name, kind), after in zip(fields, pieces[1:], strict=True):
        value = F.lit(None) if name == "commit_lsn" else _json_text(F.col(name), kind)
        parts += [F.coalesce(value, F.lit("null")), F.lit(after)]
    lines = pending.select(F.concat(*parts).alias("value"), F.lit(1).alias("_first"), *rp.POS)
    if rel_lines:  # the relation records first, then the rows in input order
        rels = spark.createDataFrame([(x,) for x in rel_lines], "value string")
        lines = rels.select(
            "value",
            F.lit(0).alias("_first"),
            *[F.lit(0).cast(t).alias(c) for c, t in zip(rp.POS, ("int", "bigint", "bigint"), strict=True)],
        ).unionByName(lines)
    lines = lines.repartition(1).sortWithinPartitions("_first", *rp.POS).select("value")
    if isinstance(state, StorePath):  # (objects: the bucket's access rules are the store's)
        spark_out = state / f".tmp-{uuid.uuid4().hex}"
        lines.write.text(file_url(spark_out))
        written = next(p for p in spark_out.iterdir() if p.name.startswith("part-"))
        carried = state / f"{uuid.uuid4().hex}.jsonl"
        written.copy_to(carried)  # a new object appears whole
        spark_out.remove_tree()
        return count, carried
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state, 0o700)  # raw change data: this user only (also for a directory an older run made)
    tmp = state / f".tmp-{uuid.uuid4().hex}"
    final = state / f"{uuid.uuid4().hex}.jsonl"
    lines.write.text(file_url(tmp))
    part = next(p for p in tmp.iterdir() if p.name.startswith("part-"))
    os.chmod(part, 0o600)
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(part, final)
    shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(state)
    return count, final


def _json_text(col: Column, kind: FieldKind) -> Column:
    """A column's value as the JSON text of a field of ``kind`` (NULL stays NULL)."""
    from pyspark.sql import functions as F

    if kind is FieldKind.IMAGE:  # read as its raw JSON text
        return col
    if kind is FieldKind.INT:
        return col.cast("string")
    if kind in (FieldKind.TEXT, FieldKind.LSN):
        return F.when(col.isNotNull(), F.regexp_extract(F.to_json(F.struct(col.alias("x"))), r'^\{"x":(.*)\}$', 1))
    return F.to_json(col)


def finish_carried(carried: list[TargetPath], written: TargetPath | None) -> None:
    """Files carried by earlier runs, once every table is applied: what is still pending is in
    this run's new file."""
    for p in carried:
        if p != written:
            p.unlink(missing_ok=True)
