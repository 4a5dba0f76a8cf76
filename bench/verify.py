"""``pgrecv verify`` of one equal table against ``pgrecv snapshot`` of the same table, in the same run.

Usage: python bench/verify.py [--rows 1000000] [--format delta|parquet] [--version 15] [--table plain|kinds]

Starts a throwaway server, fills table t (bench/snapshot.py's tables), then: ``pgrecv snapshot``
into a change directory (timed: the reference), ``pgrecv spark-apply`` of it (not timed), and
``pgrecv verify --source DIR`` (timed: a temporary slot's snapshot, the catch-up that finds
nothing new, one scan of each side). Verify runs in this process, as the CLI (its Spark's JVM
is a child), so the peak RSS printed is the driver's Python process. Target: verify <= 3x the
snapshot, driver RSS <= 300 MB.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pgrecv.pg.server import TempServer, find_installations

sys.path.insert(0, str(Path(__file__).parent))
from snapshot import TABLES, make_table


def _pgrecv(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pgrecv", *args], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--format", choices=["delta", "parquet"], default="delta")
    ap.add_argument("--table", choices=sorted(TABLES), default="plain")
    ap.add_argument("--version", type=int, default=15)
    args = ap.parse_args()
    install = next(i for i in find_installations() if i.version == args.version)
    with TempServer(install) as server, tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        make_table(dsn, args.table, args.rows)
        src, lake = Path(tmp) / "cdc", Path(tmp) / "lake"
        snap_s = _pgrecv("snapshot", "-d", dsn, "--slot", "s", "--output-dir", str(src), "-q")
        apply_s = _pgrecv("spark-apply", str(src), "--target", str(lake), "--format", args.format, "-q")
        from pgrecv.cli.main import cli

        t0 = time.perf_counter()
        code = 0
        try:
            where = ["--source", str(src), "--target", str(lake), "--format", args.format]
            cli.main(["verify", "-v", "-d", dsn, "--slot", "s", *where], standalone_mode=False)
        except SystemExit as exc:
            code = int(exc.code or 0)
        verify_s = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"PostgreSQL {args.version}, table {args.table}, {args.rows} rows, {args.format}, {os.cpu_count()} cores\n"
        f"snapshot {snap_s:.2f} s (reference), spark-apply {apply_s:.2f} s, verify {verify_s:.2f} s "
        f"(exit {code}): verify / snapshot = {verify_s / snap_s:.2f}x (target <= 3x)\n"
        f"peak RSS of verify's driver (this Python process): {rss:.0f} MB (target <= 300 MB)"
    )


if __name__ == "__main__":
    main()
