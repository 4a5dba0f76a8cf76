#!/usr/bin/env python3
"""A prototype, not pgrecv's code path: how fast could spark-apply be on the common case in one
JSON read? Measures the design bench/NOTES.md proposes for issue 10 against the floor of
bench/spark_apply.py, in the same session.

The common case: plain transactions, no TRUNCATE, no unchanged TOAST value, every value fits its
type. The prototype does, for bench/spark_apply.py's input (one table ``id int, v text, n
numeric(12,2)``) onto a 200k-row Parquet table:
1. a structural pass: the JSON read with a four-field schema, the relation and commit records
   kept (cached: the commit LSNs stay in Spark, the relations are collected);
2. one main pass: the JSON read with the row images typed by the relation, the changes joined to
   their commits, a key change split into a delete and an upsert, the last event per key (a
   window over the LSNs as 64-bit integers), merged with the target (full outer join on the key)
   and written once. What the common case excludes (an unchanged TOAST value, a value its type
   cannot hold) fails the task (``raise_error``): the real engine would then take its general path.

It leaves out what the engine also does: summary counts, incomplete and rolled-back transactions,
the input positions for error messages, reusing untouched files, fsync and the atomic switch.
Usage: bench/spark_apply_onepass.py [--events 1000000] [--keys 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_apply import floor_job, lsn_int, write_input  # the same input and floor

from pgrecv.spark.sparkops import start_session


def main() -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    spark = start_session("local[2]", {"spark.sql.shuffle.partitions": "2"})

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        changes = base / "changes.jsonl"
        write_input(changes, args.events, args.keys)
        url = "file://" + str(changes)
        target = "file://" + str(base / "target")
        spark.range(args.keys).select(
            F.col("id").cast("int").alias("id"),
            F.concat(F.lit("value "), F.col("id")).alias("v"),
            (F.col("id") % 100000 + 0.25).cast("decimal(12,2)").alias("n"),
        ).write.parquet(target)

        def floor(n: int) -> float:
            t0 = time.monotonic()
            floor_job(spark, url, "file://" + str(base / f"floor{n}"))
            return time.monotonic() - t0

        def onepass(n: int) -> tuple[float, float]:
            t0 = time.monotonic()
            st = (
                spark.read.schema("op string, commit_lsn string, schema string, `table` string")
                .json(url)
                .where("op IN ('relation', 'commit')")
                .cache()
            )
            relations = st.where("op = 'relation'").collect()
            assert relations, "the input has no relation record"
            commits = st.where("op = 'commit'").select(lsn_int("commit_lsn").alias("c")).distinct()
            t1 = time.monotonic()
            image = "struct<id:string, v:string, n:string>"
            read = spark.read.schema(
                f"op string, commit_lsn string, lsn string, new {image}, old struct<id:string>, "
                "unchanged_toast array<string>"
            ).json(url)
            ch = read.where("op IN ('insert', 'update', 'delete')").select(
                "*", lsn_int("commit_lsn").alias("c"), lsn_int("lsn").alias("l")
            )
            ch = ch.join(F.broadcast(commits), "c", "left_semi")
            new_key, old_key = F.col("new.id").cast("int"), F.col("old.id").cast("int")
            moved = (F.col("op") == "update") & F.col("old").isNotNull() & ~old_key.eqNullSafe(new_key)
            upsert = F.struct(F.lit("U").alias("kind"), new_key.alias("k"), F.col("new").alias("img"))
            delete = F.struct(F.lit("D").alias("kind"), old_key.alias("k"), F.lit(None).cast(image).alias("img"))
            events = (
                F.when(F.col("op") == "delete", F.array(delete))
                .when(moved, F.array(delete, upsert))
                .otherwise(F.array(upsert))
            )
            ev = ch.select("c", "l", F.explode(events).alias("e"), F.size("unchanged_toast").alias("_t"))
            w = Window.partitionBy("e.k").orderBy(F.col("c").desc(), F.col("l").desc(), F.col("e.kind").desc())
            last = ev.withColumn("_n", F.row_number().over(w)).where("_n = 1").select("e.*", "_t")
            last = last.select(
                "kind",
                "k",
                F.col("img.id").cast("int").alias("id"),
                F.col("img.v").alias("v"),
                F.col("img.n").cast("decimal(12,2)").alias("n"),
                F.col("img.n").alias("n_text"),
                "_t",
            )
            tgt = spark.read.parquet(target)
            merged = tgt.join(last, tgt["id"] == last["k"], "full_outer")
            outside = (F.col("_t") > 0) | (F.col("n_text").isNotNull() & last["n"].isNull())
            check = F.when(outside, F.raise_error(F.lit("not the common case: take the general path")))
            untouched = F.col("kind").isNull()
            out = merged.select(
                *[F.when(untouched, tgt[c]).otherwise(last[c]).alias(c) for c in ("id", "v", "n")],
                "kind",
                check.alias("_check"),
            ).where(F.col("_check").isNull() & (untouched | (F.col("kind") == "U")))
            out.drop("kind", "_check").write.parquet("file://" + str(base / f"onepass{n}"))
            st.unpersist()
            return t1 - t0, time.monotonic() - t1

        for n in range(args.rounds):
            f = floor(n)
            a, b = onepass(n)
            print(
                f"round {n + 1}: floor {f:.2f} s, one pass {a + b:.2f} s (structure {a:.2f}, main {b:.2f}), "
                f"ratio {(a + b) / f:.2f}",
                flush=True,
            )
        # every target key is in the changes, so both hold the same rows
        fl = spark.read.parquet("file://" + str(base / "floor0")).select("id", "v", F.col("n").cast("decimal(12,2)"))
        op = spark.read.parquet("file://" + str(base / "onepass0"))
        differ = fl.exceptAll(op).count() + op.exceptAll(fl).count()
        print(f"rows: floor {fl.count()}, one pass {op.count()}, rows not in both: {differ}")
    spark.stop()


if __name__ == "__main__":
    main()
