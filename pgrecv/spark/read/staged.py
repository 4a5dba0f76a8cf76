"""The staged read: every line of every file a row with the envelope fields, the row images
``new``/``old`` kept as their raw JSON text (Spark's file reader keeps the exact bytes; its SQL
JSON functions would turn ``3.14159265358979323846264`` into a double), LSNs as 64-bit integers,
and the line's place in the input: ``_rank`` (the file's index in replay order), ``_blk`` (the
split it was read in) and ``_mid`` (its order within the split). Ordered by those three, rows are
in file order, which the positional rules (streamed chunks) need. Parsed once into a staged
Parquet copy that every later pass reads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pgrecv.errors import InputError
from pgrecv.lsn import lsn_str
from pgrecv.spark.files import file_url, find_line, input_urls, line_of_text, literal_read, local_path, spelling
from pgrecv.spark.read.envelope import ENVELOPE, LSN_FIELDS, LSN_PATTERN, json_read, lsn_expr, named_last
from pgrecv.spark.replay.committed import CHANGE_OPS, KNOWN_OPS, ROW_OPS
from pgrecv.spark.stores import SourceFile, TargetPath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class Records:
    """The records of one run and the few facts the driver needs about them."""

    frame: DataFrame  # the DataFrame (over the staged copy: every table's replay reads it)
    files: list[SourceFile]


def read_records(
    spark: SparkSession,
    files: list[SourceFile],
    carried: list[SourceFile],
    stage: TargetPath | None = None,
    links: Path | None = None,
) -> Records:
    """Carried-over prepared transactions first (negative ranks), then the input in name order.

    With ``stage``, the parsed records are written there once as Parquet (by Spark tasks, in one
    pass over the input) and the frame reads that copy: every later pass reads only the columns
    it needs, and each line's place in the input (``_blk``, ``_mid``) is fixed once. ``links``:
    a directory for links to files whose names Spark cannot read (the caller removes it)."""
    from pyspark.sql import functions as F

    ordered = [*carried, *files]
    assert ordered, "a run without input reads nothing (run_frames returns first)"
    urls = input_urls(ordered, links)
    df = (
        json_read(spark)
        .schema(ENVELOPE)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt")
        .json(urls)  # file: paths, whatever fs.defaultFS says
        .select(
            "*",
            F.col("_metadata.file_path").alias("_path"),
            F.col("_metadata.file_block_start").alias("_blk"),
            F.monotonically_increasing_id().alias("_mid"),
        )
    )
    # Each file's rank, matched by the path as Spark spells it (Hadoop's URI form: spaces, '%'
    # and '#' percent-encoded, non-ASCII kept), which the JVM computes here for each listed file.
    # A row whose file is not matched keeps a NULL rank, which check_input reports.
    ranks = spark.createDataFrame(
        [(spelling(spark, url), i - len(carried)) for i, url in enumerate(urls)], "_path string, _rank int"
    )
    df = df.join(F.broadcast(ranks), "_path", "left")
    lsns = [lsn_expr(F.col(n)).alias(f"{n}_i") for n in LSN_FIELDS]
    df = df.select("*", *lsns)
    bad_lsn = F.lit(False)
    for name in LSN_FIELDS:
        bad_lsn = bad_lsn | (F.col(name).isNotNull() & F.col(f"{name}_i").isNull())
    df = df.withColumn("_bad_lsn", bad_lsn)
    if stage is not None:
        df.write.mode("error").parquet(file_url(stage))
        df = literal_read(spark).parquet(file_url(stage))
    return Records(df, files)


def check_input(records: Records) -> None:
    """Lines that are not records of this format, malformed LSNs, unknown ops, row changes that
    name no table, and changes of a plain transaction outside it (after its ``commit``, before
    another ``begin``): the input is corrupt (exit 9), and nothing is applied."""
    from pyspark.sql import functions as F

    df = records.frame
    op = F.col("op")
    unnamed = (op.isin(*ROW_OPS) & (F.col("schema").isNull() | F.col("table").isNull())) | (
        (op == "truncate") & F.col("tables").isNull()
    )
    bad = df.where(
        F.col("_rank").isNull()
        | F.col("_corrupt").isNotNull()
        | op.isNull()
        | (F.col("v") != 1)
        | F.col("v").isNull()
        | F.col("_bad_lsn")
        | ~op.isin(*KNOWN_OPS)
        | unnamed
    )
    first = bad.orderBy("_rank", "_blk", "_mid").limit(1).collect()
    if not first:
        _beyond_names(df)
        _outside_transaction(df)
        return
    r = first[0]
    if r["_rank"] is None:
        raise InputError(f"{local_path(r['_path'])}: Spark read a file that was not listed: report this as a bug")
    if r["_corrupt"] is not None:
        where = line_of_text(r["_path"], r["_corrupt"])
        raise InputError(f"{where}: not a valid JSON record: the file is corrupt or truncated")
    if r["op"] is None:
        where = find_line(r["_path"], {"v": r["v"]})
        raise InputError(f"{where}: record lacks the field 'op': the file is corrupt")
    if r["v"] != 1:
        where = find_line(r["_path"], {"op": r["op"], "v": r["v"]})
        raise InputError(f"{where}: unsupported format version v={r['v']!r}: this pgrecv reads v=1")
    for name in LSN_FIELDS:
        value = r[name]
        if value is not None and not re.fullmatch(LSN_PATTERN, value):
            where = find_line(r["_path"], {name: value})
            raise InputError(f"{where}: invalid LSN {value!r} in {name}: the file is corrupt")
    where = find_line(r["_path"], {"op": r["op"], "lsn": r["lsn"], "commit_lsn": r["commit_lsn"]})
    if r["op"] not in KNOWN_OPS:
        raise InputError(f"{where}: unknown op {r['op']!r}: the file is corrupt")
    what = "its tables" if r["op"] == "truncate" else "its schema or table"
    raise InputError(f"{where}: {r['op']} without {what}: the file is corrupt")


def _beyond_names(df: DataFrame) -> None:
    """A commit record past the last commit LSN its file's name claims (:func:`named_last`): one
    small aggregate, a row per file."""
    from pyspark.sql import functions as F

    last = df.where(F.col("op") == "commit").groupBy("_path").agg(F.max("commit_lsn_i").alias("c"))
    for r in last.collect():
        claimed = named_last(r["_path"])
        if claimed is not None and r["c"] is not None and r["c"] > claimed:
            where = find_line(r["_path"], {"op": "commit", "commit_lsn": lsn_str(r["c"])})
            raise InputError(
                f"{where}: commit LSN {lsn_str(r['c'])} is past the last one the file's name claims "
                f"({lsn_str(claimed)}): the file is corrupt (a forged or misplaced transaction would hold "
                "back every later change of its tables)"
            )


def _outside_transaction(df: DataFrame) -> None:
    """A change of a plain transaction (with its commit LSN) must not come after its transaction's
    commit (with no begin since), nor inside another transaction's begin … commit: it would
    otherwise be applied with it. (A change before any begin or commit of its file, or after
    another transaction's commit, may belong to a transaction begun in an earlier file; that is
    not judged.) A window over each file's transaction lines in order."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    op = F.col("op")
    plain = op.isin(*CHANGE_OPS) & F.col("commit_lsn_i").isNotNull() & F.col("gid").isNull()
    lines = df.where(op.isin("begin", "commit") | plain)
    w = Window.partitionBy("_path").orderBy("_blk", "_mid").rowsBetween(Window.unboundedPreceding, -1)
    # a begin without its commit LSN (test_decoding's, when the slot's output gives none): not judged
    # a commit: -3 - its commit LSN (a change after a commit of another transaction, with no begin
    # between, may be of a transaction begun in an earlier file: not judged)
    unknown = F.lit(-2).cast("bigint")
    closed = F.lit(-3).cast("bigint") - F.col("commit_lsn_i")
    mark = F.when(op == "begin", F.coalesce(F.col("commit_lsn_i"), unknown)).when(op == "commit", closed)
    out = (
        lines.withColumn("_open", F.last(mark, ignorenulls=True).over(w))
        .where(
            plain
            & (
                ((F.col("_open") >= 0) & (F.col("_open") != F.col("commit_lsn_i")))
                | (F.col("_open") == F.lit(-3) - F.col("commit_lsn_i"))
            )
        )
        .select("op", "_path", "lsn", "commit_lsn", "_open", "_rank", "_blk", "_mid")
        .orderBy("_rank", "_blk", "_mid")
        .limit(1)
        .collect()
    )
    if out:
        r = out[0]
        where = find_line(r["_path"], {"op": r["op"], "lsn": r["lsn"], "commit_lsn": r["commit_lsn"]})
        state = "after its transaction's commit" if r["_open"] < 0 else "inside another transaction"
        raise InputError(f"{where}: {r['op']} of commit LSN {r['commit_lsn']} {state}: the file is corrupt")
