#!/usr/bin/env python3
"""spark-apply speed: N change events over K keys onto a K-row table, local[2], against a floor.

Floor (same run, same SparkSession), the issue's plain Spark job: Spark reads the same JSONL with an
explicit schema, keeps the last change per key (``max_by`` over the LSNs as 64-bit integers) and
writes the final table once as Parquet. Until 2026-11-26 the floor wrote every event, not the final
table (no grouping: a lower floor); its ratio is printed too, so that figures stay comparable.
Also prints the peak RSS of this (driver Python) process. Each side is measured ``--repeat`` times
(default 2) and the best is kept, spark-apply each time onto a fresh copy of the existing table
(until 2026-12-03 the floor was the best of 2 and spark-apply ran once, its first run of the
replay in that JVM; its rounds are printed). ``--warmup`` rounds of spark-apply (default 1, not
counted) run first, then the formats take turns round by round (until 2026-12-07 the first
format's rounds all came first, and it paid the JVM's warm-up).
With ``--tables N`` the keys are spread over N tables (key k in table ``t{k % N}``), as in a
stream of a whole database; the floor then keeps the last change per (table, key) and writes one
directory per table.
``--format iceberg`` writes Iceberg through Iceberg's Spark runtime (its jars in the session).
With ``--delta-engine spark`` Delta is written by Delta's Spark connector (issue 57), its jars in
the session from the start (the floor runs in that session too).
With ``--source-s3`` the change file is an object on a local S3 server (moto's, the tests' one),
read by both sides through Hadoop's S3A connector (jvm/s3a/jars) and listed by pgrecv through
pyarrow. With ``--target-s3`` (Delta only; implies ``--source-s3``) the tables are on that server too:
each round applies the existing table onto a fresh prefix first, and the floor writes its output there.
Usage: bench/spark_apply.py [--events 1000000] [--keys 200000] [--tables 1] [--format ...] [--delta-engine ...]
[--source-s3] [--target-s3] [--conf K=V ...].
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgrecv.spark.apply import run_apply
from pgrecv.spark.jars import session_conf, spark_jars
from pgrecv.spark.model import ApplyConfig
from pgrecv.spark.sparkops import start_session
from pgrecv.spark.stores import TargetPath

REL = {
    "v": 1,
    "op": "relation",
    "oid": 1,
    "schema": "public",
    "table": "t",
    "replica_identity": "default",
    "columns": [
        {"name": "id", "type": "integer", "type_oid": 23, "typmod": -1, "key": True},
        {"name": "v", "type": "text", "type_oid": 25, "typmod": -1, "key": False},
        {"name": "n", "type": "numeric", "type_oid": 1700, "typmod": (12 << 16) + 2 + 4, "key": False},
    ],
    "key": ["id"],
}


def lsn(x: int) -> str:
    return f"{x >> 32:X}/{x & 0xFFFFFFFF:X}"


def table_names(tables: int) -> list[str]:
    return ["t"] if tables == 1 else [f"t{j}" for j in range(tables)]


def write_input(
    path: Path, events: int, keys: int, tables: int = 1, first_lsn: int = 1 << 32, txn_size: int = 500
) -> int:
    """Writes the change records, ``txn_size`` changes a transaction; returns the position after
    the last transaction (the next input's ``first_lsn``: a later batch must not reuse LSNs that
    the target has applied)."""
    rng = random.Random(1)
    pos = first_lsn
    names = table_names(tables)
    with open(path, "wb") as f:
        for j, name in enumerate(names):
            f.write(orjson.dumps({**REL, "oid": 1 + j, "table": name}) + b"\n")

        def txn(rows: list[dict[str, object]]) -> None:
            nonlocal pos
            pos += 1000
            c = lsn(pos)
            f.write(orjson.dumps({"v": 1, "op": "begin", "xid": 1, "commit_lsn": c, "commit_time": None}) + b"\n")
            for i, r in enumerate(rows):
                # the fields in the order pgrecv writes them (output/format.py, row_record): the
                # envelope, then the images (until 2026-12-05 the envelope came after the images)
                head = {
                    "v": 1,
                    "op": r.pop("op"),
                    "schema": "public",
                    "table": names[int(r.pop("_k")) % len(names)],
                    "xid": 1,
                    "commit_lsn": c,
                    "lsn": lsn(pos - 999 + i),
                    "commit_time": None,
                    "key": ["id"],
                }
                f.write(orjson.dumps({**head, **r}) + b"\n")
            f.write(
                orjson.dumps({"v": 1, "op": "commit", "xid": 1, "commit_lsn": c, "end_lsn": c, "commit_time": None})
                + b"\n"
            )

        batch: list[dict[str, object]] = []
        for i in range(events):
            k = i if i < keys else rng.randrange(keys)
            op = "insert" if i < keys else rng.choice(["update", "update", "update", "delete", "insert"])
            row = {"id": k, "v": f"value {i}", "n": f"{i % 100000}.25"}
            if op == "delete":
                batch.append({"op": "delete", "_k": k, "old": {"id": k}, "old_kind": "key"})
            elif op == "insert":
                batch.append(
                    {
                        "op": "update" if i >= keys else "insert",
                        "_k": k,
                        "new": row,
                        "old": None,
                        "old_kind": None,
                        "unchanged_toast": [],
                    }
                )
            else:
                batch.append(
                    {"op": "update", "_k": k, "new": row, "old": None, "old_kind": None, "unchanged_toast": []}
                )
            if len(batch) == txn_size:
                txn(batch)
                batch = []
        if batch:
            txn(batch)
    return pos + 1000


FLOOR_SCHEMA = "op string, commit_lsn string, lsn string, new struct<id:int, v:string, n:string>, old struct<id:int>"


def lsn_int(c: str) -> Any:
    """An ``X/Y`` LSN column as a 64-bit integer, in Spark."""
    from pyspark.sql import functions as F

    hi = F.conv(F.substring_index(c, "/", 1), 16, 10).cast("bigint")
    return hi * 4294967296 + F.conv(F.substring_index(c, "/", -1), 16, 10).cast("bigint")


def floor_job(spark: Any, source: str, out: str, tables: int = 1) -> None:
    """The issue's plain Spark job: read with a schema, the last change per key by LSN (as 64-bit
    integers), write the final table once (several tables: one directory each)."""
    from pyspark.sql import functions as F

    per_table = tables > 1
    last = (
        spark.read.schema(FLOOR_SCHEMA + (", `table` string" if per_table else ""))
        .json(source)
        .where("op IN ('insert', 'update', 'delete')")
        .groupBy(*(["table"] if per_table else []), F.coalesce("new.id", "old.id").alias("id"))
        .agg(F.max_by(F.struct("op", "new"), F.struct(lsn_int("commit_lsn"), lsn_int("lsn"))).alias("last"))
        .where("last.op <> 'delete'")
    )
    if per_table:
        last.select("table", "last.new.*").write.partitionBy("table").parquet(out)
    else:
        last.select("last.new.*").write.parquet(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--tables", type=int, default=1)
    ap.add_argument(
        "--txn-size", type=int, default=500, help="changes a transaction (1: a transaction per change, as OLTP has it)"
    )
    ap.add_argument("--format", dest="fmts", action="append", choices=["parquet", "delta", "iceberg"])
    ap.add_argument("--repeat", type=int, default=2, help="measure each side this many times, keep the best")
    ap.add_argument(
        "--delta-engine",
        choices=["delta-rs", "spark"],
        default="delta-rs",
        help="Delta's writer (spark: Delta's Spark connector, its jars from jvm/jars, in the floor's session too)",
    )
    ap.add_argument("--source-s3", action="store_true", help="the change file on a local S3 server (moto)")
    ap.add_argument("--target-s3", action="store_true", help="the tables on that server too (Delta only)")
    ap.add_argument(
        "--warmup", type=int, default=1, help="rounds of spark-apply run first and not counted (the JVM's warm-up)"
    )
    ap.add_argument("--conf", action="append", default=[], metavar="K=V", help="a Spark setting of the session")
    args = ap.parse_args()
    fmts = args.fmts or ["parquet", "delta"]
    if args.target_s3:
        args.source_s3 = True
        if fmts != ["delta"]:
            ap.error("--target-s3: --format delta only (spark-apply writes no other format onto S3 yet)")
    conf = {"spark.sql.shuffle.partitions": "2"}
    s3 = None
    if args.source_s3:
        import os

        from pgrecv.spark import stores
        from tests.conftest import start_s3_server

        s3 = start_s3_server()
        os.environ.update(s3.env)
        s3a = spark_jars(Path(__file__).resolve().parents[1] / "jvm" / "s3a" / "jars")
        conf = stores.session_conf({**conf, "spark.jars": s3a})
    if args.delta_engine == "spark" or "iceberg" in fmts:  # (the connectors' jars, in the floor's session too)
        conf = session_conf({**conf, "spark.jars": spark_jars()}, "delta", args.delta_engine)
    conf.update(kv.split("=", 1) for kv in args.conf)
    spark = start_session("local[2]", conf)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        base_in, changes = base / "base.jsonl", base / "changes.jsonl"
        after_base = write_input(base_in, args.keys, args.keys, args.tables)  # the 200k rows
        # after the base's LSNs: every change is new to the target, as for the floor (before
        # 2026-11-30 the changes reused the base's LSNs, and spark-apply skipped their first 200k
        # as applied while the floor replayed all of them)
        write_input(changes, args.events, args.keys, args.tables, first_lsn=after_base, txn_size=args.txn_size)
        source = str(changes)
        if s3 is not None:
            bucket = s3.bucket()
            t0 = time.monotonic()
            s3.client().upload_file(str(changes), bucket, f"cdc/{changes.name}")
            print(f"uploaded {changes.stat().st_size >> 20} MB to the S3 server in {time.monotonic() - t0:.2f} s")
            source = f"s3://{bucket}/cdc/{changes.name}"

        def place(name: str) -> TargetPath:
            """A target (or the floor's output) by name: local, or on the S3 server (--target-s3)."""
            if not args.target_s3:
                return base / name
            from pgrecv.spark import stores

            return stores.StorePath.of(f"s3://{bucket}/lake/{name}", stores.filesystem({}))

        def config(sources: tuple[str, ...], fmt: str, target: TargetPath | None = None) -> ApplyConfig:
            return ApplyConfig(sources, target or place(fmt), fmt=fmt, engine=args.delta_engine)

        for fmt in fmts:  # the existing table (also warms the JVM up)
            run_apply(config((str(base_in),), fmt), spark=spark)

        def floor_run(n: int, grouped: bool = True) -> float:
            t0 = time.monotonic()
            if grouped:
                out = place(f"floor{n}")
                floor_job(spark, source.replace("s3://", "s3a://"), getattr(out, "spark_url", str(out)), args.tables)
            else:  # the floor of earlier figures: every event written, no grouping
                read = source.replace("s3://", "s3a://")
                spark.read.schema(FLOOR_SCHEMA).json(read).write.parquet(str(base / f"events{n}"))
            return time.monotonic() - t0

        repeat = max(1, args.repeat)
        floor = min(floor_run(1 + i) for i in range(repeat))
        old_floor = min(floor_run(100 + i, grouped=False) for i in range(repeat))
        results: dict[str, list[float]] = {}
        reads: dict[str, set[str]] = {}  # how each round read its input (lean, direct, staged)

        def round_of(fmt: str, name: str) -> float:
            target = place(name)
            if fmt == "iceberg" or args.target_s3:  # (Iceberg's metadata names its files by absolute paths)
                run_apply(config((str(base_in),), fmt, target), spark=spark)
            else:
                shutil.copytree(base / fmt, target, symlinks=True)  # type: ignore[arg-type]  # the existing table
            t0 = time.monotonic()
            summary = run_apply(config((source,), fmt, target), spark=spark)
            reads.setdefault(fmt, set()).add(summary.input_read)
            return time.monotonic() - t0

        # Until 2026-12-07 the first format's rounds came first in a JVM that had not yet run the
        # changes' path: the format measured first paid its warm-up (1M events: Parquet 2.37x
        # first, 1.82x after Delta's rounds). Now warm-up rounds, not counted, then the formats
        # take turns round by round.
        warm = [round_of(fmts[0], f"warm-{i}") for i in range(args.warmup)]
        for i in range(repeat):
            for fmt in fmts:
                results.setdefault(fmt, []).append(round_of(fmt, f"{fmt}-{i}"))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"events {args.events}, keys {args.keys}, tables {args.tables}, {args.txn_size} a transaction, local[2], "
        f"Delta written by {args.delta_engine}"
        + (", input on the local S3 server" if s3 is not None else "")
        + (", tables and the floor's output on it too" if args.target_s3 else "")
    )
    n = max(1, args.repeat)
    if warm:
        print(f"warm-up rounds of spark-apply {fmts[0]}, not counted: {', '.join(f'{w:.2f}' for w in warm)} s")
    print(f"floor (Spark: read JSONL with schema, max_by per key, write the final table; best of {n}): {floor:.2f} s")
    print(f"old floor (read with schema, write every event; best of {n}): {old_floor:.2f} s")
    for fmt, rounds in results.items():
        secs = min(rounds)
        print(
            f"spark-apply {fmt}: {secs:.2f} s (best of {n}; rounds {', '.join(f'{r:.2f}' for r in rounds)})  "
            f"ratio {secs / floor:.2f}  (to the old floor: {secs / old_floor:.2f}); read {'/'.join(sorted(reads[fmt]))}"
        )
    print(f"peak RSS of the driver's Python process: {rss:.0f} MB")
    spark.stop()
    if s3 is not None:
        from tests.conftest import _stop_group

        _stop_group(s3.proc)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
