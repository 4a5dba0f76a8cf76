#!/usr/bin/env python3
"""spark-apply over a long history of files: one new file after H applied ones, against the new file alone.

A change directory of ``--files`` files of ``--events`` events each (named ``FIRST-LAST.jsonl``, as
``pgrecv start --output-dir`` names them) is applied once; then one more file of ``--events``
events arrives. Measured in one SparkSession, each on a fresh copy of the applied target:

* ``directory``: ``spark-apply DIR`` (what cron runs): the files applied before are skipped by
  their names (TARGET/_pgrecv/applied.json, pgrecv/spark/ledger.py);
* ``new file alone``: ``spark-apply DIR/NEW`` (the reference: only what is new);
* ``directory, no record``: ``spark-apply DIR`` with the record removed, which reads every file
  (what every run did before the record).

Prints each one's best of ``--repeat`` and its ratio to the new file alone (target, issue 56:
directory <= 1.3x).

Usage: bench/spark_apply_history.py [--files 60] [--events 20000] [--keys 20000] [--format ...]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.spark_apply import write_input
from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import STATE_DIR, ApplyConfig
from pgrecv.spark.sparkops import start_session


def _name(first: int, last: int) -> str:
    return f"{first:016X}-{last:016X}.jsonl"


def add_file(where: Path, events: int, keys: int, tables: int, start: int, seed_shift: int) -> tuple[Path, int]:
    """One change file of ``events`` events after position ``start``; (its path, the next start)."""
    tmp = where / f".tmp-{seed_shift}"
    nxt = write_input(tmp, events, keys, tables, first_lsn=start)
    # its first commit is start + 1000 and its last nxt - 1000 (write_input's spacing)
    path = where / _name(start + 1000, nxt - 1000)
    tmp.rename(path)
    return path, nxt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=60)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--tables", type=int, default=1)
    ap.add_argument("--format", dest="fmts", action="append", choices=["parquet", "delta"])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    spark = start_session("local[2]", {"spark.ui.enabled": "false"})
    root = Path(tempfile.mkdtemp(prefix="pgrecv-bench-history-"))
    try:
        src = root / "changes"
        src.mkdir()
        pos = 1 << 32
        for i in range(args.files):
            _, pos = add_file(src, args.events, args.keys, args.tables, pos, i)
        print(f"{args.files} files of {args.events} events ({args.keys} keys, {args.tables} tables), then one more")
        for fmt in args.fmts or ["parquet", "delta"]:
            base = root / f"base-{fmt}"
            started = time.perf_counter()
            s = run_apply(ApplyConfig((str(src),), base, fmt=fmt), spark=spark)
            print(f"{fmt}: the history applied once in {time.perf_counter() - started:.1f} s ({s.files} files)")
            new, _ = add_file(src, args.events, args.keys, args.tables, pos, args.files)
            cases = {
                "new file alone": (str(new),),
                "directory": (str(src),),
                "directory, no record": (str(src),),
            }
            best: dict[str, float] = {}
            for _ in range(args.repeat):
                for name, sources in cases.items():
                    target = root / f"t-{fmt}"
                    shutil.rmtree(target, ignore_errors=True)
                    shutil.copytree(base, target, symlinks=True)
                    if name == "directory, no record":
                        (target / STATE_DIR / "applied.json").unlink()
                    started = time.perf_counter()
                    s = run_apply(ApplyConfig(sources, target, fmt=fmt), spark=spark)
                    took = time.perf_counter() - started
                    assert [t.status for t in s.tables] == ["applied"] * args.tables, s.tables
                    best[name] = min(best.get(name, took), took)
                    print(f"  {name:24} {took:6.2f} s  (files read {s.files}, skipped {s.files_skipped})")
            ref = best["new file alone"]
            for name, took in best.items():
                print(f"{fmt}: {name:24} best {took:6.2f} s  {took / ref:5.2f}x the new file alone")
            new.unlink()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
