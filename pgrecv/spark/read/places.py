"""A line's place in the input as one long, for the structural passes' aggregates.

A place orders lines as the input does: by file (its rank in the run's list), then by the start
of the Spark split that read it, then by its number in that split's partition (the low 33 bits
of ``monotonically_increasing_id``; a partition reads its splits in order). A struct of those
would do as well, but a struct in an aggregate's buffer makes Spark plan a sort aggregate, which
sorts every line: as one long the aggregate stays a hash aggregate (bench/NOTES.md: 1.1 s more
per 3M lines with structs). The bits, high to low: the rank, the split's start without its low
``shift`` bits (Spark splits files at multiples of at least ``min(maxPartitionBytes,
openCostInBytes)``, so the dropped bits are zeros), the line's number.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from pgrecv.spark.sparkops import byte_conf
from pgrecv.spark.stores import SourceFile

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

LINE_BITS = 33
LINE_MASK = (1 << LINE_BITS) - 1
SPLIT_BITS = 30  # what a long has left above the line's number (its sign bit kept clear)


def split_shift(spark: SparkSession) -> int | None:
    """The low bits of a split's start that are always zero (None: the confs are not sizes)."""
    sizes = [byte_conf(spark, f"spark.sql.files.{k}") for k in ("maxPartitionBytes", "openCostInBytes")]
    if any(s is None or s < 1 for s in sizes):
        return None
    return min(int(s).bit_length() - 1 for s in sizes if s is not None)


def largest(files: list[SourceFile]) -> int:
    size = 0
    for f in files:
        with contextlib.suppress(OSError):  # (gone meanwhile: the read says so)
            size = max(size, f.stat().st_size)
    return size


def ranked_bits(spark: SparkSession, files: list[SourceFile]) -> tuple[int, int] | None:
    """(shift, where the rank starts) for places across ``files``; None when the rank and the
    splits of the largest file do not fit (then the caller keeps a struct)."""
    shift = split_shift(spark)
    if shift is None:
        return None
    split_bits = (largest(files) >> shift).bit_length()
    rank_bits = max(len(files) - 1, 0).bit_length()
    return (shift, LINE_BITS + split_bits) if split_bits + rank_bits <= SPLIT_BITS else None


def place(shift: int, rank: Column | None = None, rank_at: int = 0) -> Column:
    """The place of each line of a read with ``_b`` (``_metadata.file_block_start``) and ``_m``
    (``monotonically_increasing_id``); with ``rank``, across files."""
    from pyspark.sql import functions as F

    out = F.shiftleft(F.shiftright(F.col("_b"), shift), LINE_BITS).bitwiseOR(F.col("_m").bitwiseAND(F.lit(LINE_MASK)))
    return out if rank is None else out.bitwiseOR(F.shiftleft(rank.cast("long"), rank_at))
