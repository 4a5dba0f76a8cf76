"""Prepared transactions whose outcome is not in the input: kept under ``TARGET/_pgrecv/prepared``
for the next run, which reads them before its input."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from pgrecv.output.format import FORMAT_VERSION
from pgrecv.spark.files import file_url
from pgrecv.spark.replay import committed as rp


def carry_pending(pending: Any, st: rp.Structure, state: Path, spark: Any) -> tuple[int, Path | None]:
    """Prepared transactions whose outcome is not in the input: their records (and their tables'
    relation records) are written, by Spark, to one 0600 file under ``state`` for the next run.
    Returns (how many, the file)."""
    import orjson
    from pyspark.sql import functions as F

    from pgrecv.output.files import fsync_dir

    if pending is None:
        return 0, None
    count = pending.select("gid", "xid").distinct().count()
    if not count:
        return 0, None
    # the tables of its row changes, and those its TRUNCATEs list (their records name no table)
    named = pending.where(F.col("table").isNotNull()).select("schema", "table")
    truncated = pending.where(F.col("tables").isNotNull()).select(F.inline("tables"))
    tables = {(r["schema"], r["table"]) for r in named.unionByName(truncated).distinct().collect()}
    rel_lines = [
        orjson.dumps({"v": FORMAT_VERSION, "op": "relation", **rel}).decode()
        for k in sorted(tables)
        for rel in st.relations.get(k, [])[-1:]
    ]

    def field(name: str, expr: Any) -> Any:
        return F.concat(F.lit(f',"{name}":'), F.coalesce(expr, F.lit("null")))

    # built field by field: the row images stay their exact raw JSON text
    parts = [F.lit('{"v":1')]
    parts += [field(c, _json_string(F.col(c))) for c in ("op", "schema", "table", "gid", "lsn", "commit_time")]
    parts += [field("xid", F.col("xid").cast("string")), field("commit_lsn", F.lit(None)), field("new", F.col("new"))]
    parts += [field("old", F.col("old")), field("tables", F.to_json(F.col("tables")))]
    parts += [
        field(c, F.to_json(F.col(c)))
        for c in ("unchanged_toast", "old_unchanged_toast", "json_nulls", "old_json_nulls")
    ]
    parts.append(F.lit("}"))
    lines = pending.select(F.concat(*parts).alias("value"), F.lit(1).alias("_first"), *rp.POS)
    if rel_lines:  # the relation records first, then the rows in input order
        rels = spark.createDataFrame([(x,) for x in rel_lines], "value string")
        lines = rels.select(
            "value",
            F.lit(0).alias("_first"),
            *[F.lit(0).cast(t).alias(c) for c, t in zip(rp.POS, ("int", "bigint", "bigint"), strict=True)],
        ).unionByName(lines)
    lines = lines.repartition(1).sortWithinPartitions("_first", *rp.POS).select("value")
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state, 0o700)  # raw change data: this user only (also for a directory an older run made)
    tmp = state / f".tmp-{uuid.uuid4().hex}"
    lines.write.text(file_url(tmp))
    part = next(p for p in tmp.iterdir() if p.name.startswith("part-"))
    os.chmod(part, 0o600)
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    final = state / f"{uuid.uuid4().hex}.jsonl"
    os.replace(part, final)
    shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(state)
    return count, final


def _json_string(col: Any) -> Any:
    """A string column as JSON text (NULL stays NULL)."""
    from pyspark.sql import functions as F

    return F.when(col.isNotNull(), F.regexp_extract(F.to_json(F.struct(col.alias("x"))), r'^\{"x":(.*)\}$', 1))


def finish_carried(carried: list[Path], written: Path | None) -> None:
    """Files carried by earlier runs, once every table is applied: what is still pending is in
    this run's new file."""
    for p in carried:
        if p != written:
            p.unlink(missing_ok=True)
