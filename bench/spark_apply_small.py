#!/usr/bin/env python3
"""spark-apply of small staged batches (the generated 6-table stream), this checkout against another.

The shape: the test suite's generated stream (tests/spark/changegen.py: six small tables, two-phase
and streamed transactions, unchanged TOAST values, key changes, TRUNCATEs), cut in two files; a
first run applies the first, a second both. Such runs are a cron job's over a quiet database, and
most of their time is the driver's work per Spark action, not data (bench/NOTES.md).

Each checkout runs in a process of its own (its own session, warmed by one run), and prints the
CPU seconds of that process and its JVM over ``--pairs`` pairs of runs, and their wall time. CPU
is the figure: on a busy machine the wall time moves with the neighbours, the CPU much less. The
ratio is this checkout's CPU over the other's (the reference), measured alternately
``--repeat`` times in one invocation.

Usage: bench/spark_apply_small.py --against /path/to/other/checkout [--format parquet] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SEEDS = (5, 22, 9, 15, 3, 1)


def one_checkout(root: str, fmt: str, pairs: int) -> None:
    """In the child: the runs, with ``root``'s pgrecv; prints a JSON line."""
    sys.path.insert(0, root)
    import pgrecv

    assert pgrecv.__file__.startswith(root), pgrecv.__file__
    from pgrecv.spark.apply import run_apply
    from pgrecv.spark.model import ApplyConfig
    from pgrecv.spark.sparkops import start_session
    from tests.spark.changegen import Gen
    from tests.spark.test_differential import _files

    spark = start_session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"})
    jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[attr-defined]

    def cpu() -> float:
        fields = Path(f"/proc/{jvm}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(os.times()[:2])

    where = Path(tempfile.mkdtemp(prefix="pgrecv-bench-"))
    warm = _files(Gen(7).run(50), where, 7)
    run_apply(ApplyConfig(tuple(map(str, warm)), where / "warm", fmt=fmt, engine="delta-rs"), spark=spark)
    c0, t0 = cpu(), time.monotonic()
    for i in range(pairs):
        seed = SEEDS[i % len(SEEDS)]
        files = _files(Gen(seed).run(50), where, seed)
        target = where / f"lake{i}"
        run_apply(ApplyConfig((str(files[0]),), target, fmt=fmt, engine="delta-rs"), spark=spark)
        summary = run_apply(ApplyConfig(tuple(map(str, files)), target, fmt=fmt, engine="delta-rs"), spark=spark)
        assert summary.input_read == "staged", summary.input_read
    print(json.dumps({"cpu": cpu() - c0, "wall": time.monotonic() - t0}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", help="another checkout of pgrecv (the reference)")
    ap.add_argument("--format", default="parquet", choices=["parquet", "delta"])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        one_checkout(args.child, args.format, args.pairs)
        return
    if not args.against:
        ap.error("--against OTHER_CHECKOUT is required")
    got: dict[str, list[dict[str, float]]] = {"reference": [], "this": []}
    for _ in range(args.repeat):
        for name, root in (("reference", str(Path(args.against).resolve())), ("this", str(HERE))):
            cmd = [sys.executable, __file__, "--child", root, "--format", args.format, "--pairs", str(args.pairs)]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
            if done.returncode != 0:
                sys.exit(f"{name} ({root}) failed:\n{done.stderr[-3000:]}")
            out = done.stdout
            got[name].append(json.loads(out.strip().splitlines()[-1]))
            print(f"{name:9s} cpu {got[name][-1]['cpu']:6.1f} s  wall {got[name][-1]['wall']:6.1f} s", flush=True)
    mean = {k: sum(r["cpu"] for r in v) / len(v) for k, v in got.items()}
    print(f"{args.pairs} pairs of runs, {args.format}: CPU {mean['this']:.1f} s against {mean['reference']:.1f} s")
    print(f"ratio {mean['this'] / mean['reference']:.2f}")


if __name__ == "__main__":
    main()
