#!/usr/bin/env python3
"""spark-apply's write amplification: a small batch of changes onto a large table, bytes written.

A ``--rows``-row table (default 10M, written by spark-apply from inserts of keys 0..N-1) then two
batches of ``--changes`` changes each (default 10k), applied one after the other:

* ``recent``: what OLTP tables mostly see: 70% inserts of new keys (above the table's), 25%
  updates and 5% deletes of keys among the newest 1% of the table;
* ``uniform``: updates (80%) and deletes (20%) of keys drawn uniformly from the whole table: the
  worst case of any writer that rewrites whole files (copy-on-write), printed for honesty.

For each batch and format: the bytes of the data files the run wrote (from the filesystem: new
files of the Parquet version that are not hard links of kept ones; the Delta commit's ``add``
actions), the table's data bytes before it, and the ratio (the target is ≤ 5% for ``recent``).
With ``--one-pass-first`` a batch that updates every third row comes first: the one-pass write
(docs/spark-apply.md) rewrites the whole table, and the two batches then find its layout.
With ``--delta-engine spark`` Delta is written by Delta's Spark connector (deletion vectors on:
a marked file is not rewritten, its deletion vector is counted).
Usage: bench/spark_apply_bytes.py [--rows 10000000] [--changes 10000] [--format parquet|delta|iceberg]
[--one-pass-first] [--delta-engine delta-rs|spark]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_apply import REL, lsn, write_input  # the same table and record layout

from pgrecv.spark.apply import run_apply
from pgrecv.spark.jars import session_conf, spark_jars
from pgrecv.spark.model import ApplyConfig
from pgrecv.spark.sparkops import start_session


def write_batch(path: Path, rows: int, changes: int, spread: str, first_lsn: int, seed: int) -> None:
    rng = random.Random(seed)
    pos = first_lsn
    next_key = rows + seed * changes  # new keys above every existing one
    with open(path, "wb") as f:
        f.write(orjson.dumps(REL) + b"\n")
        done = 0
        while done < changes:
            pos += 1000
            c = lsn(pos)
            f.write(orjson.dumps({"v": 1, "op": "begin", "xid": 2, "commit_lsn": c, "commit_time": None}) + b"\n")
            for i in range(min(500, changes - done)):
                r = rng.random()
                base = {"v": 1, "schema": "public", "table": "t", "xid": 2, "commit_lsn": c}
                base |= {"lsn": lsn(pos - 999 + i), "commit_time": None, "key": ["id"]}
                if spread == "recent":
                    k = rows - 1 - rng.randrange(max(rows // 100, 1))
                    op = "insert" if r < 0.70 else "update" if r < 0.95 else "delete"
                    if op == "insert":
                        k, next_key = next_key, next_key + 1
                elif spread == "third":  # every third key updated: a batch for the one-pass write
                    k, op = 3 * (done + i), "update"
                else:
                    k = rng.randrange(rows)
                    op = "update" if r < 0.8 else "delete"
                row = {"id": k, "v": f"changed {done + i}", "n": "1.25"}
                if op == "delete":
                    rec = {"op": "delete", "old": {"id": k}, "old_kind": "key"}
                else:
                    rec = {"op": op, "new": row, "old": None, "old_kind": None, "unchanged_toast": []}
                f.write(orjson.dumps(base | rec) + b"\n")
            done += min(500, changes - done)
            f.write(
                orjson.dumps({"v": 1, "op": "commit", "xid": 2, "commit_lsn": c, "end_lsn": c, "commit_time": None})
                + b"\n"
            )


def parquet_bytes(table: Path) -> tuple[int, int]:
    """(data bytes of the current version, bytes of its files that are not links of older ones)."""
    current = (table / "current").resolve()
    files = [p for p in current.iterdir() if p.name.endswith(".parquet") and not p.name.startswith(("_", "."))]
    return sum(p.stat().st_size for p in files), sum(p.stat().st_size for p in files if p.stat().st_nlink == 1)


def delta_bytes(table: Path) -> tuple[int, int]:
    """(data bytes of the table, bytes its last commit wrote: the data files it adds that the
    version before did not hold, and deletion vector files; a file only marked by a deletion
    vector is added again, not written)."""
    from deltalake import DeltaTable

    dt = DeltaTable(str(table))
    total = sum(dt.get_add_actions(flatten=True).column("size_bytes").to_pylist())
    version = dt.version()
    had = set()
    if version > 0:
        paths = DeltaTable(str(table), version=version - 1).get_add_actions(flatten=True).column("path")
        had = {unquote(p) for p in paths.to_pylist()}
    last = table / "_delta_log" / f"{version:020d}.json"
    added = 0
    for action in map(json.loads, last.read_text().splitlines()):
        add = action.get("add")
        if not add:
            continue
        if unquote(add["path"]) not in had:
            added += add["size"]
        dv = add.get("deletionVector") or {}
        if dv.get("storageType") == "u":
            added += int(dv.get("sizeInBytes") or 0)
    return total, added


def iceberg_bytes(table: Path) -> tuple[int, int]:
    """(data bytes of the table's current snapshot, bytes that snapshot added: its data files
    and its delete files, deletion vectors included), from the snapshot's summary."""
    from pgrecv.spark.tables.iceberg import current_snapshot, summary_of

    summary = summary_of(current_snapshot(table))
    return int(summary.get("total-files-size", 0)), int(summary.get("added-files-size", 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--changes", type=int, default=10_000)
    ap.add_argument("--format", dest="fmts", action="append", choices=["parquet", "delta", "iceberg"])
    ap.add_argument(
        "--one-pass-first",
        action="store_true",
        help="before the batches, update every third row (a one-pass write: the files' layout is then its)",
    )
    ap.add_argument("--delta-engine", default="delta-rs", choices=["delta-rs", "spark"])
    args = ap.parse_args()
    fmts = args.fmts or ["parquet", "delta"]
    conf: dict[str, str] = {}
    if args.delta_engine == "spark" or "iceberg" in fmts:
        conf = session_conf({"spark.jars": spark_jars()}, "delta", args.delta_engine)
    spark = start_session("local[2]", conf)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        base_in = base / "base.jsonl"
        write_input(base_in, args.rows, args.rows)
        last = (1 << 32) + 1000 * (args.rows // 500 + 2)
        batches = {}
        for n, spread in enumerate(("recent", "uniform"), start=1):
            batches[spread] = base / f"{spread}.jsonl"
            write_batch(batches[spread], args.rows, args.changes, spread, last + n * (1 << 30), n)
        third = base / "third.jsonl"
        if args.one_pass_first:
            write_batch(third, args.rows, args.rows // 3, "third", last, 0)
        print(f"table of {args.rows:,} rows, batches of {args.changes:,} changes, local[2]", flush=True)
        for fmt in fmts:
            target = base / fmt
            t0 = time.monotonic()
            run_apply(ApplyConfig((str(base_in),), target, fmt=fmt, engine=args.delta_engine), spark=spark)
            measure = {"parquet": parquet_bytes, "delta": delta_bytes, "iceberg": iceberg_bytes}[fmt]
            table = target / "public.t"
            size, _ = measure(table)
            print(f"{fmt}: table written in {time.monotonic() - t0:.1f} s, {size / 1e6:.1f} MB of data", flush=True)
            if args.one_pass_first:
                t0 = time.monotonic()
                run_apply(ApplyConfig((str(third),), target, fmt=fmt, engine=args.delta_engine), spark=spark)
                size, _ = measure(table)
                print(
                    f"{fmt}: a third of the rows updated (one pass) in {time.monotonic() - t0:.1f} s, "
                    f"{size / 1e6:.1f} MB of data",
                    flush=True,
                )
            for spread, path in batches.items():
                before, _ = measure(table)
                t0 = time.monotonic()
                summary = run_apply(ApplyConfig((str(path),), target, fmt=fmt, engine=args.delta_engine), spark=spark)
                secs = time.monotonic() - t0
                _, written = measure(table)
                reported = sum(t.bytes_written or 0 for t in summary.tables)
                print(
                    f"{fmt} {spread}: {secs:.1f} s, wrote {written / 1e6:.2f} MB "
                    f"(pgrecv reports {reported / 1e6:.2f} MB) of a {before / 1e6:.1f} MB table: "
                    f"{100 * written / before:.1f}%",
                    flush=True,
                )
    spark.stop()


if __name__ == "__main__":
    main()
