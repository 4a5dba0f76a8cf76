"""pgrecv snapshot of one big table against `psql -c "COPY t TO STDOUT" > file`, in the same run.

Usage: python bench/snapshot.py [--table plain|kinds] [--rows 2000000] [--version 15] [--repeat 3]

Starts a throwaway server, fills table t (plain: bigint key, text, numeric, timestamptz, boolean,
int; kinds: bigint key, float8, real, jsonb, int[], text[], bytea, text), then times: psql's COPY
to a file (the floor: no typing, no JSON), `pgrecv snapshot --jobs 1`, and `pgrecv snapshot
--jobs 2` with the table split in ctid ranges. Each is run --repeat times and the
best wall time counts (other load on the machine only ever adds); the CPU the client processes used
is printed too (per row: the part of the cost that is pgrecv's, whatever the load).
"""

from __future__ import annotations

import argparse
import math
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from pgrecv.pg.server import TempServer, find_installations

TABLES = {
    "plain": (
        "CREATE TABLE t (id bigint PRIMARY KEY, name text, amount numeric, at timestamptz, ok boolean, n int)",
        "INSERT INTO t SELECT g, 'name ' || g, g * 1.25, '2026-01-01'::timestamptz + g * interval '1 s', "
        "g %% 2 = 0, g %% 1000 FROM generate_series(1, %s) g",
    ),
    "kinds": (
        "CREATE TABLE t (id bigint PRIMARY KEY, score float8, ratio real, doc jsonb, ids int[], tags text[], "
        "blob bytea, name text)",
        "INSERT INTO t SELECT g, g / 7.0, g / 3.0, "
        "jsonb_build_object('id', g, 'tags', jsonb_build_array('a', g %% 7)), "
        "ARRAY[g, g %% 100, -g], ARRAY['t' || g %% 10, 'x y'], decode(md5(g::text), 'hex'), 'name ' || g "
        "FROM generate_series(1, %s) g",
    ),
}


def _psql(bin_dir: Path) -> str:
    for candidate in (bin_dir / "psql", Path("/usr/bin/psql")):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("psql")
    if not found:
        sys.exit("psql not found")
    return found


def make_table(dsn: str, table: str, rows: int) -> int:
    """Table t of TABLES[table] with ``rows`` rows, analysed, in a publication; its size in bytes."""
    with psycopg.connect(dsn, autocommit=True) as c:
        create, fill = TABLES[table]
        c.execute(create)
        c.execute(fill, (rows,))
        c.execute("VACUUM ANALYZE t")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        return int(c.execute("SELECT pg_relation_size('t')").fetchone()[0])  # type: ignore[index]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", choices=sorted(TABLES), default="plain")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--version", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    install = next(i for i in find_installations() if i.version == args.version)
    with TempServer(install) as server, tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        size = make_table(dsn, args.table, args.rows)
        print(f"PostgreSQL {server.version}, table {args.table}: {args.rows} rows, {size / 1e6:.0f} MB")

        copy_s = math.inf
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            with open(Path(tmp) / "t.copy", "wb") as f:
                subprocess.run([_psql(server.bin_dir), dsn, "-c", "COPY t TO STDOUT"], stdout=f, check=True)
            copy_s = min(copy_s, time.perf_counter() - t0)
        print(f"psql COPY t TO STDOUT > file : {copy_s:6.2f} s")

        results = {}
        for jobs in (1, 2):
            best, cpu, files, mb = math.inf, math.inf, 0, 0.0
            for i in range(args.repeat):
                out = Path(tmp) / f"snap{jobs}"
                range_size = str(max(size // 4, 1 << 20))
                cmd = [sys.executable, "-m", "pgrecv", "snapshot", "-q", "-d", dsn, "--slot", f"bench{jobs}_{i}"]
                cmd += ["--output-dir", str(out), "--jobs", str(jobs), "--range-size", range_size]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True)
                wall = time.perf_counter() - t0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if wall < best:
                    best = wall
                    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                found = sorted(out.glob("*.snapshot-*.jsonl"))
                files, mb = len(found), sum(p.stat().st_size for p in found) / 1e6
                shutil.rmtree(out)
                subprocess.run([sys.executable, "-m", "pgrecv", "drop", "-q", "-d", dsn, "--slot", f"bench{jobs}_{i}"])
            results[jobs] = best
            print(
                f"pgrecv snapshot --jobs {jobs}      : {best:6.2f} s  ratio {best / copy_s:4.2f}  ({files} files, "
                f"{mb:.0f} MB, {args.rows / best:,.0f} rows/s; client CPU {cpu:.2f} s = "
                f"{cpu / args.rows * 1e6:.2f} us/row)"
            )
        target = 1.3 if args.table == "kinds" else 1.5
        print(f"target: ratio <= {target} with one job; --jobs 2 speed-up {results[1] / results[2]:.2f}x")


if __name__ == "__main__":
    main()
