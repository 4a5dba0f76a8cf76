#!/usr/bin/env python3
"""Streaming throughput: `pgrecv start` (pgoutput -> typed JSONL file, durable) against
`pg_recvlogical` (pgoutput, raw to a file) on the same slot backlog, in the same run.

Both read a backlog of ROWS rows in TXNS transactions from their own slot, created before the
workload, up to the same end position. Prints both wall times and the ratio (target <= 1.2).

    python bench/stream.py [--rows 1000000] [--txns 10] [--version 15] [--repeat 1]
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

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pgrecv.server import TempServer, find_installation, find_installations  # noqa: E402

TABLE = """CREATE TABLE bench (
    id bigint PRIMARY KEY, account int NOT NULL, amount numeric(12,2), note text,
    created timestamptz NOT NULL DEFAULT now(), flag boolean)"""


def run(cmd: list[str], **kw: object) -> float:
    """Wall time of the command; its CPU time goes to CPU[-1]."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall


CPU: list[float] = []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--txns", type=int, default=10)
    ap.add_argument("--version", type=int, default=15, help="PostgreSQL major version to run")
    ap.add_argument("--repeat", type=int, default=1, help="measure each side this many times, keep the best")
    ap.add_argument("--streaming", default="off", help="pgrecv --streaming (off: like pg_recvlogical here)")
    args = ap.parse_args()
    install = find_installation(args.version) or max(find_installations(), key=lambda i: i.version)
    with TempServer(install, settings={"max_wal_size": "4GB"}) as server, tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute("CREATE PUBLICATION pub FOR TABLE bench")
            for r in range(args.repeat):
                for name in (f"ref{r}", f"pgrecv{r}"):
                    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
            per = args.rows // args.txns
            print(
                f"PostgreSQL {install.version}: writing {args.rows:,} rows in {args.txns} transactions ...", flush=True
            )
            for t in range(args.txns):
                conn.execute(
                    "INSERT INTO bench (id, account, amount, note, flag) "
                    "SELECT g, g %% 1000, (g %% 100000) / 100.0, 'note ' || g, g %% 2 = 0 "
                    "FROM generate_series(%s::bigint, %s::bigint) g",
                    (t * per + 1, (t + 1) * per),
                )
            endpos = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]  # type: ignore[index]
        ref_times, our_times = [], []
        for r in range(args.repeat):
            raw = Path(tmp) / f"ref{r}.raw"
            ref_times.append(
                run([
                    str(install.bin_dir / "pg_recvlogical"), "-d", dsn, "--slot", f"ref{r}", "--start",
                    "-E", endpos, "-f", str(raw), "--no-loop",
                    "-o", "proto_version=1", "-o", "publication_names=pub",
                ])
            )  # fmt: skip
            out = Path(tmp) / f"pgrecv{r}.jsonl"
            our_times.append(
                run([
                    sys.executable, "-m", "pgrecv", "start", "-d", dsn, "--slot", f"pgrecv{r}",
                    "-E", endpos, "-f", str(out), "--no-loop", "--streaming", args.streaming, "-q",
                ])
            )  # fmt: skip
            lines = sum(1 for _ in out.open("rb"))
            print(
                f"run {r + 1}: pg_recvlogical {ref_times[-1]:.2f} s (CPU {CPU[-2]:.2f} s, "
                f"{raw.stat().st_size / 1e6:.0f} MB raw), pgrecv {our_times[-1]:.2f} s (CPU {CPU[-1]:.2f} s, "
                f"{out.stat().st_size / 1e6:.0f} MB, {lines:,} JSONL lines)"
            )
            os.unlink(raw)
            os.unlink(out)
        ref, ours = min(ref_times), min(our_times)
        print(
            f"pg_recvlogical: {ref:.2f} s  pgrecv: {ours:.2f} s  ratio: {ours / ref:.2f} "
            f"({args.rows / ours:,.0f} rows/s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
