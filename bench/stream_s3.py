#!/usr/bin/env python3
"""`pgrecv start --output-dir s3://…` against the same run into a local `--output-dir`, on the same
slot backlog, in the same run: what uploading each file once final costs.

The S3 endpoint is moto's standalone server on 127.0.0.1 (the tests' server; pip install
'moto[server]'), so the ratio shows pgrecv's own cost of the upload path (staging, the
conditional PUT, the state object), not a network's. Each side reads the backlog from its own
slot, created before the workload, up to the same end position; ``--rotate-size`` sets how many
files (and so PUTs) the backlog makes. With ``--repeat N`` each side runs N times, interleaved,
and the best is kept.

    python bench/stream_s3.py [--rows 1000000] [--txns 10] [--rotate-size 64MB] [--repeat 3] [--version 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.stream import INSERTS, TABLE  # noqa: E402  (the same workload as bench/stream.py's inserts)
from pgrecv.pg.server import TempServer, find_installation, find_installations  # noqa: E402
from tests.conftest import _stop_group, start_s3_server  # noqa: E402


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.decode()}")
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--txns", type=int, default=10)
    ap.add_argument("--rotate-size", default="64MB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--version", type=int, default=15)
    args = ap.parse_args()
    install = find_installation(args.version) or max(find_installations(), key=lambda i: i.version)
    s3 = start_s3_server()
    server = TempServer(install, settings={"max_wal_size": "4GB"}, tcp=True)
    try:
        with server, tempfile.TemporaryDirectory() as tmp:
            dsn = server.dsn()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(TABLE)
                conn.execute("CREATE PUBLICATION pub FOR TABLE bench")
                for r in range(args.repeat):
                    for side in ("local", "s3"):
                        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"{side}{r}",))
                per = args.rows // args.txns
                print(f"PostgreSQL {install.version}: {per * args.txns:,} rows in {args.txns} transactions ...")
                for t in range(args.txns):
                    conn.execute(INSERTS, (t * per + 1, (t + 1) * per))
                endpos = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]  # type: ignore[index]
            env = {**os.environ, **s3.env}
            times: dict[str, list[float]] = {"local": [], "s3": []}
            for r in range(args.repeat):
                for side in ("local", "s3"):
                    out = str(Path(tmp) / f"local{r}") if side == "local" else f"s3://{s3.bucket()}/cdc"
                    cmd = [sys.executable, "-m", "pgrecv", "start", "-d", dsn, "--slot", f"{side}{r}", "-E", endpos]
                    cmd += ["--output-dir", out, "--rotate-size", args.rotate_size, "--no-loop", "-q"]
                    times[side].append(timed(cmd, env))
                    if side == "local":
                        files = sorted(Path(out).glob("*.jsonl"))
                        size = sum(f.stat().st_size for f in files)
                        shutil.rmtree(out)
                print(
                    f"run {r + 1}: local {times['local'][-1]:.2f} s ({len(files)} files, {size / 1e6:.0f} MB), "
                    f"s3 {times['s3'][-1]:.2f} s",
                    flush=True,
                )
            local, remote = min(times["local"]), min(times["s3"])
            print(
                f"best of {args.repeat}: local --output-dir {local:.2f} s, s3:// {remote:.2f} s, "
                f"ratio {remote / local:.2f} (rotate size {args.rotate_size})"
            )
    finally:
        _stop_group(s3.proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
