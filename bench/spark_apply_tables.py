#!/usr/bin/env python3
"""spark-apply over many tables against the same changes in one table (issue 56), local[2].

A whole database's stream: ``--tables`` tables of ``--rows`` rows each, then ``--changes``
changes spread over them (key k in table ``t{k % N}``, 500 a transaction), applied onto the
existing tables. The reference, measured in the same session: the same changes and rows in ONE
table. Prints each side's best of ``--repeat`` (each onto a fresh copy of its existing tables),
the ratio, the tables applied in groups (``Summary.tables_grouped``) and the driver's peak RSS;
``--no-together`` turns the grouped apply off, for the figures before it.
``--changed K``: only the first K tables change (the issue's "1,000 tables of which 10 changed");
the reference is then the same changes onto a target of those K tables alone.
Usage: bench/spark_apply_tables.py [--tables 200] [--rows 1000] [--changes 20000] [--format ...].
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from spark_apply import REL, write_input  # bench/spark_apply.py: the same change records

from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, Tuning
from pgrecv.spark.sparkops import start_session


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--rows", type=int, default=1000, help="rows of each table before the changes")
    ap.add_argument("--changes", type=int, default=20_000)
    ap.add_argument("--format", dest="fmts", action="append", choices=["parquet", "delta"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-together", action="store_true", help="apply table by table (the figures before it)")
    ap.add_argument("--changed", type=int, default=0, help="only the first K tables change (0: all)")
    args = ap.parse_args()
    fmts = args.fmts or ["parquet", "delta"]
    tuning = Tuning(together=not args.no_together)
    spark = start_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    keys = args.tables * args.rows
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        best: dict[tuple[str, int], float] = {}
        grouped: dict[tuple[str, int], int] = {}
        k = args.changed
        sides = (args.tables, k if k else 1)
        for n in sides:
            rows_in, changes = base / f"rows{n}.jsonl", base / f"changes{n}.jsonl"
            after = write_input(rows_in, n * args.rows if k else keys, n * args.rows if k else keys, n)
            if not k:  # the same changes, in n tables
                write_input(changes, args.changes, keys, n, first_lsn=after)
            else:  # changes in the first k tables; the relation records of all n (a session's first file)
                write_input(changes, args.changes, k * args.rows, k, first_lsn=after)
                others = b"".join(orjson.dumps({**REL, "oid": 1 + j, "table": f"t{j}"}) + b"\n" for j in range(k, n))
                changes.write_bytes(others + changes.read_bytes())
            for fmt in fmts:
                made = base / f"{fmt}-{n}"
                run_apply(ApplyConfig((str(rows_in),), made, fmt=fmt), spark=spark)
                for i in range(max(1, args.repeat)):
                    target = base / f"{fmt}-{n}-{i}"
                    shutil.copytree(made, target, symlinks=True)
                    t0 = time.monotonic()
                    s = run_apply(ApplyConfig((str(changes),), target, fmt=fmt), spark=spark, tuning=tuning)
                    secs = time.monotonic() - t0
                    assert {t.status for t in s.tables} == {"applied"}, s.warnings[:3]
                    best[(fmt, n)] = min(best.get((fmt, n), secs), secs)
                    grouped[(fmt, n)] = s.tables_grouped
                    shutil.rmtree(target)
    ref = f"{k} tables alone" if k else "one table"
    print(
        f"{args.changes} changes over {k or args.tables} of {args.tables} tables of {args.rows} rows, against "
        f"the same changes in {ref}; local[2], best of {max(1, args.repeat)}, grouped apply "
        f"{'off' if args.no_together else 'on'}"
    )
    for fmt in fmts:
        many, one = best[(fmt, sides[0])], best[(fmt, sides[1])]
        print(
            f"{fmt}: {args.tables} tables {many:.2f} s ({grouped[(fmt, sides[0])]} grouped), {ref} {one:.2f} s, "
            f"ratio {many / one:.2f}"
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the driver's Python process: {rss:.0f} MB")
    spark.stop()


if __name__ == "__main__":
    main()
