"""pgrecv snapshot of one big table against `psql -c "COPY t TO STDOUT" > file`, in the same run.

Usage: python bench/snapshot.py [--rows 2000000] [--version 15]

Starts a throwaway server, fills table t (bigint key, text, numeric, timestamptz, boolean, int),
then times: psql's COPY to a file (the floor: no typing, no JSON), `pgrecv snapshot --jobs 1`, and
`pgrecv snapshot --jobs 2` with the table split in ctid ranges. Prints seconds and ratios.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from pgrecv.server import TempServer, find_installations


def _psql(bin_dir: Path) -> str:
    for candidate in (bin_dir / "psql", Path("/usr/bin/psql")):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("psql")
    if not found:
        sys.exit("psql not found")
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--version", type=int, default=15)
    args = ap.parse_args()
    install = next(i for i in find_installations() if i.version == args.version)
    with TempServer(install) as server, tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(
                "CREATE TABLE t (id bigint PRIMARY KEY, name text, amount numeric, at timestamptz, ok boolean, n int)"
            )
            c.execute(
                "INSERT INTO t SELECT g, 'name ' || g, g * 1.25, '2026-01-01'::timestamptz + g * interval '1 s', "
                "g %% 2 = 0, g %% 1000 FROM generate_series(1, %s) g",
                (args.rows,),
            )
            c.execute("VACUUM ANALYZE t")
            c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
            size = c.execute("SELECT pg_relation_size('t')").fetchone()[0]  # type: ignore[index]
        print(f"PostgreSQL {server.version}, {args.rows} rows, table {size / 1e6:.0f} MB")

        t0 = time.perf_counter()
        with open(Path(tmp) / "t.copy", "wb") as f:
            subprocess.run([_psql(server.bin_dir), dsn, "-c", "COPY t TO STDOUT"], stdout=f, check=True)
        copy_s = time.perf_counter() - t0
        print(f"psql COPY t TO STDOUT > file : {copy_s:6.2f} s")

        results = {}
        for jobs in (1, 2):
            out = Path(tmp) / f"snap{jobs}"
            range_size = str(max(size // 4, 1 << 20))
            cmd = [sys.executable, "-m", "pgrecv", "snapshot", "-q", "-d", dsn, "--slot", f"bench{jobs}"]
            cmd += ["--output-dir", str(out), "--jobs", str(jobs), "--range-size", range_size]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            results[jobs] = time.perf_counter() - t0
            files = sorted(out.glob("*.snapshot-*.jsonl"))
            mb = sum(p.stat().st_size for p in files) / 1e6
            print(
                f"pgrecv snapshot --jobs {jobs}      : {results[jobs]:6.2f} s  "
                f"ratio {results[jobs] / copy_s:4.2f}  ({len(files)} files, {mb:.0f} MB, "
                f"{args.rows / results[jobs]:,.0f} rows/s)"
            )
            shutil.rmtree(out)
        print(f"target: ratio <= 1.5 with one job; --jobs 2 speed-up {results[1] / results[2]:.2f}x")


if __name__ == "__main__":
    main()
