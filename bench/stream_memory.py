#!/usr/bin/env python3
"""Peak memory of `pgrecv start` on one huge transaction streamed with --streaming on.

One transaction of ROWS rows (default 5M) is written; `pgrecv start --streaming on` then reads it
from the slot to a JSONL file with a small logical_decoding_work_mem, so the server streams it in
chunks and pgrecv must buffer (and spill) it until the commit. Prints pgrecv's peak RSS (target
<= 150 MB) next to the same run's output size, so memory can be seen not to follow it.

    python bench/stream_memory.py [--rows 5000000] [--version 15]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pgrecv.pg.server import TempServer, find_installation, find_installations  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--version", type=int, default=15)
    args = ap.parse_args()
    install = find_installation(args.version) or max(find_installations(), key=lambda i: i.version)
    with TempServer(install, settings={"max_wal_size": "8GB"}) as server, tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, note text, amount numeric(12,2))")
            conn.execute("CREATE PUBLICATION pub FOR TABLE big")
            conn.execute("SELECT pg_create_logical_replication_slot('big', 'pgoutput')")
            print(f"PostgreSQL {install.version}: one transaction of {args.rows:,} rows ...", flush=True)
            conn.execute(
                "INSERT INTO big SELECT g, 'row ' || g, g / 100.0 FROM generate_series(1, %s::bigint) g", (args.rows,)
            )
        out = Path(tmp) / "big.jsonl"
        small = make_conninfo(dsn, options="-c logical_decoding_work_mem=64MB")
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pgrecv", "start", "-d", small, "--slot", "big", "-f", str(out),
             "--streaming", "on", "--until-caught-up", "-q"],
            check=True,
        )  # fmt: skip
        wall = time.perf_counter() - started
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        lines = sum(1 for _ in out.open("rb"))
        print(
            f"pgrecv: {wall:.1f} s, {lines:,} JSONL lines ({out.stat().st_size / 1e6:,.0f} MB), "
            f"peak RSS {peak_mb:.0f} MB (target <= 150 MB), exit {proc.returncode}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
