"""The two sides of a table for :func:`pgrecv.verify.compare.compare`: PostgreSQL, summed in SQL
on the exported snapshot, and the lake, summed by Spark tasks. Both build the same key and row
texts from :mod:`pgrecv.verify.canon`, so only bucket sums and the rows of differing buckets
reach the driver."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from pgrecv.spark.schema import quoted
from pgrecv.verify.canon import Canon, hash_pg, hash_spark, row_text_pg, row_text_spark
from pgrecv.verify.compare import BITS, Leaf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Plan:
    """What is compared of a table: its columns' canonical forms, and which of them are its key."""

    names: tuple[str, ...]
    canons: tuple[Canon, ...]
    key: tuple[int, ...]  # indexes into names
    types: tuple[str, ...] = ()  # the columns' PostgreSQL types


def _single_int_key(plan: Plan) -> int | None:
    """The index of the key's one column when it is an integer (not xid8, which exceeds bigint):
    its value is the key's hash, as good for buckets as an MD5 of it and much cheaper."""
    if len(plan.key) == 1 and plan.canons[plan.key[0]].kind == "integer":
        i = plan.key[0]
        return i if plan.types[i] != "xid8" else None
    return None


def _int_key_pg(plan: Plan) -> sql.Composable | None:
    i = _single_int_key(plan)
    return None if i is None else sql.SQL("{}::bigint").format(sql.Identifier(plan.names[i]))


def _mask(depth: int) -> int:
    return (1 << (BITS * depth)) - 1


class PgSide:
    """A table as the snapshot sees it (``conn`` holds the imported snapshot's transaction)."""

    def __init__(
        self, conn: psycopg.Connection[Any], table: sql.Composable, where: sql.Composable | None, plan: Plan
    ) -> None:
        self.conn = conn
        key = row_text_pg([plan.canons[i] for i in plan.key])
        row = row_text_pg(list(plan.canons))
        cols = sql.SQL(", ").join(sql.SQL("substr(md5(coalesce({v}, '-')), 1, 8)").format(v=c.pg) for c in plan.canons)
        keys = sql.SQL(", ").join(c.pg for c in (plan.canons[i] for i in plan.key))
        source = sql.SQL("FROM {t} WHERE {w}").format(t=table, w=where if where is not None else sql.SQL("true"))
        self.source = source
        self.h, self.r = (_int_key_pg(plan) or hash_pg(key)), hash_pg(row)
        # OFFSET 0: computed once per row, not again for each use of h
        self.sums = sql.SQL("SELECT {h} AS h, {r} AS r {s} OFFSET 0").format(h=self.h, r=self.r, s=source)
        self.rows = sql.SQL(
            "SELECT {h} AS h, {r} AS r, ARRAY[{keys}]::text[] AS k, ARRAY[{cols}]::text[] AS c {s} OFFSET 0"
        ).format(h=self.h, r=self.r, keys=keys, cols=cols, s=source)

    def buckets(self, depth: int, within: Sequence[int] | None) -> dict[int, tuple[int, int]]:
        if within is None:  # the first level, every row: a plain aggregate, which PostgreSQL may run in parallel
            # (sum of bigint: PostgreSQL adds in 128 bits, no numeric per row)
            first = sql.SQL("SELECT {h} & {m} AS b, count(*), sum({r}) {s} GROUP BY 1").format(
                h=self.h, m=sql.Literal(_mask(depth)), r=self.r, s=self.source
            )
            return {int(b): (int(n), int(total)) for b, n, total in self.conn.execute(first, ())}
        query = sql.SQL("SELECT h & {m} AS b, count(*), sum(r) FROM ({i}) t WHERE {w} GROUP BY 1").format(
            m=sql.Literal(_mask(depth)), i=self.sums, w=self._within(depth, within)
        )
        return {int(b): (int(n), int(total)) for b, n, total in self.conn.execute(query, self._args(within))}

    def leaves(self, depth: int, buckets: Sequence[int]) -> list[Leaf]:
        query = sql.SQL("SELECT k, r, c FROM ({i}) t WHERE (h & {m}) = ANY(%s::bigint[])").format(
            i=self.rows, m=sql.Literal(_mask(depth))
        )
        return [Leaf(tuple(k), int(r), tuple(c)) for k, r, c in self.conn.execute(query, (list(buckets),))]

    @staticmethod
    def _within(depth: int, within: Sequence[int] | None) -> sql.Composable:
        if within is None:
            return sql.SQL("true")
        return sql.SQL("(h & {m}) = ANY(%s::bigint[])").format(m=sql.Literal(_mask(depth - 1)))

    @staticmethod
    def _args(within: Sequence[int] | None) -> tuple[list[int], ...]:
        return () if within is None else (list(within),)


class LakeSide:
    """A lake table's current rows (a DataFrame of its columns; a column the lake lacks is NULL)."""

    def __init__(self, frame: DataFrame, plan: Plan) -> None:
        spark_canons = [c.spark for c in plan.canons]
        key = row_text_spark([plan.canons[i] for i in plan.key])
        row = row_text_spark(list(plan.canons))
        single = _single_int_key(plan)
        cols = ", ".join(f"substr(md5(coalesce({c}, '-')), 1, 8)" for c in spark_canons)
        keys = ", ".join(spark_canons[i] for i in plan.key)
        h = hash_spark(key) if single is None else f"CAST({quoted(plan.names[single])} AS BIGINT)"
        self.rows = frame.selectExpr(
            f"{h} AS h", f"{hash_spark(row)} AS r", f"array({keys}) AS k", f"array({cols}) AS c"
        )

    def buckets(self, depth: int, within: Sequence[int] | None) -> dict[int, tuple[int, int]]:
        from pyspark.sql import functions as F

        rows = self._within(self.rows, depth - 1, within)
        # two sums of bigints (30 high bits, 30 low): a sum of decimal(38,0) costs Spark 60% more
        sums = rows.groupBy((F.col("h").bitwiseAND(F.lit(_mask(depth)))).alias("b")).agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.shiftright(F.col("r"), 30)).alias("hi"),
            F.sum(F.col("r").bitwiseAND(F.lit((1 << 30) - 1))).alias("lo"),
        )
        return {int(r["b"]): (int(r["n"]), (int(r["hi"]) << 30) + int(r["lo"])) for r in sums.collect()}

    def leaves(self, depth: int, buckets: Sequence[int]) -> list[Leaf]:
        rows = self._within(self.rows, depth, buckets).select("k", "r", "c")
        return [Leaf(tuple(r["k"]), int(r["r"]), tuple(r["c"])) for r in rows.toLocalIterator()]

    @staticmethod
    def _within(rows: DataFrame, depth: int, within: Sequence[int] | None) -> DataFrame:
        from pyspark.sql import functions as F

        if within is None:
            return rows
        return rows.where(F.col("h").bitwiseAND(F.lit(_mask(depth))).isin(list(within)))
